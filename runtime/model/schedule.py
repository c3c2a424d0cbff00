"""Noise schedule and samplers (spec: "Schedule and samplers"). Coefficients in float64.

Every sampler is written as the spec's equations and then reduced to ONE affine step

    x_next = c_x * x_t + c_eps * eps + c_h * h + sigma * z               (S)
    h_next = d_x * x_t + d_eps * eps                                     (H)

where h is what the previous step left (DPM-Solver++(2M)'s previous data prediction; 0 before the
first step, and c_h = d_x = d_eps = 0 for DDPM and DDIM). So every backend (NumPy, the CPU p_sample
of the GPU pipeline, the GPU p_sample kernel) runs the same six numbers per step, and each image
draws its z from its own generator in the same order (NoiseStream).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from jetson_unet.model.config import Schedule
from jetson_unet.errors import UsageError

SAMPLERS = ("ddpm", "ddim", "dpmpp-2m")
SEED_LIMIT = 2 ** 63   # seeds are integers 0 <= s < 2**63 (the spec)
# What jetson-sample and Pipeline.sample run unless told otherwise (docs/samplers.md: the measured
# distance to the converged solution and the time per image that chose them)
DEFAULT_SAMPLER = "dpmpp-2m"
DPMPP_STEPS = 25   # dpmpp-2m's steps when none are asked for


@dataclass(frozen=True)
class Coefficients:
    betas: np.ndarray       # (T,) float64
    alphas: np.ndarray      # 1 - beta
    abar: np.ndarray        # cumprod(alpha)
    abar_prev: np.ndarray   # [1, abar[:-1]]


def coefficients(schedule: Schedule) -> Coefficients:
    T = schedule.timesteps
    # (1) linear betas scaled to T: for T = 100 this is 0.001 .. 0.2
    betas = np.linspace(schedule.beta_start * 1000.0 / T, schedule.beta_end * 1000.0 / T, T, dtype=np.float64)
    alphas = 1.0 - betas
    abar = np.cumprod(alphas)
    abar_prev = np.concatenate([[1.0], abar[:-1]])
    return Coefficients(betas, alphas, abar, abar_prev)


@dataclass(frozen=True)
class Step:
    t: int          # timestep passed to the model
    c_x: float      # (S)
    c_eps: float
    sigma: float    # > 0: a fresh z is drawn for this step
    c_h: float = 0.0     # (S): the weight of h, what the previous step saved
    d_x: float = 0.0     # (H): what this step saves for the next one
    d_eps: float = 0.0


def ddpm_steps(schedule: Schedule) -> List[Step]:
    """p_sample for t = T-1 .. 0:
    (2) x_{t-1} = (x_t - beta_t / sqrt(1 - abar_t) * eps) / sqrt(alpha_t) + sigma_t z
    (3) sigma_t = sqrt(beta_t (1 - abar_prev_t) / (1 - abar_t)), z_0 = 0 (no clipping)
    so c_x = 1/sqrt(alpha_t), c_eps = -beta_t / (sqrt(1 - abar_t) sqrt(alpha_t))."""
    c = coefficients(schedule)
    steps = []
    for t in range(schedule.timesteps - 1, -1, -1):
        sigma = np.sqrt(c.betas[t] * (1.0 - c.abar_prev[t]) / (1.0 - c.abar[t])) if t > 0 else 0.0
        steps.append(Step(t, float(1.0 / np.sqrt(c.alphas[t])),
                          float(-c.betas[t] / (np.sqrt(1.0 - c.abar[t]) * np.sqrt(c.alphas[t]))),
                          float(sigma)))
    return steps


def ddim_steps(schedule: Schedule, n_steps: int, eta: float = 0.0) -> List[Step]:
    """DDIM over tau = linspace(T-1, 0, S).round() (descending):
    (4) x0 = (x_t - sqrt(1 - abar_t) eps) / sqrt(abar_t)
    (5) s  = eta sqrt((1 - abar_prev)/(1 - abar_t) (1 - abar_t/abar_prev)), abar_prev of the next tau (1 after the last)
    (6) x' = sqrt(abar_prev) x0 + sqrt(1 - abar_prev - s^2) eps + s z
    Substituting (4) in (6): c_x = sqrt(abar_prev/abar_t),
    c_eps = sqrt(1 - abar_prev - s^2) - sqrt(abar_prev) sqrt(1 - abar_t) / sqrt(abar_t)."""
    T = schedule.timesteps
    if not 1 <= n_steps <= T:
        raise UsageError(f"DDIM steps must be in 1..{T}, got {n_steps}")
    if eta < 0:
        raise UsageError(f"eta must be >= 0, got {eta}")
    c = coefficients(schedule)
    ts = tau(T, n_steps)
    steps = []
    for k, t in enumerate(ts):
        a_t = c.abar[t]
        a_prev = c.abar[ts[k + 1]] if k + 1 < len(ts) else 1.0
        s = eta * np.sqrt((1.0 - a_prev) / (1.0 - a_t) * (1.0 - a_t / a_prev))
        c_eps = np.sqrt(max(1.0 - a_prev - s * s, 0.0)) - np.sqrt(a_prev) * np.sqrt(1.0 - a_t) / np.sqrt(a_t)
        steps.append(Step(int(t), float(np.sqrt(a_prev / a_t)), float(c_eps), float(s)))
    return steps


def tau(T: int, n_steps: int) -> np.ndarray:
    """The S timesteps of DDIM and DPM-Solver++: linspace(T-1, 0, S).round(), descending."""
    return np.linspace(T - 1, 0, n_steps).round().astype(int) if n_steps > 1 else np.array([T - 1])


def dpmpp_2m_steps(schedule: Schedule, n_steps: int) -> List[Step]:
    """DPM-Solver++(2M) over tau (the spec). a_t = sqrt(abar_t), s_t = sqrt(1 - abar_t),
    lam_t = ln(a_t / s_t), and the data prediction of step k, D_k = (x - s_u eps) / a_u at u = tau[k].
    Step k goes from u = tau[k] to v = tau[k+1], with h_k = lam_v - lam_u:
    (7)  k = 0:         x' = (s_v / s_u) x - a_v (exp(-h_k) - 1) D_0
    (8)  0 < k < S-1:   r = h_{k-1} / h_k,
                        x' = (s_v / s_u) x - a_v (exp(-h_k) - 1) (D_k + (D_k - D_{k-1}) / (2 r))
    (9)  k = S-1:       x' = D_{S-1}
    Each step saves D_k as h (d_x = 1 / a_u, d_eps = -s_u / a_u) and (8) weighs it by c_h; with
    A = -a_v (exp(-h_k) - 1) and w = 1 + 1 / (2r) (w = 1 at k = 0): c_x = s_v / s_u + A w / a_u,
    c_eps = -A w s_u / a_u, c_h = -A / (2r). No noise is drawn."""
    T = schedule.timesteps
    if not 2 <= n_steps <= T:
        raise UsageError(f"dpmpp-2m steps must be in 2..{T} (a multistep solver), got {n_steps}")
    c = coefficients(schedule)
    ts = tau(T, n_steps)
    a = np.sqrt(c.abar[ts])
    s = np.sqrt(1.0 - c.abar[ts])
    lam = np.log(a / s)
    steps, h_prev = [], None
    for k, t in enumerate(ts):
        d_x, d_eps = 1.0 / a[k], -s[k] / a[k]
        if k == n_steps - 1:   # (9) to abar = 1: the data prediction itself
            steps.append(Step(int(t), float(d_x), float(d_eps), 0.0, 0.0, float(d_x), float(d_eps)))
            break
        h = lam[k + 1] - lam[k]
        A = -a[k + 1] * np.expm1(-h)
        half_inv_r = 0.0 if h_prev is None else h / (2.0 * h_prev)   # 1 / (2 r), r = h_{k-1} / h_k
        w = 1.0 + half_inv_r
        steps.append(Step(int(t), float(s[k + 1] / s[k] + A * w / a[k]), float(-A * w * s[k] / a[k]), 0.0,
                          float(-A * half_inv_r), float(d_x), float(d_eps)))
        h_prev = h
    return steps


def make_steps(schedule: Schedule, sampler: str = "ddpm", n_steps: Optional[int] = None,
               eta: float = 0.0) -> List[Step]:
    """The steps of `sampler`. n_steps None: DDPM and DDIM all T, dpmpp-2m DPMPP_STEPS (DDPM always
    runs all T)."""
    if not np.isfinite(eta) or eta < 0:
        raise UsageError(f"eta must be a finite number >= 0, got {eta}")
    if eta and sampler != "ddim":
        raise UsageError(f"eta goes with --sampler ddim ({sampler} has none)")
    if sampler == "ddpm":
        if n_steps not in (None, schedule.timesteps):
            raise UsageError(f"DDPM runs all {schedule.timesteps} steps (got --steps {n_steps}); "
                             "use --sampler ddim for fewer steps")
        return ddpm_steps(schedule)
    if sampler == "ddim":
        return ddim_steps(schedule, schedule.timesteps if n_steps is None else n_steps, eta)
    if sampler == "dpmpp-2m":
        return dpmpp_2m_steps(schedule, min(DPMPP_STEPS, schedule.timesteps) if n_steps is None else n_steps)
    raise UsageError(f"unknown sampler {sampler!r} (choose from {', '.join(SAMPLERS)})")


def p_sample(x: np.ndarray, eps: np.ndarray, step: Step, z: Optional[np.ndarray],
             h: Optional[np.ndarray] = None) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """(S) and (H) in float64, stored back as float32: the host side of every backend. Returns
    (x_next, h_next); h is what the previous step returned (None before the first step: 0)."""
    x64, e64 = x.astype(np.float64), eps.astype(np.float64)
    out = step.c_x * x64 + step.c_eps * e64
    if step.c_h and h is not None:
        out += step.c_h * h.astype(np.float64)
    if step.sigma > 0:
        if z is None:
            raise ValueError(f"step t={step.t} has sigma > 0 and needs noise z")
        out += step.sigma * z.astype(np.float64)
    h_next = (step.d_x * x64 + step.d_eps * e64).astype(np.float32) if (step.d_x or step.d_eps) else None
    return out.astype(np.float32), h_next


def check_seeds(seeds: Sequence[int], batch: int) -> List[int]:
    """One seed per image (UsageError otherwise): integers 0 <= s < 2**63."""
    seeds = list(seeds)
    if len(seeds) != batch:
        raise UsageError(f"{len(seeds)} seeds for a batch of {batch}: give one per image")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or not 0 <= int(s) < SEED_LIMIT:
            raise UsageError(f"seeds are integers 0 <= s < 2**63, got {s!r}")
    return [int(s) for s in seeds]


def image_seeds(seed: int, batch: int) -> List[int]:
    """The seeds of a call with one seed s: image i draws from PCG64(s + i) (the spec)."""
    check_seeds([seed], 1)
    return check_seeds([int(seed) + i for i in range(batch)], batch)


Seeds = Union[int, Sequence[int]]


def as_seeds(seeds: Seeds, batch: int) -> List[int]:
    """One seed per image: a sequence of them, or one seed s for images s, s + 1, ..."""
    return image_seeds(seeds, batch) if isinstance(seeds, (int, np.integer)) else check_seeds(seeds, batch)


class NoiseStream:
    """The spec's noise order, one stream per image: image i draws from PCG64(seeds[i]) x_T first,
    then one array per step with sigma > 0, in step order. `draw` returns the whole batch's array
    (B, C, H, W), image i's part from image i's generator."""

    def __init__(self, seeds: Seeds, shape: Tuple[int, ...]) -> None:
        self.shape = tuple(shape)
        self.seeds = as_seeds(seeds, self.shape[0])
        self.rngs = [np.random.Generator(np.random.PCG64(s)) for s in self.seeds]

    def draw(self, out: Optional[np.ndarray] = None) -> np.ndarray:
        """The next array of every image's stream; `out` (float32, C-contiguous, this shape) is filled
        in place."""
        if out is None:
            out = np.empty(self.shape, dtype=np.float32)
        for rng, part in zip(self.rngs, out):
            rng.standard_normal(part.shape, dtype=np.float32, out=part)
        return out

    def for_steps(self, steps: List[Step]) -> Iterator[Optional[np.ndarray]]:
        for st in steps:
            yield self.draw() if st.sigma > 0 else None


EpsFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


def sample_loop(eps_fn: EpsFn, shape: Tuple[int, ...], steps: List[Step], seeds: Seeds,
                callback: Optional[Callable[[int, int], None]] = None) -> np.ndarray:
    """The plain loop (reference backend), one seed per image: returns x_0 as float32 (B, C, H, W)."""
    noise = NoiseStream(seeds, shape)
    x, h = noise.draw(), None
    for i, (st, z) in enumerate(zip(steps, noise.for_steps(steps))):
        eps = eps_fn(x, np.full((shape[0],), st.t, dtype=np.int64))
        x, h = p_sample(x, eps, st, z, h)
        if callback is not None:
            callback(i, len(steps))
    return x


def to_uint8(x0: np.ndarray) -> np.ndarray:
    """Image out: clip((x0 + 1) / 2, 0, 1), round(255 v) -> uint8, (B, H, W, C). In float64, in place
    on one copy (the same operations bit for bit: * 0.5 is / 2, rint is round's half to even); at batch
    64 this took 6.5 ms with a temporary per operation, 2.5 ms now."""
    v = x0.astype(np.float64)
    v += 1.0
    v *= 0.5
    np.clip(v, 0.0, 1.0, out=v)
    v *= 255.0
    np.rint(v, out=v)
    return v.astype(np.uint8).transpose(0, 2, 3, 1)

"""Noise schedule and samplers (spec: "Schedule and samplers"). Coefficients in float64.

Both samplers are written as the spec's equations and then reduced to ONE affine step

    x_next = c_x * x_t + c_eps * eps + sigma * z                         (S)

so every backend (NumPy, the CPU p_sample of the GPU pipeline, the GPU p_sample kernel) runs the
same three numbers per step and draws z from the same generator in the same order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Tuple

import numpy as np

from jetson_unet.model.config import Schedule
from jetson_unet.errors import UsageError

SAMPLERS = ("ddpm", "ddim")


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
    tau = np.linspace(T - 1, 0, n_steps).round().astype(int) if n_steps > 1 else np.array([T - 1])
    steps = []
    for k, t in enumerate(tau):
        a_t = c.abar[t]
        a_prev = c.abar[tau[k + 1]] if k + 1 < len(tau) else 1.0
        s = eta * np.sqrt((1.0 - a_prev) / (1.0 - a_t) * (1.0 - a_t / a_prev))
        c_eps = np.sqrt(max(1.0 - a_prev - s * s, 0.0)) - np.sqrt(a_prev) * np.sqrt(1.0 - a_t) / np.sqrt(a_t)
        steps.append(Step(int(t), float(np.sqrt(a_prev / a_t)), float(c_eps), float(s)))
    return steps


def make_steps(schedule: Schedule, sampler: str = "ddpm", n_steps: Optional[int] = None,
               eta: float = 0.0) -> List[Step]:
    if sampler == "ddpm":
        if n_steps not in (None, schedule.timesteps):
            raise UsageError(f"DDPM runs all {schedule.timesteps} steps (got --steps {n_steps}); "
                             "use --sampler ddim for fewer steps")
        return ddpm_steps(schedule)
    if sampler == "ddim":
        return ddim_steps(schedule, schedule.timesteps if n_steps is None else n_steps, eta)
    raise UsageError(f"unknown sampler {sampler!r} (choose from {', '.join(SAMPLERS)})")


def p_sample(x: np.ndarray, eps: np.ndarray, step: Step, z: Optional[np.ndarray]) -> np.ndarray:
    """(S) in float64, stored back as float32: the host side of every backend."""
    out = step.c_x * x.astype(np.float64) + step.c_eps * eps.astype(np.float64)
    if step.sigma > 0:
        if z is None:
            raise ValueError(f"step t={step.t} has sigma > 0 and needs noise z")
        out += step.sigma * z.astype(np.float64)
    return out.astype(np.float32)


class NoiseStream:
    """The spec's noise order: x_T first, then one array per step with sigma > 0, in step order."""

    def __init__(self, seed: int, shape: Tuple[int, ...]) -> None:
        self.shape = tuple(shape)
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def draw(self, out: Optional[np.ndarray] = None) -> np.ndarray:
        """The next array of the stream; `out` (float32, C-contiguous, this shape) is filled in place."""
        return self.rng.standard_normal(self.shape, dtype=np.float32, out=out)

    def for_steps(self, steps: List[Step]) -> Iterator[Optional[np.ndarray]]:
        for st in steps:
            yield self.draw() if st.sigma > 0 else None


EpsFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


def sample_loop(eps_fn: EpsFn, shape: Tuple[int, ...], steps: List[Step], seed: int,
                callback: Optional[Callable[[int, int], None]] = None) -> np.ndarray:
    """The plain loop (reference backend): returns x_0 as float32 (B, C, H, W)."""
    noise = NoiseStream(seed, shape)
    x = noise.draw()
    for i, (st, z) in enumerate(zip(steps, noise.for_steps(steps))):
        eps = eps_fn(x, np.full((shape[0],), st.t, dtype=np.int64))
        x = p_sample(x, eps, st, z)
        if callback is not None:
            callback(i, len(steps))
    return x


def to_uint8(x0: np.ndarray) -> np.ndarray:
    """Image out: clip((x0 + 1) / 2, 0, 1), round(255 v) -> uint8, (B, H, W, C)."""
    v = np.clip((x0.astype(np.float64) + 1.0) / 2.0, 0.0, 1.0)
    return np.round(255.0 * v).astype(np.uint8).transpose(0, 2, 3, 1)

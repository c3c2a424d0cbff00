"""Schedule and samplers against the spec's equations, recomputed here in plain float64 math.

The runtime reduces every sampler step to x' = c_x x + c_eps eps + sigma z; these tests go back
to the spec's un-reduced forms (DDPM's p_sample, DDIM's x0 and x') and check the reduction.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from jetson_unet.model.config import Schedule
from jetson_unet.errors import UsageError
from jetson_unet.model.schedule import (NoiseStream, coefficients, ddim_steps, ddpm_steps, make_steps,
                                        p_sample, sample_loop, to_uint8)

SCHED = Schedule()       # T = 100, the spec's default
T = SCHED.timesteps
# Coefficients are float64 on both sides, from the same betas: only the order of a few float64
# operations differs (a few ulp, amplified at most ~1/sqrt(1 - abar_t) ~ 30 at t = 0).
TOL_COEF = dict(rtol=1e-12, atol=1e-13)
APPROX_COEF = dict(rel=TOL_COEF["rtol"], abs=TOL_COEF["atol"])   # the same bound, for pytest.approx
# One step stored as float32: one float32 rounding of an O(1..10) value (~6e-8 relative).
TOL_STEP_F32 = dict(rtol=2e-7, atol=2e-7)
# A whole loop stored as float32 after every step: the same float64 math, so bit-identical on x86
# today (measured 0); the bound allows a 1-ulp difference per step (another libm, FMA contraction)
# to propagate through 100 steps whose gains are ~1.1 each.
TOL_LOOP_F32 = dict(rtol=1e-5, atol=1e-5)


def spec_betas(T: int) -> list:
    lo, hi = 1e-4 * 1000.0 / T, 0.02 * 1000.0 / T
    return [lo + (hi - lo) * k / (T - 1) for k in range(T)]


def spec_tables(T: int = T):
    betas = spec_betas(T)
    alphas = [1.0 - b for b in betas]
    abar, acc = [], 1.0
    for a in alphas:
        acc *= a
        abar.append(acc)
    return betas, alphas, abar, [1.0] + abar[:-1]


def test_betas_t100(assert_close):
    c = coefficients(SCHED)
    assert_close("betas", c.betas, np.linspace(0.001, 0.2, 100), np.float64, atol=1e-15, rtol=1e-14)
    assert (c.betas[0], c.betas[-1]) == pytest.approx((0.001, 0.2), abs=1e-15)
    betas, alphas, abar, abar_prev = spec_tables()
    assert_close("abar", c.abar, np.array(abar), np.float64, **TOL_COEF)
    assert_close("abar_prev", c.abar_prev, np.array(abar_prev), np.float64, **TOL_COEF)


def test_ddpm_coefficients_closed_form():
    betas, alphas, abar, abar_prev = spec_tables()
    steps = ddpm_steps(SCHED)
    assert [s.t for s in steps] == list(range(T - 1, -1, -1))
    for s in steps:
        t = s.t
        want_sigma = 0.0 if t == 0 else math.sqrt(betas[t] * (1 - abar_prev[t]) / (1 - abar[t]))
        want = (1 / math.sqrt(alphas[t]), -betas[t] / (math.sqrt(1 - abar[t]) * math.sqrt(alphas[t])), want_sigma)
        assert (s.c_x, s.c_eps, s.sigma) == pytest.approx(want, **APPROX_COEF), f"t={t}"
        assert (s.sigma > 0) == (t > 0), f"t={t}: sigma {s.sigma}"
    assert steps[-1].sigma == 0.0


@pytest.mark.parametrize("t_index", [0, 1, 50, 99])
def test_p_sample_is_the_ddpm_formula(rng, assert_close, t_index):
    betas, alphas, abar, _ = spec_tables()
    step = ddpm_steps(SCHED)[T - 1 - t_index]
    assert step.t == t_index
    x, eps, z = (rng.standard_normal((2, 3, 5, 7)).astype(np.float32) for _ in range(3))
    x64, e64, z64 = (a.astype(np.float64) for a in (x, eps, z))
    t = t_index
    want = (x64 - betas[t] / math.sqrt(1 - abar[t]) * e64) / math.sqrt(alphas[t]) + step.sigma * z64
    got = p_sample(x, eps, step, z if step.sigma > 0 else None)
    assert_close(f"p_sample t={t}", got, want, np.float32, **TOL_STEP_F32)


def test_ddim_tau():
    assert [s.t for s in ddim_steps(SCHED, 10)] == [99, 88, 77, 66, 55, 44, 33, 22, 11, 0]
    assert [s.t for s in ddim_steps(SCHED, 100)] == list(range(99, -1, -1))
    assert [s.t for s in ddim_steps(SCHED, 7)] == np.linspace(99, 0, 7).round().astype(int).tolist()


def test_ddim_eta0_has_no_noise():
    for S in (1, 7, 10, 100):
        assert all(s.sigma == 0.0 for s in ddim_steps(SCHED, S, eta=0.0)), S


@pytest.mark.parametrize("eta", [0.0, 1.0, 0.5])
@pytest.mark.parametrize("S", [10, 7])
def test_ddim_step_reproduces_x0_and_xprime(rng, assert_close, S, eta):
    _, _, abar, _ = spec_tables()
    steps = ddim_steps(SCHED, S, eta=eta)
    tau = [s.t for s in steps]
    for k, step in enumerate(steps):
        a_t = abar[tau[k]]
        a_prev = abar[tau[k + 1]] if k + 1 < len(tau) else 1.0
        x, eps, z = (rng.standard_normal((2, 3, 5, 5)).astype(np.float32) for _ in range(3))
        x64, e64, z64 = (a.astype(np.float64) for a in (x, eps, z))
        x0 = (x64 - math.sqrt(1 - a_t) * e64) / math.sqrt(a_t)
        s = eta * math.sqrt((1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev))
        want = math.sqrt(a_prev) * x0 + math.sqrt(1 - a_prev - s * s) * e64 + s * z64
        assert step.sigma == pytest.approx(s, **APPROX_COEF), f"S={S} k={k}"
        got = p_sample(x, eps, step, z if step.sigma > 0 else None)
        assert_close(f"ddim S={S} eta={eta} step {k}", got, want, np.float32, **TOL_STEP_F32)
    assert steps[-1].sigma == 0.0, "after the last tau abar_prev = 1, so s = 0"


@pytest.mark.parametrize("kwargs", [
    dict(sampler="ddpm", n_steps=50), dict(sampler="ddpm", n_steps=101),
    dict(sampler="ddim", n_steps=101), dict(sampler="ddim", n_steps=-3),
    dict(sampler="euler"), dict(sampler="DDPM"), dict(sampler="ddim", n_steps=10, eta=-0.1),
])
def test_make_steps_usage_errors(kwargs):
    with pytest.raises(UsageError):
        make_steps(SCHED, **kwargs)


@pytest.mark.parametrize("S", [0, -1, T + 1])
def test_ddim_steps_out_of_range(S):
    with pytest.raises(UsageError):
        ddim_steps(SCHED, S)
    # make_steps(..., "ddim", 0) is tests/test_found_bugs.py::test_make_steps_ddim_zero_steps_is_an_error


def test_make_steps_valid():
    assert make_steps(SCHED) == ddpm_steps(SCHED)
    assert make_steps(SCHED, "ddpm", T) == ddpm_steps(SCHED)
    assert make_steps(SCHED, "ddim", 10, eta=0.3) == ddim_steps(SCHED, 10, 0.3)
    assert make_steps(SCHED, "ddim") == ddim_steps(SCHED, T)


def test_noise_stream_order(assert_close):
    shape, seed = (2, 3, 5, 7), 1234
    ref = np.random.Generator(np.random.PCG64(seed))
    ns = NoiseStream(seed, shape)
    assert_close("x_T", ns.draw(), ref.standard_normal(shape, dtype=np.float32), np.float32, atol=0, rtol=0)
    steps = ddpm_steps(SCHED)
    zs = list(ns.for_steps(steps))
    assert len(zs) == T and zs[-1] is None, "t = 0 draws nothing"
    for k, z in enumerate(zs[:-1]):
        assert_close(f"z step {k}", z, ref.standard_normal(shape, dtype=np.float32), np.float32, atol=0, rtol=0)


def test_noise_stream_ddim_eta0_draws_nothing_beyond_xT(assert_close):
    shape, seed = (1, 3, 4, 4), 99
    ns = NoiseStream(seed, shape)
    ns.draw()
    assert list(ns.for_steps(ddim_steps(SCHED, 10, eta=0.0))) == [None] * 10
    ref = np.random.Generator(np.random.PCG64(seed))
    ref.standard_normal(shape, dtype=np.float32)
    # the stream is where it was after x_T: its next draw is the generator's second one
    assert_close("after eta=0", ns.draw(), ref.standard_normal(shape, dtype=np.float32), np.float32, atol=0, rtol=0)


def _spec_loop(shape, seed, sampler, S=None, eta=0.0):
    """The spec's samplers written out step by step (float64 math, x stored as float32)."""
    betas, alphas, abar, abar_prev = spec_tables()
    g = np.random.Generator(np.random.PCG64(seed))
    x = g.standard_normal(shape, dtype=np.float32)
    ts = list(range(T - 1, -1, -1)) if sampler == "ddpm" else np.linspace(T - 1, 0, S).round().astype(int).tolist()
    for k, t in enumerate(ts):
        x64 = x.astype(np.float64)
        eps = (0.1 * x).astype(np.float64)                  # the fake model, as in the test
        if sampler == "ddpm":
            sigma = math.sqrt(betas[t] * (1 - abar_prev[t]) / (1 - abar[t])) if t > 0 else 0.0
            new = (x64 - betas[t] / math.sqrt(1 - abar[t]) * eps) / math.sqrt(alphas[t])
        else:
            a_prev = abar[ts[k + 1]] if k + 1 < len(ts) else 1.0
            sigma = eta * math.sqrt((1 - a_prev) / (1 - abar[t]) * (1 - abar[t] / a_prev))
            x0 = (x64 - math.sqrt(1 - abar[t]) * eps) / math.sqrt(abar[t])
            new = math.sqrt(a_prev) * x0 + math.sqrt(1 - a_prev - sigma ** 2) * eps
        if sigma > 0:
            new = new + sigma * g.standard_normal(shape, dtype=np.float32).astype(np.float64)
        x = new.astype(np.float32)
    return x, ts


@pytest.mark.parametrize("sampler,S,eta", [("ddpm", None, 0.0), ("ddim", 10, 0.0), ("ddim", 7, 1.0)])
def test_sample_loop_matches_spec_loop(assert_close, sampler, S, eta):
    shape, seed = (2, 3, 3, 5), 7
    seen_t, progress = [], []

    def eps_fn(x, t):
        assert x.dtype == np.float32 and x.shape == shape
        assert t.dtype == np.int64 and t.shape == (shape[0],) and (t == t[0]).all()
        seen_t.append(int(t[0]))
        return 0.1 * x

    steps = make_steps(SCHED, sampler, S, eta)
    got = sample_loop(eps_fn, shape, steps, seed, callback=lambda i, n: progress.append((i, n)))
    want, ts = _spec_loop(shape, seed, sampler, S, eta)
    assert seen_t == ts, "timesteps passed to the model"
    assert progress == [(i, len(ts)) for i in range(len(ts))], "callback"
    assert_close(f"sample_loop {sampler} S={S} eta={eta}", got, want, np.float32, **TOL_LOOP_F32)


def test_to_uint8(rng):
    B, C, H, W = 2, 3, 5, 7
    x0 = (rng.standard_normal((B, C, H, W)) * 0.9).astype(np.float32)
    x0.flat[:4] = [-1.0, 1.0, -3.5, 2.25]        # exact ends and far outside [-1, 1]
    img = to_uint8(x0)
    assert img.shape == (B, H, W, C), f"shape {img.shape}"
    assert img.dtype == np.uint8, f"dtype {img.dtype}"
    for n in range(B):
        for y in range(H):
            for xx in range(W):
                for c in range(C):
                    v = min(max((float(x0[n, c, y, xx]) + 1.0) / 2.0, 0.0), 1.0)
                    assert img[n, y, xx, c] == round(255.0 * v), f"pixel ({n}, {y}, {xx}, {c})"
    assert img[0, 0, 0, 0] == 0 and img[0, 0, 1, 0] == 255 and img[0, 0, 2, 0] == 0 and img[0, 0, 3, 0] == 255

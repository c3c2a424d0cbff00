"""Schedule and samplers against the spec's equations, recomputed here in plain float64 math.

The runtime reduces every sampler step to x' = c_x x + c_eps eps + c_h h + sigma z and
h' = d_x x + d_eps eps (h: what the previous step saved; DPM-Solver++(2M)'s previous data
prediction); these tests go back to the spec's un-reduced forms (DDPM's p_sample, DDIM's x0 and x',
DPM-Solver++(2M)'s D history) and check the reduction. Noise: one stream per image (PCG64(seeds[i])).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from jetson_unet.model.config import Schedule
from jetson_unet.errors import UsageError
from jetson_unet.model.schedule import (DPMPP_STEPS, SAMPLERS, NoiseStream, as_seeds, check_seeds, coefficients,
                                        ddim_steps, ddpm_steps, dpmpp_2m_steps, image_seeds, make_steps, p_sample,
                                        sample_loop, tau, to_uint8)

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
    got, h = p_sample(x, eps, step, z if step.sigma > 0 else None)
    assert h is None, "DDPM saves no history"
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
        got, h = p_sample(x, eps, step, z if step.sigma > 0 else None)
        assert h is None, "DDIM saves no history"
        assert_close(f"ddim S={S} eta={eta} step {k}", got, want, np.float32, **TOL_STEP_F32)
    assert steps[-1].sigma == 0.0, "after the last tau abar_prev = 1, so s = 0"


@pytest.mark.parametrize("kwargs", [
    dict(sampler="ddpm", n_steps=50), dict(sampler="ddpm", n_steps=101),
    dict(sampler="ddim", n_steps=101), dict(sampler="ddim", n_steps=-3),
    dict(sampler="euler"), dict(sampler="DDPM"), dict(sampler="ddim", n_steps=10, eta=-0.1),
    dict(sampler="dpmpp-2m", n_steps=1), dict(sampler="dpmpp-2m", n_steps=101), dict(sampler="dpmpp-2m", n_steps=0),
    dict(sampler="dpmpp-2m", eta=0.5), dict(sampler="ddpm", eta=1.0),
    dict(sampler="ddim", n_steps=10, eta=float("nan")), dict(sampler="ddim", n_steps=10, eta=float("inf")),
    dict(sampler="DPMPP-2M"), dict(sampler="dpmpp_2m"),
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
    """One stream per image: image i's part of every draw comes from its own PCG64(seed + i), x_T
    first, then one (C, H, W) array per noisy step."""
    shape, seed = (2, 3, 5, 7), 1234
    refs = [np.random.Generator(np.random.PCG64(seed + i)) for i in range(shape[0])]
    ns = NoiseStream(seed, shape)
    assert ns.seeds == [seed, seed + 1]

    def want():
        return np.stack([g.standard_normal(shape[1:], dtype=np.float32) for g in refs])

    assert_close("x_T", ns.draw(), want(), np.float32, atol=0, rtol=0)
    steps = ddpm_steps(SCHED)
    zs = list(ns.for_steps(steps))
    assert len(zs) == T and zs[-1] is None, "t = 0 draws nothing"
    for k, z in enumerate(zs[:-1]):
        assert_close(f"z step {k}", z, want(), np.float32, atol=0, rtol=0)


@pytest.mark.parametrize("seeds", [[9, 5], [5], [0, 2 ** 63 - 1, 5, 5]])
def test_noise_stream_seed_list_draws_each_images_generator(seeds):
    """NoiseStream(seeds): image i's part is Generator(PCG64(seeds[i])).standard_normal((C, H, W),
    float32), then that generator's next array, and so on, bit for bit (a seed may repeat)."""
    shape = (len(seeds), 3, 4, 6)
    ns = NoiseStream(seeds, shape)
    gens = [np.random.Generator(np.random.PCG64(s)) for s in seeds]
    for k in range(3):
        got = ns.draw()
        assert got.shape == shape and got.dtype == np.float32
        for i, g in enumerate(gens):
            want = g.standard_normal(shape[1:], dtype=np.float32)
            assert np.array_equal(got[i].view(np.uint32), want.view(np.uint32)), f"draw {k}, image {i} (seed {seeds[i]})"


def test_noise_stream_image_does_not_depend_on_batch_or_position():
    """Seed 5's stream is the same whether it is alone, first, or second in a batch."""
    shape = (3, 4, 4)
    alone = NoiseStream([5], (1,) + shape)
    first = NoiseStream(5, (4,) + shape)            # seeds 5, 6, 7, 8
    second = NoiseStream([9, 5], (2,) + shape)
    for k in range(3):
        a, f, s2 = alone.draw(), first.draw(), second.draw()
        assert np.array_equal(a[0], f[0]) and np.array_equal(a[0], s2[1]), f"draw {k}"
    assert np.array_equal(NoiseStream(9, (1,) + shape).draw()[0], NoiseStream([9, 5], (2,) + shape).draw()[0])


def test_noise_stream_fills_out_in_place():
    """draw(out=...) fills any array whose out[i] are contiguous (the pinned [B][T][CHW] rows)."""
    shape, seeds = (2, 3, 4, 4), [3, 8]
    host = np.zeros((2, 5, 3 * 4 * 4), np.float32)
    ns, ref = NoiseStream(seeds, shape), NoiseStream(seeds, shape)
    for r in range(5):
        ns.draw(out=host[:, r])
        want = ref.draw()
        for i in range(2):
            assert np.array_equal(host[i, r], want[i].reshape(-1)), f"row {r}, image {i}"


def test_noise_stream_ddim_eta0_draws_nothing_beyond_xT(assert_close):
    shape, seed = (1, 3, 4, 4), 99
    ns = NoiseStream(seed, shape)
    ns.draw()
    assert list(ns.for_steps(ddim_steps(SCHED, 10, eta=0.0))) == [None] * 10
    ref = np.random.Generator(np.random.PCG64(seed))
    ref.standard_normal(shape[1:], dtype=np.float32)
    # the stream is where it was after x_T: its next draw is the generator's second one
    assert_close("after eta=0", ns.draw(), ref.standard_normal(shape[1:], dtype=np.float32)[None], np.float32,
                 atol=0, rtol=0)


def _spec_loop(shape, seed, sampler, S=None, eta=0.0):
    """The spec's samplers written out step by step (float64 math, x stored as float32), each image
    drawing from its own PCG64(seed + i); dpmpp-2m keeps its D history explicitly."""
    betas, alphas, abar, abar_prev = spec_tables()
    gens = [np.random.Generator(np.random.PCG64(seed + i)) for i in range(shape[0])]

    def draw():
        return np.stack([g.standard_normal(shape[1:], dtype=np.float32) for g in gens])

    x = draw()
    ts = list(range(T - 1, -1, -1)) if sampler == "ddpm" else np.linspace(T - 1, 0, S).round().astype(int).tolist()
    D_prev, h_prev = None, None
    for k, t in enumerate(ts):
        x64 = x.astype(np.float64)
        eps = (0.1 * x).astype(np.float64)                  # the fake model, as in the test
        sigma = 0.0
        if sampler == "ddpm":
            sigma = math.sqrt(betas[t] * (1 - abar_prev[t]) / (1 - abar[t])) if t > 0 else 0.0
            new = (x64 - betas[t] / math.sqrt(1 - abar[t]) * eps) / math.sqrt(alphas[t])
        elif sampler == "ddim":
            a_prev = abar[ts[k + 1]] if k + 1 < len(ts) else 1.0
            sigma = eta * math.sqrt((1 - a_prev) / (1 - abar[t]) * (1 - abar[t] / a_prev))
            x0 = (x64 - math.sqrt(1 - abar[t]) * eps) / math.sqrt(abar[t])
            new = math.sqrt(a_prev) * x0 + math.sqrt(1 - a_prev - sigma ** 2) * eps
        else:   # dpmpp-2m
            new, D_prev, h_prev = _dpmpp_spec_step(x64, eps, ts, k, D_prev, h_prev)
            D_prev = D_prev.astype(np.float32).astype(np.float64)   # the history is stored as float32, as x
        if sigma > 0:
            new = new + sigma * draw().astype(np.float64)
        x = new.astype(np.float32)
    return x, ts


def _dpmpp_spec_step(x, eps, ts, k, D_prev, h_prev):
    """The spec's DPM-Solver++(2M) step k in float64, un-reduced: returns (x', D_k, h_k)."""
    _, _, abar, _ = spec_tables()
    S = len(ts)
    u = ts[k]
    a_u, s_u = math.sqrt(abar[u]), math.sqrt(1 - abar[u])
    D = (x - s_u * eps) / a_u
    if k == S - 1:
        return D, D, None
    v = ts[k + 1]
    a_v, s_v = math.sqrt(abar[v]), math.sqrt(1 - abar[v])
    h = math.log(a_v / s_v) - math.log(a_u / s_u)
    if k == 0:
        new = (s_v / s_u) * x - a_v * (math.exp(-h) - 1) * D
    else:
        r = h_prev / h
        new = (s_v / s_u) * x - a_v * (math.exp(-h) - 1) * (D + (D - D_prev) / (2 * r))
    return new, D, h


@pytest.mark.parametrize("sampler,S,eta", [("ddpm", None, 0.0), ("ddim", 10, 0.0), ("ddim", 7, 1.0),
                                           ("dpmpp-2m", 2, 0.0), ("dpmpp-2m", 7, 0.0), ("dpmpp-2m", 20, 0.0)])
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


def test_sample_loop_seed_list_equals_one_seed():
    """sample_loop(seeds=s) is sample_loop(seeds=[s, s+1, ..]); an image is the same alone."""
    shape = (3, 3, 4, 4)
    steps = make_steps(SCHED, "ddim", 6, eta=1.0)

    def eps_fn(x, t):
        return 0.1 * x

    a = sample_loop(eps_fn, shape, steps, 5)
    b = sample_loop(eps_fn, shape, steps, [5, 6, 7])
    assert np.array_equal(a, b)
    for i in range(3):
        assert np.array_equal(a[i:i + 1], sample_loop(eps_fn, (1,) + shape[1:], steps, [5 + i])), f"image {i}"


# ---- DPM-Solver++(2M) -----------------------------------------------------------------------------------
# The affine coefficients against the spec's un-reduced equations, both in float64: a few ulp of each
# term, relative to the largest term (D ~ 1/a_u reaches ~1e2 at t = T-1 and partly cancels)
TOL_DPMPP = 1e-12


def _affine(step, x, eps, h):
    out = step.c_x * x + step.c_eps * eps
    if h is not None:
        out = out + step.c_h * h
    return out, step.d_x * x + step.d_eps * eps


@pytest.mark.parametrize("S", [2, 5, 10, T])
def test_dpmpp_2m_steps_are_the_spec_equations(rng, S):
    """dpmpp-2m's affine steps (S) and (H), applied in float64 to a random x/eps sequence, give what
    the spec's equations give with an explicit D history, step by step."""
    steps = dpmpp_2m_steps(SCHED, S)
    ts = tau(T, S).tolist()
    assert [st.t for st in steps] == ts == np.linspace(T - 1, 0, S).round().astype(int).tolist()
    assert all(st.sigma == 0.0 for st in steps), "DPM-Solver++ draws no noise"
    assert steps[0].c_h == 0.0, "the first step has no history to weigh"
    assert steps[-1].c_h == 0.0 and (steps[-1].c_x, steps[-1].c_eps) == (steps[-1].d_x, steps[-1].d_eps), \
        "the last step is the data prediction itself"
    if S > 2:
        assert all(st.c_h != 0.0 for st in steps[1:-1])
    D_prev, h_prev, hist = None, None, None
    for k, st in enumerate(steps):
        x, eps = (rng.standard_normal((2, 3, 4, 4)) * 1.5 for _ in range(2))   # float64
        want, D, h_k = _dpmpp_spec_step(x, eps, ts, k, D_prev, h_prev)
        got, saved = _affine(st, x, eps, hist)
        scale = np.abs(st.c_x * x) + np.abs(st.c_eps * eps) + (np.abs(st.c_h * hist) if hist is not None else 0.0)
        err = np.abs(got - want) / np.maximum(scale, np.abs(want))
        assert err.max() <= TOL_DPMPP, f"S={S} step {k} (t={st.t}): x' relative error {err.max():.3g}"
        err_h = np.abs(saved - D) / np.maximum(np.abs(st.d_x * x) + np.abs(st.d_eps * eps), np.abs(D))
        assert err_h.max() <= TOL_DPMPP, f"S={S} step {k}: the saved D, relative error {err_h.max():.3g}"
        D_prev, h_prev, hist = D, h_k, saved


@pytest.mark.parametrize("S", [2, 5, T])
def test_dpmpp_2m_p_sample_carries_the_history(rng, assert_close, S):
    """p_sample with h runs (S) and (H): x' from the previous step's h, and this step's D as h'."""
    steps = dpmpp_2m_steps(SCHED, S)
    ts = tau(T, S).tolist()
    h, D_prev, h_prev = None, None, None
    for k, st in enumerate(steps):
        x, eps = (rng.standard_normal((2, 3, 5, 5)).astype(np.float32) for _ in range(2))
        want, D, h_prev = _dpmpp_spec_step(x.astype(np.float64), eps.astype(np.float64), ts, k, D_prev, h_prev)
        got, h_next = p_sample(x, eps, st, None, h)
        scale = float(np.abs(want).max()) + 1.0
        assert_close(f"dpmpp-2m S={S} step {k}", got, want, np.float32, rtol=2e-7, atol=2e-7 * scale)
        assert h_next is not None and h_next.dtype == np.float32
        assert_close(f"dpmpp-2m S={S} step {k} D", h_next, D, np.float32, rtol=2e-7, atol=2e-7)
        h, D_prev = h_next, h_next.astype(np.float64)   # the history as stored


@pytest.mark.parametrize("S", [-1, 0, 1, T + 1, 1000])
def test_dpmpp_2m_steps_out_of_range(S):
    with pytest.raises(UsageError, match="dpmpp-2m steps must be in 2..100"):
        dpmpp_2m_steps(SCHED, S)
    with pytest.raises(UsageError, match="dpmpp-2m steps must be in 2..100"):
        make_steps(SCHED, "dpmpp-2m", S)


@pytest.mark.parametrize("steps", [ddpm_steps(SCHED), ddim_steps(SCHED, 10), ddim_steps(SCHED, 7, eta=1.0),
                                   ddim_steps(SCHED, 1), ddim_steps(SCHED, T, eta=0.5)],
                         ids=["ddpm", "ddim10", "ddim7-eta1", "ddim1", "ddim100-eta0.5"])
def test_single_step_samplers_save_no_history(rng, steps):
    """DDPM and DDIM: c_h = d_x = d_eps = 0, and p_sample is (S) without h: the same x' whatever h is
    given, and no h back."""
    for st in steps:
        assert (st.c_h, st.d_x, st.d_eps) == (0.0, 0.0, 0.0), f"t={st.t}"
    for st in steps[:: max(1, len(steps) // 5)] + steps[-1:]:
        x, eps, z, h = (rng.standard_normal((2, 3, 4, 4)).astype(np.float32) for _ in range(4))
        zz = z if st.sigma > 0 else None
        want = (st.c_x * x.astype(np.float64) + st.c_eps * eps.astype(np.float64)
                + (st.sigma * z.astype(np.float64) if zz is not None else 0.0)).astype(np.float32)
        for hh in (None, h):
            got, h_next = p_sample(x, eps, st, zz, hh)
            assert h_next is None, f"t={st.t}"
            assert np.array_equal(got, want), f"t={st.t}, h={'none' if hh is None else 'given'}"


def test_sampler_names_and_defaults():
    assert SAMPLERS == ("ddpm", "ddim", "dpmpp-2m")
    assert make_steps(SCHED, "dpmpp-2m") == dpmpp_2m_steps(SCHED, DPMPP_STEPS)
    assert make_steps(SCHED, "dpmpp-2m", T) == dpmpp_2m_steps(SCHED, T)
    short = Schedule(timesteps=10, beta_end=0.005)
    assert make_steps(short, "dpmpp-2m") == dpmpp_2m_steps(short, 10), "DPMPP_STEPS capped at T"


@pytest.mark.parametrize("seeds,batch", [([1, 2], 3), ([], 1), ([1, 2, 3], 2), ([-1], 1), ([2 ** 63], 1),
                                         ([1.0], 1), ([True], 1), (["3"], 1), ([None], 1)])
def test_check_seeds_refuses(seeds, batch):
    with pytest.raises(UsageError):
        check_seeds(seeds, batch)


def test_seeds_helpers():
    assert check_seeds([0, 2 ** 63 - 1, np.int64(7)], 3) == [0, 2 ** 63 - 1, 7]
    assert image_seeds(5, 4) == [5, 6, 7, 8]
    assert as_seeds(5, 3) == [5, 6, 7] and as_seeds([9, 5], 2) == [9, 5] and as_seeds(np.int64(2), 2) == [2, 3]
    for bad in (-1, 2 ** 63):
        with pytest.raises(UsageError):
            image_seeds(bad, 1)
    with pytest.raises(UsageError):   # the last image's seed would be 2**63
        image_seeds(2 ** 63 - 2, 3)


def test_to_uint8(rng):
    B, C, H, W = 2, 3, 5, 7
    x0 = (rng.standard_normal((B, C, H, W)) * 0.9).astype(np.float32)
    x0.flat[:5] = [-1.0, 1.0, -3.5, 2.25, 0.0]   # exact ends, far outside [-1, 1], a tie (127.5 -> 128)
    before = x0.copy()
    img = to_uint8(x0)
    assert np.array_equal(x0, before), "the input is left as it was"
    assert img.shape == (B, H, W, C), f"shape {img.shape}"
    assert img.dtype == np.uint8, f"dtype {img.dtype}"
    for n in range(B):
        for y in range(H):
            for xx in range(W):
                for c in range(C):
                    v = min(max((float(x0[n, c, y, xx]) + 1.0) / 2.0, 0.0), 1.0)
                    assert img[n, y, xx, c] == round(255.0 * v), f"pixel ({n}, {y}, {xx}, {c})"
    assert img[0, 0, 0, 0] == 0 and img[0, 0, 1, 0] == 255 and img[0, 0, 2, 0] == 0 and img[0, 0, 3, 0] == 255
    assert img[0, 0, 4, 0] == 128, "round half to even, as the spec's round"

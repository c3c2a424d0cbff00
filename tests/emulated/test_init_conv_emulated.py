"""The image-input conv (kernels/io.cu init_conv, and init_conv_tc on tensor cores) run on the CPU
by tests/emu/simt.h (see tests/test_conv_pipe_emulated.py) against the NumPy reference's conv2d in
float64: tiles 8 and 16 pixels wide (init_tw, the FFMA kernel), ragged
last row and column tiles, output channel counts that are not a multiple of 8 or 32 (a partial last
group or pass, scalar stores), the output a view of a wider buffer (at an odd channel offset too:
no paired stores), images of 1, 3 and 4 channels, two samples, fp16 / bf16 / fp32 outputs. Outputs
are NaN-poisoned: every element the kernel owns must be written, and nothing outside its channel
window may be. The grid's extra CTA per sample (the sampler's step advance) leaves a plain call's
outputs alone, and advances the step exactly once per launch in a sampling call."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from jetson_unet.ops.common import cdiv, padded, round_up
from jetson_unet.ops.io import INIT_TC_THREADS, INIT_TC_TILE, INIT_TILE, init_tc_steps, pack_init_tc
from jetson_unet.ops.keys import SimpleKey
from jetson_unet.model.reference import conv2d
from tests.emulated.test_conv_pipe_emulated import kernel_lib, macro_params
from tests.emulated.test_dwconv_emulated import as_float, poison

pytestmark = pytest.mark.slow
K = 7
# (name, dtype, kernel, tile width (init) or rows per warp (init_tc), image channels, H, W, Cout,
#  output pixel stride, output channel offset, batch)
CASES = [
    ("fp16-w8-ragged-view", "fp16", "init", 8, 3, 19, 21, 13, 24, 8, 2),
    ("fp16-w16-ragged-view", "fp16", "init", 16, 3, 19, 21, 13, 24, 8, 2),
    ("bf16-w16-whole-groups", "bf16", "init", 16, 3, 16, 16, 32, 64, 0, 1),
    ("fp32-w16", "fp32", "init", 16, 3, 11, 9, 8, 8, 0, 2),
    ("tc-fp16-ragged-view", "fp16", "init_tc", 1, 3, 19, 21, 13, 24, 8, 2),
    ("tc-fp16-whole", "fp16", "init_tc", 1, 3, 16, 32, 32, 64, 32, 1),
    ("tc-bf16-two-passes", "bf16", "init_tc", 1, 4, 13, 17, 40, 48, 0, 2),
    ("tc-fp16-gray-odd-offset", "fp16", "init_tc", 1, 1, 9, 20, 16, 21, 3, 1),
    ("tc-fp16-4-rows-ragged-view", "fp16", "init_tc", 4, 3, 19, 21, 13, 24, 8, 2),
    ("tc-bf16-4-rows-two-passes", "bf16", "init_tc", 4, 4, 35, 17, 40, 48, 0, 2),
]


def case_key(dt, kind, var, cin):
    return SimpleKey("init_tc", dt, K, cin, cp=var) if kind == "init_tc" else SimpleKey("init", dt, K, cin, var)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return kernel_lib("io.cu", [case_key(dt, kind, v, cin) for _, dt, kind, v, cin, *_ in CASES], "INIT_PARAMS",
                      "INIT_ARGS", tmp_path_factory.mktemp("emu-init"))


def test_pack_init_tc_is_the_b_fragment_layout():
    """The packed weights, read back through the fragment map of mma.m16n8k16 (B: lane g = l // 4
    holds column g, k pairs 2t, 2t + 1 and 2t + 8, + 9), are the weight at (tap, channel) = divmod(k, 4)."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((10, 3, 3, 3)).astype(np.float32)
    f = pack_init_tc(w, "fp16", 32).astype(np.float32)
    steps = init_tc_steps(3)
    assert f.shape == (steps, 4, 32, 2, 2)
    for s in range(steps):
        for j in range(4):
            for lane in range(32):
                for r in range(2):
                    for e in range(2):
                        k, n = 16 * s + 2 * (lane % 4) + 8 * r + e, 8 * j + lane // 4
                        tap, c = divmod(k, 4)
                        want = w[n, c, tap // 3, tap % 3] if n < 10 and c < 3 and tap < 9 else 0.0
                        assert f[s, j, lane, r, e] == np.float16(want)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_init_conv_matches_reference(lib, case):
    name, dt, kind, var, cin, h, w, cout, ldo, o0, b = case
    rng = np.random.default_rng(5)
    x = rng.standard_normal((b, h, w, cin)).astype(np.float32)   # the fp32 NHWC image
    wt = (rng.standard_normal((cout, cin, K, K)) / K).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    if kind == "init_tc":
        coutp = round_up(cout, 32)
        wp = pack_init_tc(wt, dt, coutp)
        th, tw = INIT_TC_TILE[0] * var, INIT_TC_TILE[1]
        grid, nt = cdiv(h, th) * cdiv(w, tw), INIT_TC_THREADS
    else:
        coutp = round_up(cout, 8)
        wp = np.zeros((K, K, cin, coutp), dtype=np.float32)
        wp[..., :cout] = wt.transpose(2, 3, 1, 0)
        grid, nt = cdiv(h, INIT_TILE) * cdiv(w, var), 256
    bp = padded(bias, coutp)
    out = poison((b, h, w, ldo), dt)
    esize = 4 if dt == "fp32" else 2
    args = [ctypes.c_void_p(x.ctypes.data), h, w, cin, ctypes.c_void_p(wp.ctypes.data),
            ctypes.c_void_p(bp.ctypes.data), ctypes.c_void_p(out.ctypes.data + o0 * esize), cout, coutp, ldo,
            grid] + [None] * 6 + [0]   # a plain call: no step advance
    launch(lib, case_key(dt, kind, var, cin), grid, b, nt, args)

    want = conv2d(x.transpose(0, 3, 1, 2).astype(np.float64), wt.astype(np.float64),
                  bias.astype(np.float64)).transpose(0, 2, 3, 1)
    got_all = as_float(out, dt)
    got = got_all[..., o0:o0 + cout]
    assert not np.isnan(got).any(), f"{name}: {np.isnan(got).sum()} outputs unwritten"
    assert np.isnan(np.delete(got_all, np.s_[o0:o0 + cout], axis=3)).all(), f"{name}: wrote outside its window"
    # fp32 sums of 147 products, then one rounding to the output dtype; on tensor cores the image
    # and the weights are rounded to the 16-bit type first as well (each product off by <= 2 units)
    tol = {"fp32": 1e-5, "fp16": 2.0 ** -10, "bf16": 2.0 ** -7}[dt] * (4 if kind == "init_tc" else 2) * np.abs(want).max()
    err = np.abs(got - want).max()
    assert err <= tol, f"{name}: max error {err:.3g} > {tol:.3g}"


def launch(lib, key, tiles, batch, threads, args):
    """The kernel over its launch grid: tiles + 1 CTAs per sample (init_spec)."""
    cargs = [a if k == "p" else ctypes.c_int(a) for k, a in zip(macro_params("io.cu", "INIT_PARAMS"), args)]
    getattr(lib, "emu_" + key.symbol)(tiles + 1, 1, batch, threads, *cargs)


@pytest.mark.parametrize("case", [CASES[1], CASES[4]], ids=["init", "init_tc"])
def test_init_conv_advances_the_sampler_step_once_per_launch(lib, case):
    """With the step tables (GpuExecutor.run(step=)): each launch moves the counter on by one, sets
    every sample's timestep to the step's and hands the step's six coefficients and noise row to cur
    (two float4: c_x, c_eps, sigma, row bits; c_h, d_x, d_eps, 0), the conv's outputs as in a plain
    call; past the last step only the counter moves."""
    name, dt, kind, var, cin, h, w, cout, ldo, o0, b = case
    rng = np.random.default_rng(8)
    x = rng.standard_normal((b, h, w, cin)).astype(np.float32)
    coutp = round_up(cout, 32) if kind == "init_tc" else round_up(cout, 8)
    if kind == "init_tc":
        wp = pack_init_tc(rng.standard_normal((cout, cin, K, K)).astype(np.float32), dt, coutp)
        th, tw = INIT_TC_TILE[0] * var, INIT_TC_TILE[1]
        tiles, nt = cdiv(h, th) * cdiv(w, tw), INIT_TC_THREADS
    else:
        wp = rng.standard_normal((K, K, cin, coutp)).astype(np.float32)
        tiles, nt = cdiv(h, INIT_TILE) * cdiv(w, var), 256
    bp = rng.standard_normal(coutp).astype(np.float32)
    n_steps = 3
    t_of_step = np.array([90, 45, 7], np.int32)
    coef = rng.standard_normal((n_steps, 6)).astype(np.float32)   # memory.STEP_COEFS per step
    noise_row = np.array([0, 1, -1], np.int32)
    counter, t_idx, cur = np.array([-1], np.int32), np.full(b, -5, np.int32), np.full(8, np.nan, np.float32)
    P = lambda a: ctypes.c_void_p(a.ctypes.data)   # noqa: E731
    outs = []
    for s in range(n_steps + 1):
        out = poison((b, h, w, ldo), dt)
        launch(lib, case_key(dt, kind, var, cin), tiles, b, nt,
               [P(x), h, w, cin, P(wp), P(bp), ctypes.c_void_p(out.ctypes.data + o0 * 2), cout, coutp, ldo, tiles,
                P(counter), P(t_idx), P(cur), P(t_of_step), P(coef), P(noise_row), n_steps])
        outs.append(as_float(out, dt))
        assert counter[0] == s, f"step {s}: counter {counter[0]} (the advance ran {counter[0] + 1 - s} extra times)"
        k = min(s, n_steps - 1)   # past the last step: t_idx and cur stay
        assert (t_idx == t_of_step[k]).all(), (s, t_idx)
        np.testing.assert_array_equal(cur[:3], coef[k, :3])
        assert cur[3:4].view(np.int32)[0] == noise_row[k]
        np.testing.assert_array_equal(cur[4:7], coef[k, 3:])
        assert cur[7] == 0.0
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    assert not np.isnan(outs[0][..., o0:o0 + cout]).any()


def test_every_init_instantiation_compiles_for_sm87_without_spills(ptxas87):
    """Each (dtype, kernel, width) the host can pick for a 3-channel image, through ptxas
    for the Orin's sm_87: no spills, no stack."""
    keys = ([SimpleKey("init", dt, K, 3, tw) for dt in ("fp32", "fp16", "bf16") for tw in (8, 16)]
            + [SimpleKey("init_tc", dt, K, 3) for dt in ("fp16", "bf16")])
    rep = ptxas87.report(keys)
    for k in keys:
        f = rep[k.symbol]
        assert f["spill"] == 0 and f["stack"] == 0, (k.symbol, f)

"""The GroupNorm folded into the GEMM (kernels/conv.cu conv_gn_prologue, runtime/gpu/ops.py fold_norm)
in the cp.async and halo convs, run on the CPU by tests/emu/simt.h, against a float64 NumPy conv of
the normalized, zero-padded input. Every case has padded taps (small maps: borders everywhere), and
the table-mode kernel (the same key, GroupNorm applied to every A vector) on the same problem sets
the error scale: the fold must be as close to float64 as the table is, give or take the rounding
of W * gn_w instead of W. Cases: 3x3 with time bias, GELU and residual; k slices; a residual_conv
segment with split-K straddling it; several halo channel chunks; up2; bf16 with 8 warps; 1x1; a
mean 8 standard deviations off zero with large gn_b / gn_w (pad values far from the data).
Mutations that this catches (checked by hand): pads left at zero, rstd never applied, the column
term dropped. Also the host's rule (fold_norm) and the folded weights' algebra."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jetson_unet.ops.conv import FOLD_RATIO_MAX, fold_norm, fold_table, fold_weights
from jetson_unet.ops.conv_halo import ConvGeom, halo_problems
from jetson_unet.model.reference import gelu
from tests.emulated.test_conv_halo_emulated import halo
from tests.emulated.test_conv_pipe_emulated import Problem, build_lib, key, merged, values

pytestmark = pytest.mark.slow


# (name, keys, problem)
CASES = [
    ("3x3-tbias-gelu-res", [key(64, 64, 32, stages=3), key(32, 32, 64, stages=3, ks=2), halo(key(64, 64, 32, stages=3))],
     dict(hin=8, cin=32, n=40, cr=0, batch=2, norm=True, tbias=True, act=1, res=True)),
    ("residual-conv-split-k", [key(64, 32, 32, stages=3), halo(key(64, 32, 32, stages=3))],
     dict(hin=8, cin=32, n=32, cr=24, batch=2, norm=True, splits=3)),
    ("halo-chunks-residual-conv", [halo(key(64, 32, 32, stages=4))],
     dict(hin=8, cin=96, n=32, cr=40, batch=2, norm=True)),
    ("split-across-chunks", [key(32, 64, 32, stages=3), halo(key(32, 64, 32, stages=3))],
     dict(hin=8, cin=64, n=64, cr=0, batch=1, norm=True, act=1, splits=4)),
    ("up2", [halo(key(32, 64, 32, up=2, stages=2))],
     dict(hin=4, cin=64, n=48, cr=0, batch=2, norm=True)),
    ("bf16-8-warps", [halo(key(128, 64, 32, stages=3, dtype="bf16", wm=4, wn=2)),
                      key(64, 64, 32, stages=3, dtype="bf16")],
     dict(hin=16, cin=64, n=64, cr=0, batch=1, norm=True, tbias=True, res=True)),
    ("1x1", [key(64, 64, 32, kh=1, stages=3)], dict(hin=8, cin=48, n=64, cr=0, batch=1, norm=True, act=1)),
    ("mean-8-std-off", [key(32, 32, 64, stages=3), halo(key(64, 32, 32, stages=3))],
     dict(hin=8, cin=64, n=32, cr=16, batch=2, norm=True, mean_off=8.0, gn_b_scale=2.0)),
]


@pytest.fixture(scope="module")
def emu_lib(tmp_path_factory):
    keys = [k for _, ks, _ in CASES for k in ks]
    return build_lib(keys + [folded(k) for k in keys], tmp_path_factory.mktemp("emu-fold"))


def folded(k):
    return dataclasses.replace(k, fold=True)


def reference(prob: Problem) -> np.ndarray:
    """float64: act(conv(pad0(gn(up(x)))) + residual_conv + bias + tbias) + res, from the problem's
    unrounded weights and its partial statistics."""
    k, dt = prob.k, prob.k.dtype
    x = values(prob.x, dt).astype(np.float64)
    if prob.norm:
        n, mean, m2 = merged(prob.gn_part).T
        rstd = 1.0 / np.sqrt(m2 / n + 1e-5)
        x = (x - mean[:, None, None, None]) * rstd[:, None, None, None] * prob.gn_w + prob.gn_b
    if k.up == 2:
        x = x.repeat(2, axis=1).repeat(2, axis=2)
    pad, h = k.kh // 2, prob.hout
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    cols = np.concatenate([xp[:, ky:ky + h, kx:kx + h, :] for ky in range(k.kh) for kx in range(k.kh)], axis=3)
    out = cols @ prob.segs[0].astype(np.float64).T + prob.bias
    if prob.cr:
        out += values(prob.xr, dt)[..., :prob.cr].astype(np.float64) @ prob.segs[1].astype(np.float64).T
    if prob.tbias_on:
        out += prob.tb[prob.t_idx][:, None, None, :]
    if prob.act:
        out = gelu(out)
    if prob.res_on:
        out += values(prob.res, dt).astype(np.float64)
    return out


def rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_folded_norm_matches_float64(emu_lib, case):
    _, keys, shape = case
    for k in keys:
        prob = Problem(k, **shape)
        assert fold_norm(k, prob.gn_w, prob.gn_b), k.symbol
        if k.halo:
            geom = ConvGeom(shape["cin"], shape["cr"], prob.hout, True)
            assert halo_problems(k, geom) == [], k.symbol
        want = reference(prob)
        table_out, _ = prob.run(emu_lib, k)
        fold_out, fold_st = prob.run(emu_lib, folded(k))
        table, got = values(table_out, k.dtype), values(fold_out, k.dtype)
        assert not np.isnan(got).any(), f"{k.symbol}: {np.isnan(got).sum()} outputs unwritten (or NaN)"
        e_table, e_fold = rel_l2(table, want), rel_l2(got, want)
        # the table's error is the 16-bit rounding of the normalized input and of the output; the
        # fold trades the first for the rounding of W * gn_w: the same size, not more
        ulp = 2.0 ** -11 if k.dtype == "fp16" else 2.0 ** -8
        assert e_fold <= 1.5 * e_table + ulp, (k.symbol, e_fold, e_table)
        worst = np.abs(got - want).max() / np.abs(want).max()
        assert e_table < 4 * ulp and worst < 16 * ulp, (k.symbol, e_table, worst)
        # the statistics of what was stored (for the next conv's norm) agree with the stored values
        np.testing.assert_allclose(merged(fold_st)[:, 1], got.reshape(prob.batch, -1).mean(axis=1),
                                   rtol=1e-3, atol=1e-3)


def test_fold_rule():
    k = key(64, 64, 32, stages=3)
    g, b = np.array([1.0, -0.5, 2.0]), np.array([0.1, 3.0, -1.0])
    assert fold_norm(k, g, b)
    assert not fold_norm(key(64, 64, 32), g, b), "conv_gemm (stages 0) keeps the table"
    assert not fold_norm(key(64, 64, 16, dtype="fp32", stages=3), g, b), "fp32 keeps the table"
    assert not fold_norm(key(32, 256, 32, stages=3, wm=1, wn=4), g, b), "BN > 128: no epilogue prefetch"
    assert not fold_norm(k, np.array([1.0, 0.0, 2.0]), b), "a zero gn_w has no pad value"
    big = b.copy()
    big[1] = 0.5 * (FOLD_RATIO_MAX + 1)
    assert not fold_norm(k, g, big), "|gn_b / gn_w| past FOLD_RATIO_MAX"


def test_fold_weights_algebra():
    """conv(gn(x)) = rstd * W'.xp - mean * rstd * Q + P with xp's padded taps at the pad value."""
    rng = np.random.default_rng(3)
    cin, n, taps = 5, 4, 9
    w = rng.standard_normal((n, taps * cin)).astype(np.float32)
    bias, g, b = rng.standard_normal(n), rng.standard_normal(cin) + 2.0, rng.standard_normal(cin)
    mean, rstd = 1.7, 0.6
    x = rng.standard_normal((taps, cin)) * 3 + mean
    inb = rng.random(taps) < 0.6                       # which taps are inside the image
    y = np.where(inb[:, None], (x - mean) * rstd * g + b, 0.0)   # zero padding of gn(x)
    want = w.astype(np.float64) @ y.ravel() + bias
    wf, bf = fold_weights(w, bias.astype(np.float32), g, b)
    table = fold_table(wf.astype(np.float32), "fp32", taps * cin, g, b)
    r, q = table[:cin], table[cin:]
    xp = np.where(inb[:, None], x, mean - r / rstd)   # the pad value of each channel
    got = rstd * (wf.astype(np.float64) @ xp.ravel()) - mean * rstd * q + bf
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

"""The GroupNorm folded into the GEMM (kernels/conv.cu conv_gn_prologue, runtime/ops/conv.py fold_norm)
in the cp.async and halo convs, run on the CPU by tests/emu/simt.h, against a float64 NumPy conv of
the normalized, zero-padded input. The folded kernel reads its input as the producer stores it for
it, gn_w * x rounded to 16 bits (the producer's output scale: test_output_scale_*). Every case has
padded taps (small maps: borders everywhere), and the table-mode kernel (the same key, GroupNorm
applied to every A vector) on the same problem sets the error scale: the fold must be as close to
float64 as the table is, give or take the rounding of gn_w * x instead of the normalized value.
Cases: 3x3 with time bias, GELU and residual; k slices; a residual_conv segment with split-K
straddling it; several halo channel chunks; up2; bf16 with 8 warps; 1x1; a mean 8 standard
deviations off zero with large gn_b / gn_w (pad values far from the data). Mutations that this
catches (checked by hand): pads left at zero, rstd never applied, the column term dropped. Also the
host's rule (fold_norm) and the fold's algebra."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jetson_unet.model.config import UNetConfig
from jetson_unet.model.plan import Op, build_plan
from jetson_unet.ops.conv import fold_fits, fold_norm, fold_table, fold_weights, scalable_input
from jetson_unet.ops.conv_halo import ConvGeom, halo_problems
from jetson_unet.model.reference import gelu
from tests.emulated.test_conv_halo_emulated import halo, rows
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
        assert fold_fits(k), k.symbol
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
        # fold trades the first for the rounding of gn_w * x: the same size, not more
        ulp = 2.0 ** -11 if k.dtype == "fp16" else 2.0 ** -8
        assert e_fold <= 1.5 * e_table + ulp, (k.symbol, e_fold, e_table)
        worst = np.abs(got - want).max() / np.abs(want).max()
        assert e_table < 4 * ulp and worst < 16 * ulp, (k.symbol, e_table, worst)
        # the statistics of what was stored (for the next conv's norm) agree with the stored values
        np.testing.assert_allclose(merged(fold_st)[:, 1], got.reshape(prob.batch, -1).mean(axis=1),
                                   rtol=1e-3, atol=1e-3)


def test_fold_rule():
    """The fold where the kernel has one and the producer can store gn_w * x for the conv alone."""
    plan = build_plan(UNetConfig())
    ops = {o.out: o for o in plan.ops}
    conv1, conv2 = ops["downs.0.block1.conv1"], ops["downs.0.block1"]
    k = key(64, 64, 32, stages=3)
    assert fold_norm(k, conv1, plan) and fold_norm(k, conv2, plan), "after the depthwise conv and after conv1"
    assert not fold_norm(key(64, 64, 32), conv1, plan), "conv_gemm (stages 0) keeps the table"
    assert not fold_norm(key(64, 64, 16, dtype="fp32", stages=3), conv1, plan), "fp32 keeps the table"
    assert not fold_norm(key(32, 256, 32, stages=3, wm=1, wn=4), conv1, plan), "BN > 128: no epilogue prefetch"
    assert not fold_norm(k, ops["downs.0.block1.ds_conv"], plan), "no GroupNorm"
    shared = dataclasses.replace(conv1, out="other", inputs=("downs.0.block1",))   # read by block2 too
    assert not scalable_input(shared, plan) and not fold_norm(k, shared, plan), "a tensor others read"


def test_fold_algebra():
    """conv(gn(x)) = rstd * W.xp - mean * rstd * Q + P with xp = gn_w * x in bounds and the pad value
    gn_w * mean - gn_b / rstd at padded taps (the table's gn_w, gn_b and Q; P in the bias)."""
    rng = np.random.default_rng(3)
    cin, n, taps = 5, 4, 9
    w = rng.standard_normal((n, taps * cin)).astype(np.float32)
    bias, g, b = rng.standard_normal(n), rng.standard_normal(cin), rng.standard_normal(cin)
    g[1] = 0.0                                         # a zero gn_w folds too
    mean, rstd = 1.7, 0.6
    x = rng.standard_normal((taps, cin)) * 3 + mean
    inb = rng.random(taps) < 0.6                       # which taps are inside the image
    y = np.where(inb[:, None], (x - mean) * rstd * g + b, 0.0)   # zero padding of gn(x)
    want = w.astype(np.float64) @ y.ravel() + bias
    bf = fold_weights(w, bias.astype(np.float32), b)
    k0 = taps * cin + 3                                # packed K: padding columns of zeros
    wp = np.concatenate([w, np.zeros((n, 3), np.float32)], axis=1)
    table = fold_table(wp, "fp32", k0, cin, g, b)
    assert np.array_equal(table[:cin], g.astype(np.float32)) and np.array_equal(table[cin:2 * cin], b.astype(np.float32))
    q = table[2 * cin:]
    xp = np.where(inb[:, None], g * x, g * mean - b / rstd)
    got = rstd * (w.astype(np.float64) @ xp.ravel()) - mean * rstd * q + bf
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# the producer's output scale (feature o): the generic kernel (every feature), an own-features
# tile of the 16-byte stores (pass16: whole tiles, GELU known) and the row tiles
SCALE_KEYS = [key(64, 64, 32, stages=3), key(64, 64, 32, stages=3, feat="gnso"), halo(key(64, 64, 32, stages=3)),
              dataclasses.replace(rows(64, 64, 1, 2), feat="gnso")]


@pytest.fixture(scope="module")
def scale_lib(tmp_path_factory):
    own = [dataclasses.replace(k, feat=k.feat.replace("o", "")) for k in SCALE_KEYS if k.feat != "gtnkrspo"]
    return build_lib(SCALE_KEYS + own, tmp_path_factory.mktemp("emu-oscale"))


@pytest.mark.parametrize("k", SCALE_KEYS, ids=[k.symbol for k in SCALE_KEYS])
def test_output_scale_scales_stores_not_statistics(scale_lib, k):
    """With oscale, column n is stored as the 16-bit rounding of v * oscale[n]; the GroupNorm
    partials are those of v, bit for bit the run's without it (an own-features key without o for
    the unscaled run: the o bit reaches the argument)."""
    prob = Problem(k, hin=16, cin=32, n=64, cr=0, batch=2, norm=True, act=1)
    plain = k if "p" in k.feat else dataclasses.replace(k, feat=k.feat.replace("o", ""))
    want_out, want_st = prob.run(scale_lib, plain)
    osc = (0.5 + np.random.default_rng(4).random(64)).astype(np.float32)
    got_out, got_st = prob.run(scale_lib, k, oscale=osc)
    assert np.array_equal(got_st, want_st, equal_nan=True), "the statistics must be the unscaled values'"
    want = values(want_out, k.dtype).astype(np.float64) * osc
    got = values(got_out, k.dtype).astype(np.float64)
    assert not np.isnan(got).any()
    # one rounding of v * s against the rounding of v times s: within two units in the last place
    assert np.all(np.abs(got - want) <= 2 * 2.0 ** -11 * np.abs(want) + 1e-6), k.symbol

"""The halo conv (kernels/conv_halo.cu) against the cp.async im2col conv (conv_pipe.cu), both run on the
CPU by tests/emu/simt.h (see tests/test_conv_pipe_emulated.py, whose emulation and problems this
reuses). With one channel chunk (Cin == BK) both kernels sum the same terms in the same order, so
they must agree bit for bit; with several chunks the halo conv sums chunk-major (another order of
the same fp32 terms): agreement within the output dtype's rounding. Cases cover whole-row and
row-part tiles, a ragged last tile (TH not dividing H), up2, fused GroupNorm (padding must stay 0
after normalizing), the residual K segment, split-K across a chunk boundary, bf16. The row tiles
(conv_gemm_halo_rows) sum chunk by chunk, taps in (kx, ky) order: within the output's rounding."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jetson_unet.ops.conv_halo import ConvGeom, HALO_SMEM_LIMIT, halo_problems, rows_problems
from jetson_unet.ops.keys import FEATURES
from jetson_unet.ops.specs import op_spec
from tests.emulated.test_conv_pipe_emulated import (Problem, assert_same_bits, build_lib, key, own_features,
                                                    reference_run, values)

pytestmark = pytest.mark.slow


def halo(k):
    return dataclasses.replace(k, halo=True)


def rows(bm, bn, wm, wn, stages=2, dtype="fp16", fold=False):
    return dataclasses.replace(key(bm, bn, 16, stages=stages, dtype=dtype, wm=wm, wn=wn, fold=fold),
                               halo=True, rows=True)


# (name, reference key (cp.async im2col), halo key, problem, exact)
CASES = [
    ("one-chunk-norm-tbias-gelu-res", key(64, 64, 32, stages=3), halo(key(64, 64, 32, stages=3)),
     dict(hin=16, cin=32, n=40, cr=0, batch=2, norm=True, tbias=True, act=1, res=True), True),
    ("row-part-tile-bk64", key(32, 32, 64, stages=3), halo(key(32, 32, 64, stages=3)),
     dict(hin=16, cin=64, n=32, cr=0, batch=1, norm=True, act=1), True),
    ("ragged-rows-3-per-tile", key(48, 64, 32, stages=3, wm=1, wn=2), halo(key(48, 64, 32, stages=3, wm=1, wn=2)),
     dict(hin=16, cin=32, n=64, cr=0, batch=1, norm=True), True),
    ("one-chunk-residual-conv-split", key(64, 32, 32, stages=3), halo(key(64, 32, 32, stages=3)),
     dict(hin=8, cin=32, n=32, cr=24, batch=2, norm=True, splits=3), True),
    ("chunks-norm-residual-conv", key(64, 32, 32, stages=3), halo(key(64, 32, 32, stages=4)),
     dict(hin=8, cin=96, n=32, cr=40, batch=2, norm=True), False),
    ("chunks-split-across-chunks", key(32, 64, 32, stages=3), halo(key(32, 64, 32, stages=3)),
     dict(hin=8, cin=64, n=64, cr=0, batch=1, norm=True, act=1, splits=4), False),
    ("up2-chunks", key(32, 64, 32, up=2), halo(key(32, 64, 32, up=2, stages=2)),
     dict(hin=8, cin=64, n=48, cr=0, batch=2), False),
    ("bf16-8-warps", key(128, 64, 32, stages=3, dtype="bf16", wm=4, wn=2),
     halo(key(128, 64, 32, stages=3, dtype="bf16", wm=4, wn=2)),
     dict(hin=16, cin=64, n=64, cr=0, batch=1, norm=True, tbias=True, res=True), False),
    # the row tiles: one warp across a 16-pixel row, two across 32; 2 and 3 stages; the GroupNorm as a
    # table and folded; the residual K segment and the epilogue residual; fp16 and bf16
    ("rows-table-norm-tbias-gelu-res", key(64, 32, 32, stages=3), rows(64, 32, 1, 1),
     dict(hin=16, cin=32, n=32, cr=0, batch=2, norm=True, tbias=True, act=1, res=True), False),
    ("rows-16-channel-warps-gelu-res", key(64, 32, 32, stages=3), rows(64, 32, 1, 2),
     dict(hin=16, cin=32, n=32, cr=0, batch=2, norm=True, tbias=True, act=1, res=True), False),
    ("rows-folded-residual-conv", key(64, 64, 32, stages=3, fold=True), rows(64, 64, 1, 2, fold=True),
     dict(hin=16, cin=48, n=64, cr=32, batch=1, norm=True), False),
    ("rows-32-wide-3-stages", key(128, 32, 32, stages=3), rows(128, 32, 2, 1, stages=3),
     dict(hin=32, cin=32, n=64, cr=0, batch=1, norm=True, act=1), False),
    ("rows-bf16-residual-no-norm", key(64, 32, 32, stages=3, dtype="bf16"), rows(64, 32, 2, 1, dtype="bf16"),
     dict(hin=32, cin=16, n=32, cr=16, batch=2), False),
]


@pytest.fixture(scope="module")
def emu_lib(tmp_path_factory):
    return build_lib([k for c in CASES for k in c[1:3]], tmp_path_factory.mktemp("emu-halo"))


def test_halo_geometry_checks():
    g = ConvGeom(cin=96, cr=0, wout=16, norm=True)
    assert halo_problems(halo(key(64, 64, 32, stages=3)), g) == []
    assert any("multiple of BK" in p for p in halo_problems(halo(key(64, 64, 64, stages=3)), g))
    assert any("whole rows" in p for p in halo_problems(halo(key(64, 64, 32, stages=3)),
                                                            dataclasses.replace(g, wout=12)))
    assert any("3x3" in p for p in halo_problems(halo(key(64, 64, 32, kh=1, stages=3)), g))
    assert rows_problems(rows(64, 64, 1, 2), g) == []
    assert any("warps across a row" in p for p in rows_problems(rows(64, 64, 2, 2), g))
    assert any("divide" in p for p in rows_problems(rows(48, 64, 1, 2), g))
    assert any("16-channel" in p for p in rows_problems(rows(64, 64, 1, 2), dataclasses.replace(g, cin=40)))
    # the row tiles store without bounds tests (conv.cu conv_finish, WHOLE 2): BN must divide N
    assert rows_problems(rows(64, 64, 1, 2), dataclasses.replace(g, cout=128)) == []
    assert any("output channels" in p for p in rows_problems(rows(64, 64, 1, 2), dataclasses.replace(g, cout=96)))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_halo_conv_matches_im2col_conv(emu_lib, case):
    name, ref_key, halo_key, shape, exact = case
    geom = ConvGeom(shape["cin"], shape["cr"], shape["hin"] * ref_key.up, shape.get("norm", False), shape["n"])
    assert halo_problems(halo_key, geom) == [], name
    prob = Problem(ref_key, **shape)
    want_out, want_st = prob.run(emu_lib, ref_key)
    got_out, got_st = prob.run(emu_lib, halo_key)
    got, want = values(got_out, halo_key.dtype), values(want_out, ref_key.dtype)
    assert not np.isnan(want).any(), "reference kernel left outputs unwritten"
    assert not np.isnan(got).any(), f"{halo_key.symbol} left {np.isnan(got).sum()} outputs unwritten"
    if exact:
        diff = np.argwhere(got_out != want_out)
        assert diff.size == 0, f"{halo_key.symbol}: {len(diff)} outputs differ, first at {diff[:4].tolist()}"
        assert np.array_equal(got_st, want_st, equal_nan=True), "GroupNorm partials differ"
    else:
        # another fp32 summation order, then one rounding to the 16-bit output: a few ulps at most
        ulp = 2.0 ** -10 if halo_key.dtype == "fp16" else 2.0 ** -7
        tol = 4 * ulp * np.abs(want).max()
        err = np.abs(got - want).max()
        assert err <= tol, f"{halo_key.symbol}: max |diff| {err:.3g} > {tol:.3g}"
        np.testing.assert_allclose(got_st[..., :2], want_st[..., :2], rtol=1e-3, atol=1e-2 * np.abs(want).max())


# the halo and row tiles compiled for their op's own features (compile-time activation: one pass per
# output pair; the row tiles' quad-transposed 16-byte stores) against the generic instance (split-K:
# every feature, the activation a runtime value, two passes)
HALO_FEAT_CASES = [(name, hk, dataclasses.replace(hk, feat=own_features(shape)), shape)
                   for name, _, hk, shape, _ in CASES if own_features(shape) != FEATURES]


@pytest.fixture(scope="module")
def feat_lib(tmp_path_factory):
    return build_lib([k for _, full, own, _ in HALO_FEAT_CASES for k in (full, own)],
                     tmp_path_factory.mktemp("emu-halo-feat"))


@pytest.mark.parametrize("case", HALO_FEAT_CASES, ids=[c[0] for c in HALO_FEAT_CASES])
def test_halo_own_features_equal_generic_bit_for_bit(feat_lib, case):
    _, full, own, shape = case
    prob, want = reference_run(feat_lib, full, shape, "every-feature")
    assert_same_bits(prob.run(feat_lib, own), want, f"{own.symbol} against {full.symbol}")


@pytest.mark.parametrize("kind", ["halo", "rows", "k slices", "gate", "sub-pixel"])
def test_every_halo_sliced_or_gate_candidate_compiles_for_sm87_without_spills(ptxas87, kind):
    """The halo tiles, the k-sliced cp.async tiles, the gate tiles (the whole N in one CTA or
    split over 2-4) and the sub-pixel up2 tiles (ops.conv.subpixel) the tuner may pick (default
    config, batch 1 and 16) for Orin's sm_87: no spills (the row tiles: at most ROWS_SPILL_MAX bytes,
    outside the mma loop), and registers that leave two CTAs per SM (the halo conv's smem budget,
    HALO_SMEM_LIMIT, allows two; its row tiles too). Those with a deep ring (deep_ring) have their
    own test, which allows a few bytes of spills (test_conv_pipelined_cpu.py). The kernels: sm87.SETS."""
    from tests.helpers import sm87
    from tests.host.test_conv_pipelined_cpu import ROWS_SPILL_MAX

    for k in sm87.picked(kind):
        if k.tile.halo:
            smem = op_spec(k.op, k.ctx).smem
            assert smem <= HALO_SMEM_LIMIT, (k.key.symbol, smem)
    keys = sm87.keys(kind)
    assert keys and (kind != "gate" or any(k.nsplit for k in keys))
    rep = ptxas87.report(keys)
    for k in keys:
        f = rep[k.symbol]
        assert f["spill"] <= (ROWS_SPILL_MAX if k.rows else 0) and (k.rows or f["stack"] == 0), (k.symbol, f)
        assert f["regs"] * k.threads * 2 <= 65536, (k.symbol, f)

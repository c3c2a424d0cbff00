"""The depthwise conv (kernels/dwconv.cu) run on the CPU by tests/emu/simt.h (see
tests/test_conv_pipe_emulated.py), against the NumPy reference's depthwise conv2d + bias + time bias
in float64, and its GroupNorm partials against the same tiles summed in float64. Cases: 16-byte and
scalar loads, fp16 / bf16 / fp32, views of a concat buffer on both sides (pixel stride > C, an
offset channel window), a ragged last row and column tile, a ragged last channel tile, two
samples with different timesteps; tiles 8 and 4 outputs wide (dwconv_tw); one and two channels
per thread (dwconv_cp: 16-row tiles of 256 threads and 8-row ones of 128, an fp32 halo); the
tensor-core kernel (dwconv_tc: 16 x 16
tiles, ragged ones too, against weights rounded as it rounds them). Outputs are NaN-poisoned: every
element the kernel owns must be written, and nothing outside its channel window may be."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from jetson_unet.ops.common import cdiv, from_device, to_device
from jetson_unet.ops.dwconv import DW_CC, DW_TC_TILE, DW_THREADS, DW_TILE, pack_dw_tc
from jetson_unet.ops.keys import SimpleKey
from jetson_unet.model.reference import conv2d
from tests.emulated.test_conv_pipe_emulated import kernel_lib, macro_params, values

pytestmark = pytest.mark.slow

# (name, dtype, vec, tile width, shape): H, W, C, batch, input pixel stride / channel offset, output
# stride / offset
CASES = [
    ("fp16-v8-views-ragged", "fp16", 8, 8, dict(h=12, w=10, c=40, batch=2, ldx=56, x0=8, ldo=48, o0=8, tbias=True)),
    ("fp16-v8-w4-views-ragged", "fp16", 8, 4, dict(h=12, w=10, c=40, batch=2, ldx=56, x0=8, ldo=48, o0=8,
                                                  tbias=True)),
    ("fp16-scalar-odd-channels", "fp16", 1, 8, dict(h=9, w=9, c=13, batch=1, ldx=13, x0=0, ldo=16, o0=3, tbias=False)),
    ("bf16-v8", "bf16", 8, 8, dict(h=8, w=16, c=64, batch=2, ldx=64, x0=0, ldo=64, o0=0, tbias=True)),
    ("bf16-v8-w4", "bf16", 8, 4, dict(h=8, w=16, c=64, batch=2, ldx=64, x0=0, ldo=64, o0=0, tbias=True)),
    ("fp32-v4-two-channel-tiles", "fp32", 4, 8, dict(h=11, w=13, c=36, batch=1, ldx=40, x0=4, ldo=36, o0=0,
                                                     tbias=True)),
    ("fp32-v4-w4-two-channel-tiles", "fp32", 4, 4, dict(h=11, w=13, c=36, batch=1, ldx=40, x0=4, ldo=36, o0=0,
                                                        tbias=True)),
    ("fp16-v8-pairs-views-ragged", "fp16", 8, 8, dict(h=19, w=10, c=40, batch=2, ldx=56, x0=8, ldo=48, o0=8,
                                                     tbias=True, cp=2)),
    ("fp16-v4-pairs-partial-channel-tile", "fp16", 4, 8, dict(h=17, w=9, c=12, batch=1, ldx=12, x0=0, ldo=12, o0=0,
                                                            tbias=True, cp=2)),
    ("bf16-v8-pairs", "bf16", 8, 8, dict(h=16, w=16, c=64, batch=2, ldx=64, x0=0, ldo=64, o0=0, tbias=True, cp=2)),
    ("fp32-v4-pairs-two-channel-tiles", "fp32", 4, 8, dict(h=11, w=13, c=36, batch=1, ldx=40, x0=4, ldo=36, o0=0,
                                                           tbias=False, cp=2)),
    # channel pairs in 8-row tiles (dwconv_rows: maps of < 16 rows): the 8x8 level, a ragged row and
    # column tile, a partial channel tile, views
    ("fp16-v8-pairs-h8", "fp16", 8, 8, dict(h=8, w=8, c=64, batch=2, ldx=64, x0=0, ldo=64, o0=0, tbias=True,
                                            cp=2, th=8)),
    ("bf16-v8-pairs-h8-views-ragged", "bf16", 8, 8, dict(h=11, w=10, c=40, batch=2, ldx=56, x0=8, ldo=48, o0=8,
                                                         tbias=True, cp=2, th=8)),
    ("fp32-v4-pairs-h8-partial-channel-tile", "fp32", 4, 8, dict(h=8, w=8, c=12, batch=1, ldx=12, x0=0, ldo=12, o0=0,
                                                                  tbias=False, cp=2, th=8)),
    # dwconv_tc (tw 16; cp = channels per warp, 8 cp per CTA): 16 x 16 tiles; a ragged row and column
    # tile and a partial channel tile; views
    ("fp16-tc4-views-ragged", "fp16", 8, 16, dict(h=20, w=18, c=40, batch=2, ldx=56, x0=8, ldo=48, o0=8, tbias=True,
                                                  tc=True, cp=4)),
    ("bf16-tc4", "bf16", 8, 16, dict(h=16, w=32, c=64, batch=2, ldx=64, x0=0, ldo=64, o0=0, tbias=True, tc=True, cp=4)),
    ("fp16-tc4-no-tbias", "fp16", 8, 16, dict(h=16, w=16, c=32, batch=1, ldx=32, x0=0, ldo=32, o0=0, tbias=False,
                                              tc=True, cp=4)),
    ("fp16-tc2-views-ragged", "fp16", 8, 16, dict(h=17, w=16, c=24, batch=2, ldx=40, x0=8, ldo=32, o0=0, tbias=True,
                                                  tc=True, cp=2)),
    ("bf16-tc1", "bf16", 8, 16, dict(h=16, w=20, c=24, batch=1, ldx=24, x0=0, ldo=24, o0=0, tbias=True, tc=True, cp=1)),
]
K = 7


def dw_key(dtype: str, vec: int, tw: int, cp: int = 1, tc: bool = False, th: int = 0) -> SimpleKey:
    return SimpleKey("dwconv_tc" if tc else "dwconv", dtype, K, vec, tw, cp, th)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return kernel_lib("dwconv.cu", [dw_key(dt, v, tw, s.get("cp", 1), s.get("tc", False), s.get("th", 0))
                                    for _, dt, v, tw, s in CASES],
                      "DW_PARAMS", "DW_ARGS",
                      tmp_path_factory.mktemp("emu-dw"))


def poison(shape, dtype: str) -> np.ndarray:
    if dtype == "fp32":
        return np.full(shape, np.nan, dtype=np.float32)
    return np.full(shape, 0x7E00 if dtype == "fp16" else 0x7FC0, dtype=np.uint16)


def as_float(a: np.ndarray, dtype: str) -> np.ndarray:
    return a.astype(np.float64) if dtype == "fp32" else values(a, dtype).astype(np.float64)


@pytest.mark.parametrize("scaled", [False, True], ids=["", "oscale"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_dwconv_matches_reference(lib, case, scaled):
    """scaled: channel c stored times oscale[c] (the next conv folds its GroupNorm), the statistics
    still those of the unscaled outputs."""
    name, dt, vec, tw, s = case
    rng = np.random.default_rng(7)
    b, h, w, c = s["batch"], s["h"], s["w"], s["c"]
    xbuf = to_device(rng.standard_normal((b, h, w, s["ldx"])), dt)   # the whole concat buffer
    if dt == "fp16":
        xbuf = xbuf.view(np.uint16)
    wt = (rng.standard_normal((c, 1, K, K)) / K).astype(np.float32)
    bias = rng.standard_normal(c).astype(np.float32)
    tb = rng.standard_normal((5, c)).astype(np.float32)
    t_idx = np.array([3, 1][:b], dtype=np.int32)
    out = poison((b, h, w, s["ldo"]), dt)
    cp, tc = s.get("cp", 1), s.get("tc", False)
    th, cc = (DW_TC_TILE, 8 * cp) if tc else (s.get("th") or DW_TILE * cp, DW_CC)   # rows, channels per CTA
    threads = DW_THREADS if tc else DW_CC // cp * th
    tiles_x, tiles_y, ctiles = cdiv(w, tw), cdiv(h, th), cdiv(c, cc)
    st = np.full((b, ctiles * tiles_y * tiles_x, 4), np.nan, dtype=np.float32)
    wk = pack_dw_tc(wt, K, dt) if tc else np.ascontiguousarray(wt.reshape(c, K * K).T)
    x0, o0 = s["x0"], s["o0"]
    esize = 4 if dt == "fp32" else 2

    def ptr(a, off=0):   # the address of element `off` of a (the channel window's first)
        return ctypes.c_void_p(a.ctypes.data + off * esize)

    osc = (0.5 + rng.random(c)).astype(np.float32)
    args = [ptr(xbuf, x0), h, w, c, s["ldx"], ptr(wk), ptr(bias), ptr(tb) if s["tbias"] else ctypes.c_void_p(0),
            c, ptr(t_idx) if s["tbias"] else ctypes.c_void_p(0), ptr(out, o0), s["ldo"], ptr(st),
            ptr(osc) if scaled else ctypes.c_void_p(0)]
    cargs = [a if kind == "p" else ctypes.c_int(a) for kind, a in zip(macro_params("dwconv.cu", "DW_PARAMS"), args)]
    getattr(lib, "emu_" + dw_key(dt, vec, tw, cp, tc, s.get("th", 0)).symbol)(tiles_x * tiles_y, ctiles, b, threads,
                                                                             *cargs)

    x = as_float(xbuf[..., x0:x0 + c], dt).transpose(0, 3, 1, 2)
    # dwconv_tc rounds its weights to the activation dtype (as the GEMM convs): its reference does too
    w_ref = from_device(to_device(wt, dt), dt) if tc else wt
    want = conv2d(x, w_ref.astype(np.float64), bias.astype(np.float64), groups=c)
    if s["tbias"]:
        want = want + tb[t_idx].astype(np.float64)[:, :, None, None]
    want = want.transpose(0, 2, 3, 1)
    got_all = as_float(out, dt)
    got = got_all[..., o0:o0 + c] / (osc if scaled else 1.0)
    assert not np.isnan(got).any(), f"{name}: {np.isnan(got).sum()} outputs unwritten"
    outside = np.delete(got_all, np.s_[o0:o0 + c], axis=3)
    assert np.isnan(outside).all(), f"{name}: wrote outside its channel window"
    # fp32 sums of 49 terms, then one rounding to the output dtype
    tol = {"fp32": 1e-5, "fp16": 2.0 ** -10, "bf16": 2.0 ** -7}[dt] * 2 * np.abs(want).max()
    err = np.abs(got - want).max()
    assert err <= tol, f"{name}: max error {err:.3g} > {tol:.3g}"

    # GroupNorm partials: per CTA tile {count, sum, M2 about the tile mean} of the fp32 values
    for bb in range(b):
        for ct in range(ctiles):
            for ty in range(tiles_y):
                for tx in range(tiles_x):
                    blk = want[bb, ty * th:ty * th + th, tx * tw:tx * tw + tw, ct * cc:ct * cc + cc]
                    n, sm, m2, _ = st[bb, (ct * tiles_y + ty) * tiles_x + tx]
                    assert n == blk.size
                    assert np.isclose(sm, blk.sum(), rtol=1e-4, atol=1e-3 * blk.size ** 0.5)
                    assert np.isclose(m2, ((blk - blk.mean()) ** 2).sum(), rtol=1e-3)


def test_every_depthwise_instantiation_compiles_for_sm87_without_spills(ptxas87):
    """Each (dtype, vector, width, channels per thread) the host can pick, through ptxas for the
    Orin's sm_87: no spills, and channel pairs at 64 registers where they need 4 CTAs per SM."""
    keys = [SimpleKey("dwconv", dt, K, v, tw, cp) for dt, vecs in (("fp16", (8, 4, 1)), ("bf16", (8, 4, 1)), ("fp32", (4, 1)))
            for v in vecs for tw, cp in ((8, 1), (4, 1), (8, 2)) if cp == 1 or v > 1]
    keys += [SimpleKey("dwconv_tc", dt, K, 8, DW_TC_TILE, cpw) for dt in ("fp16", "bf16") for cpw in (1, 2, 4)]
    rep = ptxas87.report(keys)
    for k in keys:
        f = rep[k.symbol]
        assert f["spill"] == 0 and f["stack"] == 0, (k.symbol, f)
        if k.kind == "dwconv" and k.cp == 2 and k.dtype != "fp32" and k.n == 8:
            assert f["regs"] <= 64, (k.symbol, f)

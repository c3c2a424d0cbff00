"""The cp.async conv (kernels/conv_pipe.cu) against the stock one (conv.cu's conv_gemm), both run on
the CPU by tests/emu/simt.h: the kernel files compiled by g++ with only their inline-PTX helpers
(ldmatrix, mma.sync, cvt, cp.async) swapped for emulations. Same GEMM, same mma order over k: the
outputs and GroupNorm partials must agree bit for bit, for every feature the kernels share
(3x3/2x2/1x1, unshuffle2, fused norm, residual K segment, time bias, GELU, identity residual,
split-K, gate, ragged M and N, 2..4 stages, BK 32/64). One case also checks the stock kernel's
emulation against NumPy, so the emulator itself is tested. No GPU needed; skipped without g++."""
from __future__ import annotations

import ctypes
import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from jetson_unet.paths import kernels_dir
from jetson_unet.ops.common import cdiv, from_device, padded, round_up, to_device
from jetson_unet.ops.conv import fold_table, fold_weights, gemm_workspace, pack_gemm, pack_subpixel
from jetson_unet.ops.keys import FEATURES, ConvKey

pytestmark = pytest.mark.slow
EMU = Path(__file__).parent / "emu" / "simt.h"

F16_EMU = """struct F16 {
    typedef u16 S;
    static const bool TC = true;
    static float to_f(u16 v) { return emu_h2f(v); }
    static u16 from_f(float f) { return emu_f2h(f); }
    static u16 fma1(u16 a, u16 b, u16 c) { return emu_fma16<emu_h2f, emu_f2h>(a, b, c); }
    static u32 fma2(u32 a, u32 b, u32 c) { return emu_fma16x2<emu_h2f, emu_f2h>(a, b, c); }
    static const u32 ONE2 = 0x3C003C00u;
    static void mma(float c[4], const u32 a[4], const u32 b[2]) { emu_mma<emu_h2f>(c, a, b); }
};"""
BF16_EMU = (F16_EMU.replace("F16", "BF16").replace("emu_h2f", "emu_b2f").replace("emu_f2h", "emu_f2b")
            .replace("0x3C003C00u", "0x3F803F80u"))
CP_EMU = """inline void cp_async16(saddr smem, const void *gmem, bool full) { emu_cp_async16((void *)smem, gmem, full); }
inline void cp_async_commit() { emu_commit(); }
template <int N> inline void cp_async_wait() { emu_wait(N); }

"""


def sub1(pattern: str, repl: str, text: str) -> str:
    out, n = re.subn(pattern, lambda _: repl, text, count=1, flags=re.S)
    assert n == 1, f"emulation: {pattern!r} not found in the kernel source"
    return out


def emu_source(keys) -> str:
    k = kernels_dir()
    common = (k / "common.cuh").read_text()
    common = sub1(r"struct F16 \{.*?\n\};", F16_EMU, common)
    common = sub1(r"struct BF16 \{.*?\n\};", BF16_EMU, common)
    common = sub1(r"typedef u32 saddr;", "typedef uintptr_t saddr;", common)   # host pointers
    common = sub1(r"__device__ __forceinline__ saddr smem_u32\(.*?\n\}",
                  "inline saddr smem_u32(const void *p) { return (saddr)p; }", common)
    common = sub1(r"__device__ __forceinline__ void ldmatrix_x4\(.*?\n\}",
                  "inline void ldmatrix_x4(u32 r[4], saddr a) { emu_ldmatrix_x4(r, (const void *)a); }", common)
    common = sub1(r"__device__ __forceinline__ void ldmatrix_x2\(.*?\n\}",
                  "inline void ldmatrix_x2(u32 r[2], saddr a) { emu_ldmatrix_x2(r, (const void *)a); }", common)
    common = sub1(r"__device__ __forceinline__ int atomic_add_acq_rel\(.*?\n\}",
                  "inline int atomic_add_acq_rel(int *p, int v) { return emu_atomic_add_acq_rel(p, v); }", common)
    conv = sub1(r"extern __shared__ __align__\(16\) float dyn_smem\[\];", "", (k / "conv.cu").read_text())
    pipe = sub1(r"__device__ __forceinline__ void cp_async16\(.*?(?=template <class)", CP_EMU,
                (k / "conv_pipe.cu").read_text())
    halo = (k / "conv_halo.cu").read_text()
    wrap = ("#define EMU_WRAP(name) extern \"C\" void emu_##name(int gx, int gy, int gz, int nt, CONV_PARAMS) "
            "{ emu_launch([&] { name(CONV_ARGS); }, gx, gy, gz, nt); }")
    lines = [key.instance() for key in keys] + [f"EMU_WRAP({key.symbol})" for key in keys]
    return "\n".join([f'#include "{EMU}"', common, conv, pipe, halo, wrap] + lines) + "\n"


def values(bits: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values of a 16-bit output buffer (held as uint16 bit patterns)."""
    return bits.view(np.float16).astype(np.float32) if dtype == "fp16" else from_device(bits, dtype)


def key(bm, bn, bk, kh=3, st=1, up=1, gate=False, stages=0, dtype="fp16", wm=2, wn=2, ks=1, nsplit=False,
        fold=False, feat=FEATURES):
    """An instantiation; by default for every op feature (keys.FEATURES), which on the emulator (no
    assumptions) runs the arguments as given: the generic kernel. test_features_fold_away checks
    an op's own features against it."""
    return ConvKey(dtype, bm, bn, bk, wm, wn, kh, st, up, 8, gate, stages, ks=ks, nsplit=nsplit, fold=fold, feat=feat)


# (name, stock key, pipelined keys, shape). Shapes: Hin, Cin, N, Cr (residual K segment), batch,
# and which epilogue features are on.
CASES = [
    # deep rings (deep_ring: past 40 KB, in dynamic smem after the GroupNorm table): 64x64x64 s3 here
    # and below, 128x128x32 s3 over 8 warps, 32x64x64 s4 (up2, gate)
    ("3x3-norm-tbias-gelu-res", key(64, 64, 32), [key(64, 64, 32, stages=3), key(64, 64, 64, stages=2),
                                                 key(64, 64, 32, stages=4), key(64, 64, 64, stages=3)],
     dict(hin=12, cin=32, n=40, cr=0, batch=2, norm=True, tbias=True, act=1, res=True)),
    ("3x3-deep-ring-128x128", key(128, 128, 32, wm=4, wn=2), [key(128, 128, 32, stages=3, wm=4, wn=2)],
     dict(hin=12, cin=32, n=136, cr=0, batch=2, norm=True, tbias=True, act=1)),
    ("unshuffle2", key(64, 32, 64, kh=2, st=2), [key(64, 32, 64, kh=2, st=2, stages=3)],
     dict(hin=16, cin=8, n=32, cr=0, batch=1)),
    ("1x1-bf16-128x64", key(128, 64, 32, kh=1, dtype="bf16"), [key(128, 64, 32, kh=1, dtype="bf16", stages=3)],
     dict(hin=16, cin=48, n=64, cr=0, batch=1, norm=True, act=1)),
    ("split-k", key(64, 64, 32), [key(64, 64, 32, stages=3), key(64, 64, 64, stages=3)],
     dict(hin=8, cin=64, n=64, cr=16, batch=2, norm=True, splits=3)),
    ("gate", key(32, 64, 32, kh=1, gate=True), [key(32, 64, 32, kh=1, gate=True, stages=3),
                                                key(32, 64, 64, kh=1, gate=True, stages=4)],
     dict(hin=10, cin=40, n=40, cr=24, batch=2, gate=True)),
]

# k slices (ConvKey.ks): the same GEMM summed in another order (each slice's k steps, then the
# slices), so equal to the stock kernel within the output's rounding, not bit for bit. Cases: the
# batch-1 tile (32x32x64, 2 slices), spare B-copy threads (32x32x32: 128 vectors, 256 threads), 4
# slices, split-K on top, the gate (with its N split over 2-3 CTAs too), bf16.
SLICE_CASES = [
    ("3x3-norm-tbias-gelu-res", key(64, 64, 32), [key(32, 32, 64, stages=3, ks=2), key(32, 32, 32, stages=3, ks=2),
                                                 key(32, 64, 64, stages=3, ks=4), key(64, 64, 32, stages=4, ks=2)],
     dict(hin=12, cin=32, n=40, cr=0, batch=2, norm=True, tbias=True, act=1, res=True)),
    ("split-k", key(64, 64, 32), [key(32, 32, 64, stages=3, ks=2), key(64, 64, 32, stages=3, ks=2),
                                  key(64, 64, 64, stages=3, ks=2)],
     dict(hin=8, cin=64, n=64, cr=16, batch=2, norm=True, splits=3)),
    ("gate", key(32, 64, 32, kh=1, gate=True), [key(32, 64, 32, kh=1, gate=True, stages=3, ks=2)],
     dict(hin=10, cin=40, n=40, cr=24, batch=2, gate=True)),
    # N split over CTAs (psi partials summed by the last through a ticket: another order as well)
    ("gate-split-n", key(32, 64, 32, kh=1, gate=True), [key(32, 32, 32, kh=1, gate=True, nsplit=True),
                                                        key(32, 32, 32, kh=1, gate=True, stages=3, nsplit=True)],
     dict(hin=10, cin=40, n=40, cr=24, batch=2, gate=True)),
    ("gate-split-n-and-k", key(32, 128, 32, kh=1, gate=True, wm=1, wn=4),
     [key(32, 32, 32, kh=1, gate=True, nsplit=True), key(64, 64, 32, kh=1, gate=True, stages=3, ks=2, nsplit=True)],
     dict(hin=9, cin=72, n=72, cr=40, batch=2, gate=True, splits=2)),
    ("1x1-bf16", key(128, 64, 32, kh=1, dtype="bf16"), [key(32, 64, 64, kh=1, dtype="bf16", stages=3, ks=2)],
     dict(hin=16, cin=48, n=64, cr=0, batch=1, norm=True, act=1)),
]
# up2 as the cp.async conv's sub-pixel 2x2 convs (kh 2; ops.conv.subpixel_weights) against the stock
# kernel's 3x3 map of the upsampled input: the same conv with the taps that meet one input pixel
# summed into one weight before rounding, so equal within the 16-bit rounding of weights and output.
# Cases: tiles of one and of several per parity class (BM 64 = all 64 pixels of an 8x8 input, BM 32),
# ragged N, GroupNorm, time bias and GELU, split-K, k slices, bf16.
SUB_CASES = [
    ("up2-norm-tbias-gelu", key(32, 64, 64, up=2),
     [key(64, 64, 64, kh=2, up=2, stages=3), key(32, 64, 32, kh=2, up=2, stages=4),
      key(32, 32, 64, kh=2, up=2, stages=3, ks=2)],
     dict(hin=8, cin=16, n=40, cr=0, batch=2, norm=True, tbias=True, act=1)),
    ("up2-split-k", key(32, 64, 64, up=2), [key(32, 64, 64, kh=2, up=2, stages=3)],
     dict(hin=8, cin=64, n=64, cr=0, batch=1, splits=3)),
    ("up2-bf16", key(64, 32, 32, up=2, dtype="bf16"), [key(32, 32, 64, kh=2, up=2, stages=3, dtype="bf16")],
     dict(hin=8, cin=24, n=32, cr=0, batch=2, act=1)),
]
# Relative to the output's largest magnitude: the weights' and the output's rounding (fp16 2^-11, bf16
# 2^-8 each), over sums of ~100-600 products of unit-variance terms.
SUB_TOL = {"fp16": 4e-3, "bf16": 3e-2}

# Output tolerance of a k-sliced kernel against the stock one: the fp32 sums differ by a few fp32
# roundings, which can move a 16-bit output by one unit in the last place (fp16 2^-10, bf16 2^-7,
# relative) where the value sits near a rounding boundary; nothing else may move.
SLICE_RTOL = {"fp16": 2.0 ** -10, "bf16": 2.0 ** -7}


def compile_emu(source: str, d: Path, opts=("-O1",)) -> ctypes.CDLL:
    """An emulated-kernel source compiled by g++ into a shared library in folder d (skips without a
    g++ that has _Float16 and <barrier>)."""
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no g++")
    (d / "emu.cpp").write_text(source)
    cmd = [cxx, "-std=c++20", *opts, "-fno-strict-aliasing", "-pthread", "-shared", "-fPIC", "-w",
           f"-I{kernels_dir()}", str(d / "emu.cpp"), "-o", str(d / "emu.so")]   # the kernels' #include: guarded
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode and ("_Float16" in r.stderr or "barrier" in r.stderr):
        pytest.skip(f"this g++ lacks _Float16 or <barrier>: {r.stderr[:300]}")
    assert r.returncode == 0, r.stderr[-4000:]
    return ctypes.CDLL(str(d / "emu.so"))


def kernel_lib(file: str, keys, params: str, args: str, d: Path) -> ctypes.CDLL:
    """The instantiations `keys` (SimpleKey) of kernels/<file> on the emulator, each launched by
    emu_<symbol>(gx, gy, gz, nt, <the kernel's parameters>), compiled into folder d."""
    src = (kernels_dir() / file).read_text().replace("extern __shared__ __align__(16) float dyn_smem[];", "")
    wrap = (f"#define EMU_KERNEL(name) extern \"C\" void emu_##name(int gx, int gy, int gz, int nt, {params}) "
            f"{{ emu_launch([&] {{ name({args}); }}, gx, gy, gz, nt); }}")
    keys = sorted(set(keys), key=lambda k: k.symbol)
    return compile_emu("\n".join([emu_source([]), src, wrap] + [k.instance() for k in keys]
                                 + [f"EMU_KERNEL({k.symbol})" for k in keys]) + "\n", d)


def build_lib(keys, d: Path) -> ctypes.CDLL:
    """The emulated kernels of `keys`, compiled into a shared library in folder d (skips without g++)."""
    return compile_emu(emu_source(sorted(set(keys), key=lambda k: k.symbol)), d)


@pytest.fixture(scope="module")
def emu_lib(tmp_path_factory):
    return build_lib([k for _, s, p, _ in CASES + SLICE_CASES + SUB_CASES for k in [s] + p],
                     tmp_path_factory.mktemp("emu"))


def macro_params(file: str = "conv.cu", macro: str = "CONV_PARAMS") -> list:
    """The kinds of a kernel parameter-list macro's parameters: "p" pointer, "f" float, "i" int."""
    text = (kernels_dir() / file).read_text()
    body = re.search(rf"#define {macro}\s*\\?\n?(.*?)\n#define", text, re.S).group(1)
    params = [p.strip() for p in body.replace("\\", " ").split(",")]
    return ["p" if "*" in p else ("f" if p.startswith("float") else "i") for p in params]


class Problem:
    """Random inputs of one case, in the kernels' layouts (NHWC, 16-bit bit patterns)."""

    def __init__(self, k: ConvKey, hin, cin, n, cr, batch, norm=False, tbias=False, act=0, res=False,
                 splits=1, gate=False, seed=0, mean_off=0.0, gn_b_scale=0.1):
        rng = np.random.default_rng(seed)
        self.k, self.batch, self.cin, self.n, self.cr, self.splits = k, batch, cin, n, cr, splits
        self.hin = hin
        self.hout = hin * k.up // k.stride
        self.m = self.hout * self.hout
        dt = k.dtype
        self.x = to_device(rng.standard_normal((batch, hin, hin, cin)), dt)
        self.xr = to_device(rng.standard_normal((batch, self.hout, self.hout, max(cr, 8))), dt)
        self.wmat = rng.standard_normal((n, k.kh * k.kh * cin)).astype(np.float32) / np.sqrt(k.kh * k.kh * cin)
        segs = [self.wmat] + ([rng.standard_normal((n, cr)).astype(np.float32)] if cr else [])
        self.norm, self.tbias_on, self.act, self.res_on, self.gate = norm, tbias, act, res, gate
        self.bias = rng.standard_normal(n).astype(np.float32)
        self.tb = rng.standard_normal((5, n)).astype(np.float32)
        self.t_idx = np.array([3, 1][:batch] + [0] * max(0, batch - 2), dtype=np.int32)
        self.gn_w = (1 + 0.1 * rng.standard_normal(cin)).astype(np.float32)
        self.gn_b = (gn_b_scale * rng.standard_normal(cin)).astype(np.float32)
        parts = np.zeros((batch, 4, 4), dtype=np.float32)   # 4 partials per sample: n, sum, M2
        parts[..., 0] = 50.0
        parts[..., 1] = rng.standard_normal((batch, 4)) * 20 + 50.0 * mean_off   # mean ~ mean_off
        parts[..., 2] = 40.0 + rng.random((batch, 4)) * 20
        self.gn_part = parts
        self.res = to_device(rng.standard_normal((batch, self.hout, self.hout, n)), dt)
        self.psi = rng.standard_normal(n).astype(np.float32)
        self.segs = segs

    def run(self, lib, k: ConvKey, oscale=None):
        """The kernel of `k` on this problem; k.fold: with the GroupNorm folded into the GEMM
        (fold_weights / fold_table, as the executor prepares it) instead of the table, its input as
        the producer stores it then (gn_w * x, rounded); oscale: the outputs' per-channel factor
        (feature o, padded to Npad)."""
        segs, bias, fold, x = self.segs, self.bias, k.fold, self.x
        if fold:
            bias = fold_weights(segs[0], bias, self.gn_b)
            x = to_device(values(self.x, k.dtype).astype(np.float64) * self.gn_w, k.dtype)
        if k.subpixel:   # sub-pixel: the problem's 3x3 weights (K ordered ky, kx, c) per parity
            w3 = self.wmat.reshape(self.n, 3, 3, self.cin).transpose(0, 3, 1, 2)
            w, ldw, nks = pack_subpixel(k.dtype, k.bn, k.bk, w3)
        else:
            w, ldw, nks = pack_gemm(k.dtype, k.bn, k.bk, segs)
        fold_blob = fold_table(w, k.dtype, nks[0] * k.bk, self.cin, self.gn_w, self.gn_b) if fold else None
        npad = round_up(self.n, k.bn)
        mtiles, ntiles = cdiv(self.m, k.bm), cdiv(self.n, k.bn)
        out_c = self.cr if self.gate else self.n
        out = np.full((self.batch, self.hout, self.hout, out_c), 0x7E00, dtype=np.uint16)   # NaN
        st_part = np.full((self.batch, mtiles * ntiles, 4), np.nan, dtype=np.float32)
        n_ws, n_ctr = gemm_workspace(self.batch, mtiles, ntiles, self.splits, k.bm, k.bn, k.gate)
        ws = np.zeros(max(n_ws, 1), dtype=np.float32)
        counters = np.zeros(max(n_ctr, 1), dtype=np.int32)
        keep = []

        def p(a):
            if a is None:
                return ctypes.c_void_p(0)
            a = np.ascontiguousarray(a)
            keep.append(a)
            return ctypes.c_void_p(a.ctypes.data)

        args = [p(x), self.hin, self.hin, self.cin, self.cin, p(self.xr if self.cr else None), self.cr,
                self.xr.shape[-1], p(w), ldw, nks[0], nks[1] if len(nks) > 1 else 0,
                p(padded(bias, npad)), p(self.tb if self.tbias_on else None), self.n,
                p(self.t_idx if self.tbias_on else None), p(self.gn_w if self.norm and not fold else None),
                p(self.gn_b if self.norm and not fold else None), p(fold_blob),
                p(self.gn_part if self.norm else None), 4, 1e-5,
                p(self.res if self.res_on else None), self.n, out, self.hout, self.hout, self.n, out_c,
                None if self.gate else st_part, self.act, p(padded(self.psi, npad) if self.gate else None),
                0.25, self.splits, p(ws if n_ws else None), p(counters if n_ctr else None),
                p(None if oscale is None else padded(oscale, npad))]
        kinds = macro_params()
        assert len(kinds) == len(args), f"CONV_PARAMS has {len(kinds)} parameters, the test passes {len(args)}"
        cargs = []
        for kind, a in zip(kinds, args):
            if kind == "p":
                cargs.append(a if isinstance(a, ctypes.c_void_p) else
                             ctypes.c_void_p(a.ctypes.data) if a is not None else ctypes.c_void_p(0))
            elif kind == "f":
                cargs.append(ctypes.c_float(a))
            else:
                cargs.append(ctypes.c_int(a))
        fn = getattr(lib, "emu_" + k.symbol)
        fn(ctypes.c_int(mtiles * self.splits), ctypes.c_int(ntiles),
           ctypes.c_int(self.batch), ctypes.c_int(k.threads), *cargs)
        assert not counters.any(), "split-K and gate tickets must be re-armed"
        return out, st_part


def reference_run(lib, k: ConvKey, shape: dict, what: str):
    """The problem of `shape` and the (outputs, partials) of the kernel every other is compared with."""
    prob = Problem(k, **shape)
    want = prob.run(lib, k)
    assert not np.isnan(values(want[0], k.dtype)).any(), f"{what} kernel left outputs unwritten"
    return prob, want


def assert_same_bits(got, want, what: str) -> None:
    """Two runs' (outputs, GroupNorm partials), bit for bit."""
    diff = np.argwhere(got[0] != want[0])
    assert diff.size == 0, f"{what}: {len(diff)} outputs differ, first at {diff[:4].tolist()}"
    assert np.array_equal(got[1], want[1], equal_nan=True), f"{what}: GroupNorm partials differ"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_pipelined_equals_stock_bit_for_bit(emu_lib, case):
    _, stock, pipes, shape = case
    prob, want = reference_run(emu_lib, stock, shape, "stock")
    for k in pipes:
        assert_same_bits(prob.run(emu_lib, k), want, f"{k.symbol} against {stock.symbol}")


def own_features(shape: dict) -> str:
    """The features (keys.FEATURES) of a case's op, as ops.conv.with_features gives them."""
    if shape.get("splits", 1) > 1:
        return FEATURES
    has = {"g": shape.get("act") == 1, "t": shape.get("tbias", False), "n": shape.get("norm", False),
           "k": shape["cr"] > 0, "r": shape.get("res", False), "s": not shape.get("gate"),
           "p": False, "o": False}
    return "".join(c for c in FEATURES if has[c])


FEAT_CASES = [(name, pipes[0], dataclasses.replace(pipes[0], feat=own_features(shape)), shape)
              for name, _, pipes, shape in CASES if own_features(shape) != FEATURES]


@pytest.fixture(scope="module")
def feat_lib(tmp_path_factory):
    return build_lib([k for _, full, own, _ in FEAT_CASES for k in (full, own)], tmp_path_factory.mktemp("emu-feat"))


@pytest.mark.parametrize("case", FEAT_CASES, ids=[c[0] for c in FEAT_CASES])
def test_features_fold_away(feat_lib, case):
    """An instantiation for the op's own features (each absent one a null or constant argument,
    kernels/conv.cu CONV_FEATURE_ARGS) computes what the one for every feature does, bit for bit:
    each feature's bit reaches the argument it stands for."""
    _, full, own, shape = case
    prob, want = reference_run(feat_lib, full, shape, "every-feature")
    assert_same_bits(prob.run(feat_lib, own), want, f"{own.symbol} against {full.symbol}")


@pytest.mark.parametrize("case", SLICE_CASES, ids=[c[0] for c in SLICE_CASES])
def test_k_slices_equal_stock_within_output_rounding(emu_lib, case):
    _, stock, sliced, shape = case
    prob = Problem(stock, **shape)
    want_out, want_st = prob.run(emu_lib, stock)
    want = values(want_out, stock.dtype).astype(np.float64)
    assert not np.isnan(want).any(), "stock kernel left outputs unwritten"
    for k in sliced:
        got_out, got_st = prob.run(emu_lib, k)
        got = values(got_out, k.dtype).astype(np.float64)
        assert not np.isnan(got).any(), f"{k.symbol}: outputs left unwritten"
        err = np.abs(got - want) / np.maximum(np.abs(want), 1e-3)
        assert err.max() <= SLICE_RTOL[k.dtype] * 1.01, (k.symbol, float(err.max()), np.argwhere(err > SLICE_RTOL[k.dtype])[:4])
        assert (got_out != want_out).mean() < 0.05, f"{k.symbol}: {(got_out != want_out).mean():.1%} of outputs moved"
        if not shape.get("gate"):   # GroupNorm statistics: per tile they depend on the tiling; per sample not
            assert np.allclose(merged(got_st), merged(want_st), rtol=1e-4), k.symbol


@pytest.mark.parametrize("case", SUB_CASES, ids=[c[0] for c in SUB_CASES])
def test_subpixel_up2_equals_stock_within_rounding(emu_lib, case):
    """Every output pixel written (the outputs start as NaN: the row map covers each parity class
    once) and equal to the 3x3 map's within the rounding; the GroupNorm statistics per sample too."""
    _, stock, subs, shape = case
    prob, (want_out, want_st) = reference_run(emu_lib, stock, shape, "stock")
    want = values(want_out, stock.dtype).astype(np.float64)
    for k in subs:
        got_out, got_st = prob.run(emu_lib, k)
        got = values(got_out, k.dtype).astype(np.float64)
        assert not np.isnan(got).any(), f"{k.symbol}: {np.isnan(got).sum()} outputs left unwritten"
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err <= SUB_TOL[k.dtype], (k.symbol, err)
        assert np.allclose(merged(got_st), merged(want_st), rtol=SUB_TOL[k.dtype]), k.symbol


def merged(st: np.ndarray) -> np.ndarray:
    """(count, mean, M2) per sample from per-tile (count, sum, M2 about the tile mean) partials."""
    st = st.astype(np.float64)
    cnt, tsum, m2 = st[..., 0], st[..., 1], st[..., 2]
    n = cnt.sum(axis=1)
    mean = tsum.sum(axis=1) / n
    tile_mean = tsum / cnt
    return np.stack([n, mean, (m2 + cnt * (tile_mean - mean[:, None]) ** 2).sum(axis=1)], axis=1)


def test_emulated_stock_kernel_matches_numpy(emu_lib):
    """The emulator itself: a plain 3x3 conv (+ bias) of the stock kernel against NumPy."""
    k = key(64, 64, 32)
    prob = Problem(k, hin=12, cin=32, n=40, cr=0, batch=2)
    out, st = prob.run(emu_lib, k)
    x = prob.x.astype(np.float64)
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    cols = np.stack([xp[:, ky:ky + 12, kx:kx + 12, :] for ky in range(3) for kx in range(3)], axis=3)
    w = to_device(prob.wmat, "fp16").astype(np.float64)
    want = cols.reshape(2, 12, 12, -1) @ w.T + prob.bias
    got = values(out, "fp16")
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 2e-3, err
    tiles = st.reshape(-1, 4)
    assert np.isclose(tiles[:, 0].sum(), 2 * 144 * 40) and np.isclose(tiles[:, 1].sum(), got.sum(), rtol=1e-3)

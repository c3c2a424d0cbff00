"""Per-op launchers: validate an op against what its kernel supports, choose the tile, pack the op's
weights in the layout the kernel reads, and compute grid/block/shared memory and the argument tuple
(pointers as np.uint64, 4-byte scalars as np.int32 / np.float32: CuPy passes a Python int as 8 bytes).

Nothing here touches the GPU: an `OpSpec` is built from the plan and the parameters alone, and its
`make_args(resolver)` turns device addresses (known once the arena and weights are allocated) into
the launch arguments. Kernels: kernels/conv.cu (GEMM conv + gate), dwconv.cu, io.cu, and the
cp.async variant of the GEMM conv, conv_pipe.cu (the default for 16-bit vectorized convs since it
measured 11-15% faster per U-Net call on an H100; $JETSON_UNET_CONV_STAGES=0 restores conv_gemm
everywhere, see stages_from_env).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import ConfigError
from ..plan import CONV, GATE, Op, Plan, Tensor
from .kernels import ConvKey, SimpleKey

VEC_MAX = {"fp32": 4, "fp16": 8, "bf16": 8}          # 16-byte vectors
ELEM_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
SMEM_LIMIT = 48 * 1024                               # static + dynamic without an opt-in
DW_TILE, DW_CC, DW_THREADS = 8, 32, 256              # dwconv.cu (rows and channels of a tile)
INIT_TILE, FINAL_THREADS = 8, 128                    # io.cu
GATE_MAX_N = 256
STAGES_ENV = "JETSON_UNET_CONV_STAGES"              # cp.async ring depth of the GEMM conv (0: off)
DEFAULT_STAGES = 3                                   # docs/perf-notes.md: s3 = s4 > s6 > s0 on an H100
MAX_STAGES = 6
PIPE_RING_LIMIT = 40 * 1024                          # conv_pipe.cu's static smem ring, at most (DEEP_RING)
PIPE_DEEP_LIMIT = 76 * 1024                          # a deeper ring's dynamic smem (+ table): 2 CTAs per sm_87 SM
PIPE_SCRATCH = 3 * 1024                              # its other static smem (reductions, gate, epilogue operands)
GEMM_SCRATCH = 1200                                  # conv_gemm's beside its tiles (red, last, epilogue operands)
HALO_SMEM_LIMIT = 76 * 1024                          # conv_halo.cu's dynamic smem: 2 CTAs per sm_87 SM (164 KB)
FOLD_ENV = "JETSON_UNET_GN_FOLD"                     # 0: GroupNorm as a table pass everywhere (fold_norm)
FOLD_RATIO_MAX = 64.0                                # |gn_b / gn_w| a folded GroupNorm accepts (fold_norm)
DW_TC_ENV = "JETSON_UNET_DW_TC"                      # 0: the FFMA depthwise conv everywhere (dwconv_tc)
HALO_STAGES = 3                                      # conv_halo.cu's weight slots in flight (built-in and tuned)
DW_TC_TILE = 16                                      # dwconv.cu dwconv_tc: 16 x 16 outputs x 8 CPW channels


def P(v: int) -> np.uint64:
    return np.uint64(v)


def I(v: int) -> np.int32:
    return np.int32(v)


def F(v: float) -> np.float32:
    return np.float32(v)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return cdiv(a, b) * b


# ---- host dtype conversion (bf16 has no NumPy dtype: stored as uint16 bit patterns) ------------

def to_device(a: np.ndarray, precision: str) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.float32)
    if precision == "fp32":
        return a
    if precision == "fp16":
        return a.astype(np.float16)
    u = a.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)   # round to nearest even


def from_device(a: np.ndarray, precision: str) -> np.ndarray:
    if precision == "bf16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def storage_dtype(precision: str) -> Any:
    return {"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16}[precision]


# ---- specs ----------------------------------------------------------------------------------------

class Resolver:
    """Device addresses, supplied by the executor once memory is allocated (interface only)."""
    t_idx: Any = None      # a marker the executor swaps per call
    step: Any = None       # a marker: final_conv's sampler-step pointers (xs, noise, step), null unless swapped
    advance: Any = None    # a marker: init_conv's step-advance arguments (kernels/io.cu), null unless swapped
    norm_eps: float = 1e-5

    def tensor(self, name: str) -> Tuple[int, int]: ...          # (ptr, pixel stride ld)
    def blob(self, op: str, key: str) -> int: ...                # packed weights of one op
    def tbias(self, name: str) -> Tuple[int, int]: ...           # (ptr of the column, row stride)
    def stats_out(self, op: str) -> int: ...                     # 0 when nobody reads them
    def stats_in(self, op: Op) -> Tuple[int, int]: ...           # (ptr, partials per sample)
    def workspace(self, op: str) -> int: ...                     # split-K partial tiles


@dataclass
class OpSpec:
    op: Op
    key: Any                                   # ConvKey | SimpleKey
    grid: Tuple[int, int, int]
    block: Tuple[int, int, int]
    smem: int
    blobs: Dict[str, np.ndarray]               # uploaded into the weights allocation
    make_args: Callable[[Resolver], Tuple[Any, ...]]
    stats_parts: int = 0                       # StatPartials per sample it can write
    ws_bytes: int = 0                          # split-K workspace (arena, live during the op only)

    @property
    def symbol(self) -> str:
        return self.key.symbol


@dataclass
class Ctx:
    plan: Plan
    params: Mapping[str, np.ndarray]
    precision: str
    batch: int
    sms: int
    views: Mapping[str, Tuple[int, int]]       # tensor -> (ld, channel offset in its root)
    tile_batch: Optional[int] = None           # batch the tiles are chosen for (None: batch)
    extra_keys: List[Any] = field(default_factory=list)
    conv_stages: int = field(default_factory=lambda: stages_from_env())   # 0: conv_gemm everywhere
    gn_fold: bool = field(default_factory=lambda: fold_from_env())        # fold_norm where it applies
    dw_tc: bool = field(default_factory=lambda: dw_tc_from_env())         # dwconv_tc where it applies
    tiles: Mapping[str, "TileChoice"] = field(default_factory=dict)       # op.out -> measured tile


@dataclass(frozen=True)
class TileChoice:
    """One op's tile, measured instead of guessed (tools/tune_tiles.py): it replaces choose_tile,
    choose_bk, pipe_tile and (splits > 0) choose_splits for that op. Checked by check_key."""
    bm: int
    bn: int
    wm: int
    wn: int
    bk: int
    stages: int = 0      # 0: conv_gemm; n: the cp.async conv with n stages
    splits: int = 0      # 0: choose_splits decides
    halo: int = 0        # 1: the halo conv (kernels/conv_halo.cu) with `stages` weight slots
    ks: int = 1          # k slices of the cp.async conv (ConvKey.ks)
    mt: int = 1          # M tiles per CTA of the cp.async conv (> 1: ConvKey.persist, no split-K)


# ---- tile choice ----------------------------------------------------------------------------------

def choose_tile(precision: str, m: int, n: int, batch: int, sms: int, gate: bool, k: int = 0,
                pipelined: bool = False) -> Tuple[int, int, int, int]:
    """(BM, BN, WM, WN). Gates take the whole N in one CTA (psi is a dot product over N), but for
    the pipelined rules below and measured tiles, which may split it (kernels/conv.cu conv_finish).
    Convs: BN covers N where it can; BM is the largest that still gives ~2 CTAs per SM
    (batch-1 calls are launch/latency bound: many small CTAs beat few big ones).
    pipelined: the tile is for the cp.async kernels (16-bit, 16-byte vectors, conv_pipe.cu), where
    the rules taken from the tuning files apply (k: the GEMM's depth, for the split-K they allow)."""
    tc = precision != "fp32"
    target = 2 * sms
    if gate:
        if n > GATE_MAX_N:
            raise ConfigError(f"the GPU gate kernel supports at most {GATE_MAX_N} gate channels, got {n}")
        bn = next(b for b in (32, 64, 128, 256) if b >= n)
        if not pipelined:
            return (32, bn, 1, 4) if (tc and bn == 256) else (32, bn, 2, 2)
        # what tools/tune_tiles.py picked on the H100 and the H200 at batch 1 and 16 alike: N > 128
        # split over 64-wide CTAs that meet through a ticket (one 256-wide CTA held 255 registers),
        # 128 as one row of 4 warps; narrower gates take 64 rows where that still fills the GPU twice
        if bn == 256:
            return 32, 64, 2, 2
        if bn == 128:
            return 32, 128, 1, 4
        return (64 if batch * cdiv(m, 64) >= target else 32), bn, 2, 2
    bn = 32 if n <= 32 else 64
    if tc and n > 64 and batch * cdiv(m, 64) * cdiv(n, 128) >= target:
        bn = 128
    choices = (128, 64, 32) if tc else (64, 32)
    if tc and bn == 128:
        choices = (64, 32)                                  # 128x128 would need ~255 registers
    bm = next((b for b in choices if batch * cdiv(m, b) * cdiv(n, bn) >= target), choices[-1])
    ctas = batch * cdiv(m, bm) * cdiv(n, bn)
    if pipelined and bn == 64 and ctas * choose_splits(cdiv(k, 64), ctas, sms) < target:
        # the grid stays short of two CTAs per SM even split over K (k: the GEMM's depth): twice the
        # CTAs, each a shorter chain (every batch-1 conv of a 132-SM GPU; at batch 16 the split
        # 32x64 tile was measured faster: docs/perf-notes.md, session 22)
        bn = 32
    if tc and bm * bn > 64 * 64:
        # 8 warps (32x32 each): 4 warps would hold 64 accumulators per thread, ~190-255 registers,
        # and measured slower at every shape where both ran (docs/perf-notes.md, session 3)
        return (bm, bn, 4, 2) if bm >= bn else (bm, bn, 2, 4)
    return bm, bn, 2, 2


def choose_bk(precision: str, bm: int, bn: int, vec: int, gate: bool) -> int:
    """K tile: fp32 16 (FFMA smem budget); 16-bit 64 where two stages of A and B fit in ~37 KB of
    static smem (BM + BN <= 128), halving the k-loop trips, else 32. Scalar loads (vec 1) keep 32:
    a 64-wide k row would put up to 32 loads in flight per thread."""
    if precision == "fp32":
        return 16
    return 64 if (not gate and vec > 1 and bm + bn <= 128) else 32


def choose_splits(nk: int, ctas: int, sms: int) -> int:
    """Split K over CTAs when the tiles alone leave SMs idle: a small-M layer (8x8, 16x16 at batch 1)
    otherwise walks a long K loop, one memory latency per k-tile, on a handful of SMs."""
    target = 2 * sms
    if ctas >= target or nk < 8:
        return 1
    return max(1, min(cdiv(target, ctas), nk // 4, 16))


def fold_from_env(environ: Optional[Mapping[str, str]] = None) -> bool:
    """$JETSON_UNET_GN_FOLD: unset, empty or 1 -> fold GroupNorm into the GEMM where fold_norm allows
    it; 0 -> the table pass everywhere (kernels/conv.cu conv_gn_prologue describes both)."""
    raw = (os.environ if environ is None else environ).get(FOLD_ENV, "").strip()
    if raw not in ("", "0", "1"):
        raise ConfigError(f"${FOLD_ENV} must be 0 or 1, got {raw!r}")
    return raw != "0"


def dw_tc_from_env(environ: Optional[Mapping[str, str]] = None) -> bool:
    """$JETSON_UNET_DW_TC: unset, empty or 1 -> the depthwise conv on tensor cores where dwconv_tc
    allows it; 0 -> the FFMA kernel everywhere. Measured faster on every op it takes (H200, session
    21 of docs/perf-notes.md: batch 16 1.090 -> 1.062 ms a call, the 64x64 ones 20.9 -> 16.4 us)."""
    raw = (os.environ if environ is None else environ).get(DW_TC_ENV, "").strip()
    if raw not in ("", "0", "1"):
        raise ConfigError(f"${DW_TC_ENV} must be 0 or 1, got {raw!r}")
    return raw != "0"


def stages_from_env(environ: Optional[Mapping[str, str]] = None) -> int:
    """$JETSON_UNET_CONV_STAGES: unset or empty -> DEFAULT_STAGES; 0 -> conv_gemm everywhere (the
    register-staged kernel); 2..6 -> the cp.async conv (kernels/conv_pipe.cu) with that many stages
    wherever pipe_tile allows it (fp32 and scalar-load convs always run conv_gemm)."""
    raw = (os.environ if environ is None else environ).get(STAGES_ENV, "").strip()
    if raw == "":
        return DEFAULT_STAGES
    if raw == "0":
        return 0
    try:
        stages = int(raw)
    except ValueError:
        stages = -1
    if not 2 <= stages <= MAX_STAGES:
        raise ConfigError(f"{STAGES_ENV} must be 0 (the register-staged conv) or a stage count 2..{MAX_STAGES}, "
                          f"got {raw!r}")
    return stages


def pipe_ring_bytes(bm: int, bn: int, bk: int, stages: int) -> int:
    """Static smem of conv_pipe.cu's ring: `stages` x (A[bm][bk] + B[bn][bk]) 16-bit, unpadded."""
    return 2 * (bm + bn) * bk * stages


def pipe_tile(precision: str, bm: int, bn: int, vec: int, gate: bool, stages: int,
              dyn_smem: int = 0, want_bk: int = 32) -> Optional[Tuple[int, int]]:
    """(BK, STAGES) of the cp.async conv for this tile, or None to keep conv_gemm: fp32, scalar
    loads (vec < 8), or no ring of >= min(stages, 3) stages within budget. Budget: the ring <=
    PIPE_RING_LIMIT and ring + scratch + dynamic smem (GroupNorm scale/shift) <= SMEM_LIMIT, so no
    launch needs the large-smem opt-in and two CTAs share an SM of 100 KB. Among the rings that fit,
    the most k in flight ((stages - 1) * BK), then the fewer stages."""
    if stages < 2 or precision == "fp32" or vec != VEC_MAX[precision]:
        return None
    budget = min(PIPE_RING_LIMIT, SMEM_LIMIT - PIPE_SCRATCH - dyn_smem)
    fits = [(bk, s) for s in range(stages, min(stages, 3) - 1, -1)
            for bk in sorted({choose_bk(precision, bm, bn, vec, gate), 32, want_bk})
            if pipe_ring_bytes(bm, bn, bk, s) <= budget]
    return max(fits, key=lambda f: ((f[1] - 1) * f[0], -f[1])) if fits else None


def deep(bm: int, bn: int, bk: int, stages: int) -> bool:
    """A cp.async ring past PIPE_RING_LIMIT: it lives in dynamic smem (kernels/conv_pipe.cu DEEP_RING)."""
    return bool(stages) and pipe_ring_bytes(bm, bn, bk, stages) > PIPE_RING_LIMIT


def deep_ring(key: Union[ConvKey, TileChoice]) -> bool:
    """Whether the cp.async conv of `key` (or of a tuning choice) has a deep ring: a tuner candidate
    only (the built-in tiles keep pipe_tile's static rings)."""
    return not key.halo and deep(key.bm, key.bn, key.bk, key.stages)


def pipe_smem(key: ConvKey, table: int) -> int:
    """Dynamic smem of the cp.async conv: the GroupNorm table (`table` bytes), then a deep ring at a
    128-byte boundary (kernels/conv_pipe.cu dyn_ring)."""
    return table + (128 + pipe_ring_bytes(key.bm, key.bn, key.bk, key.stages) if deep_ring(key) else 0)


def check_key(key: ConvKey, n: int, dyn_smem: int, where: str) -> None:
    """A tile the kernels can instantiate (their static_asserts and the smem budget, in Python), so a
    bad tuning entry is a one-line ConfigError rather than an NVRTC failure."""
    tc, nt, eb = key.dtype != "fp32", key.threads, ELEM_BYTES[key.dtype]
    kv, vb = key.bk // key.vec, 16 // eb
    rpp = nt // kv if kv and nt % kv == 0 else 0
    ap = cdiv(key.bm, rpp) if rpp else 0
    bvec = key.bn * key.bk // vb
    sliced = key.stages and not key.halo   # the cp.async conv: k slices, spare B-copy threads
    dyn_ring = deep_ring(key)              # its ring in dynamic smem, with its own budget
    # k slices: each takes whole n-fragment column groups and k steps; their exchange fits in the ring
    ks_ok = (sliced and key.ks in (2, 4) and (key.bn // key.wn // 8) % key.ks == 0 and (key.bk // 16) % key.ks == 0
             and 4 * key.bm * key.bn * (key.ks - 1) <= pipe_ring_bytes(key.bm, key.bn, key.bk, key.stages))
    smem = (pipe_ring_bytes(key.bm, key.bn, key.bk, key.stages) + PIPE_SCRATCH if key.stages else
            2 * eb * ((key.bm + key.bn) * (key.bk + 8) if tc else key.bk * (key.bm + key.bn + 8)) + GEMM_SCRATCH)
    problems = [
        (key.bk not in ((32, 64) if tc else (16,)), f"BK {key.bk}"),
        (not rpp or not (key.bm % rpp == 0 or ap == 1) or ap > 32, f"A split of {key.bm} rows over {nt} threads"),
        (bvec % nt != 0 and not (sliced and nt % bvec == 0), f"B split of {key.bn}x{key.bk} over {nt} threads"),
        (tc and ((key.bm // key.wm) % 16 or (key.bn // key.wn) % 16), f"warp tile {key.bm}/{key.wm} x {key.bn}/{key.wn}"),
        (key.ks != 1 and not ks_ok, f"{key.ks} k slices"),
        (not tc and (key.bm % 16 or (key.bn // max(nt // 16, 1)) % 4), "FFMA thread tile"),
        (key.stages and (not tc or key.vec != VEC_MAX[key.dtype] or not 2 <= key.stages <= MAX_STAGES),
         f"cp.async stages {key.stages}"),
        (not key.halo and not dyn_ring and smem + dyn_smem > SMEM_LIMIT, f"{smem + dyn_smem} B of shared memory"),
        (dyn_ring and pipe_smem(key, dyn_smem) > PIPE_DEEP_LIMIT, f"{pipe_smem(key, dyn_smem)} B of dynamic shared memory"),
        (key.gate and key.nsplit != (key.bn < n), f"gate BN {key.bn} for {n} channels with nsplit {key.nsplit}"),
        (key.fold and not fold_fits(key), "a folded GroupNorm"),
        (key.persist and not (sliced and key.ks == 1 and not key.gate), "several M tiles per CTA"),
    ]
    bad = [msg for cond, msg in problems if cond]
    if bad:
        raise ConfigError(f"{where}: tile {key.symbol} is not supported ({'; '.join(bad)})")


@dataclass(frozen=True)
class ConvGeom:
    """What the halo conv's feasibility and shared memory depend on beyond its key."""
    cin: int
    cr: int       # residual K segment channels (0: none)
    wout: int
    norm: bool


def halo_smem(key: ConvKey, g: ConvGeom) -> int:
    """Dynamic smem bytes of conv_halo.cu, as the kernel lays it out: GroupNorm table, 128-byte
    alignment slack, NH halo buffers of (TH + 2) x (TW + 2) pixels of 2 * BK + 16 bytes, and the ring of
    `stages` slots B[BN][BK] (+ A[BM][BK] with a residual segment)."""
    tw = min(key.bm, g.wout)
    halo = round_up((key.bm // tw + 2) * (tw + 2) * (2 * key.bk + 16), 128)
    nh = 2 if g.cin > key.bk else 1
    slot = 2 * key.bk * (key.bn + (key.bm if g.cr else 0))
    return (8 * g.cin if g.norm else 0) + 128 + nh * halo + key.stages * slot


def halo_problems(key: ConvKey, g: ConvGeom) -> List[str]:
    """Why conv_halo.cu cannot run this op with this key ([] if it can)."""
    tw, smem = min(key.bm, g.wout), halo_smem(key, g)
    return [msg for cond, msg in [
        (key.kh != 3 or key.stride != 1 or key.gate, "3x3 stride-1 convs only"),
        (key.dtype == "fp32" or key.vec != VEC_MAX[key.dtype], "16-bit with 16-byte vectors only"),
        (g.cin % key.bk != 0, f"Cin {g.cin} not a multiple of BK {key.bk}"),
        (key.bm % g.wout != 0 and g.wout % key.bm != 0,
         f"BM {key.bm} neither whole rows nor a row part of width {g.wout}"),
        (not 2 <= key.stages <= 10, f"{key.stages} weight slots"),
        ((key.bm // tw + 2) * (tw + 2) > 32 * (key.threads * 8 // key.bk),
         "more than 32 halo vectors per thread (one bit mask)"),
        (smem > HALO_SMEM_LIMIT, f"{smem} B of shared memory"),
    ] if cond]


def conv_geom(op: Op, ctx: Ctx) -> ConvGeom:
    t = ctx.plan.tensors
    xr = k_residual(op)
    return ConvGeom(t[op.x].channels, t[xr].channels if xr else 0, t[op.out].size,
                    bool(op.norm))


def tuned_key(key: ConvKey, ctx: Ctx, name: str, n: int, dyn_smem: int,
              geom: Optional[ConvGeom] = None) -> Optional[ConvKey]:
    """`key` with the measured tile of op `name` from ctx.tiles, checked; None when there is none."""
    t = ctx.tiles.get(name)
    if t is None or (t.halo and not ctx.conv_stages):   # a halo tile says nothing about conv_gemm's
        return None
    stages = t.stages if ctx.conv_stages else 0
    tuned = dataclasses.replace(key, bm=t.bm, bn=t.bn, wm=t.wm, wn=t.wn, bk=t.bk, stages=stages, halo=bool(t.halo),
                                ks=t.ks if stages else 1, nsplit=key.gate and t.bn < n,
                                persist=bool(stages and t.mt > 1))
    check_key(tuned, n, dyn_smem, f"tuned tile of {name}")
    if tuned.persist and t.splits > 1:
        raise ConfigError(f"tuned tile of {name}: {t.mt} M tiles per CTA with split-K {t.splits} (one or the other)")
    bad = (halo_problems(tuned, geom) if geom else ["a gate"]) if tuned.halo else []
    if bad:
        raise ConfigError(f"tuned tile of {name}: halo conv {tuned.symbol} is not supported ({'; '.join(bad)})")
    return tuned


def pipelined(ctx: Ctx, vec: int) -> bool:
    """Whether a 16-bit GEMM with `vec`-wide loads runs the cp.async kernels (else conv_gemm)."""
    return bool(ctx.conv_stages) and ctx.precision != "fp32" and vec == VEC_MAX[ctx.precision]


def with_pipeline(key: ConvKey, ctx: Ctx, dyn_smem: int) -> ConvKey:
    """`key` as the cp.async variant when ctx.conv_stages asks for it and the tile allows it."""
    pipe = pipe_tile(key.dtype, key.bm, key.bn, key.vec, key.gate, ctx.conv_stages, dyn_smem, key.bk)
    return key if pipe is None else dataclasses.replace(key, bk=pipe[0], stages=pipe[1])


def vec_for(precision: str, ctx: Ctx, names: Sequence[Optional[str]], channels: Sequence[int]) -> int:
    """16-byte vectors when every channel count, pixel stride and view offset allows them."""
    v = VEC_MAX[precision]
    ok = all(c % v == 0 for c in channels)
    for name in names:
        if name:
            ld, c0 = ctx.views[name]
            ok = ok and ld % v == 0 and c0 % v == 0
    return v if ok else 1


# ---- weight packing -------------------------------------------------------------------------------

def conv_matrix(op: Op, params: Mapping[str, np.ndarray]) -> np.ndarray:
    """(Cout, K) with K ordered (ky, kx, c); unshuffle2's channel c*4+dy*2+dx becomes tap (dy, dx).
    In the parameter's own dtype (fp16 for the shipped weights): pack_gemm converts once, where
    the packed dtype differs, and fold_weights computes in fp32."""
    w = np.asarray(params[op.prefix + ".weight"])
    if op.in_map == "unshuffle2":
        o, c4 = w.shape[:2]
        w = w.reshape(o, c4 // 4, 2, 2).transpose(0, 2, 3, 1)
    else:
        w = w.transpose(0, 2, 3, 1)
    return np.ascontiguousarray(w.reshape(w.shape[0], -1))


def pack_gemm(precision: str, bn: int, bk: int, segs: Sequence[np.ndarray]) -> Tuple[np.ndarray, int, List[int]]:
    """Zero-padded B matrix: K segments each padded to BK, N to BN. 16-bit: [Npad][K] (ldmatrix
    reads k-contiguous rows); fp32: [K][Npad] (the FFMA path reads float4 along n)."""
    n = segs[0].shape[0]
    kps = [round_up(s.shape[1], bk) for s in segs]
    npad = round_up(n, bn)
    # fp16: straight into the packed dtype (an fp16 segment is copied, an fp32 one rounded to nearest
    # even as to_device does); bf16 goes through fp32 and to_device's rounding
    w = np.zeros((npad, sum(kps)), dtype=np.float16 if precision == "fp16" else np.float32)
    k0 = 0
    for s, kp in zip(segs, kps):
        w[:n, k0:k0 + s.shape[1]] = s
        k0 += kp
    if precision == "fp32":
        return np.ascontiguousarray(w.T), npad, [kp // bk for kp in kps]
    return (w if precision == "fp16" else to_device(w, precision)), w.shape[1], [kp // bk for kp in kps]


def padded(v: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(n, dtype=np.float32)
    out[:v.size] = np.asarray(v, dtype=np.float32).ravel()
    return out


def fold_fits(key: ConvKey) -> bool:
    """The kernels that have a folded GroupNorm: the 16-bit cp.async and halo convs (key.stages;
    conv_gemm keeps the table) with the epilogue's prefetch (BN <= 128)."""
    return bool(key.stages) and key.dtype != "fp32" and not key.gate and key.bn <= 128


def fold_norm(key: ConvKey, gn_w: np.ndarray, gn_b: np.ndarray, enabled: bool = True) -> bool:
    """Whether a normalized conv with this key folds its GroupNorm into the GEMM (kernels/conv.cu
    conv_gn_prologue: W * gn_w as weights, the raw input as A, padded taps set to the per-channel
    value whose normalization is 0, rstd and a per-column term applied once). Only where the kernel
    has one (fold_fits), and only for affine weights whose pad values mean - (gn_b / gn_w) * std stay
    finite and as precise as a normalized value: every gn_w nonzero and |gn_b / gn_w| <=
    FOLD_RATIO_MAX (the shipped model: <= 0.72; fp16 then overflows only past std ~1000)."""
    gn_w = np.asarray(gn_w, dtype=np.float64)
    if not (enabled and fold_fits(key)) or not np.all(gn_w != 0):
        return False
    return bool(np.all(np.abs(np.asarray(gn_b, dtype=np.float64) / gn_w) <= FOLD_RATIO_MAX))


def fold_weights(seg0: np.ndarray, bias: np.ndarray, gn_w: np.ndarray, gn_b: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Segment 0 of the GEMM (Cout, K, K ordered (tap, c)) as W * gn_w, and the bias plus
    P = W . gn_b (fold_norm; computed in float64 from the unrounded W)."""
    taps = seg0.shape[1] // gn_w.size
    w = np.asarray(seg0, dtype=np.float32)
    # W * gn_w in fp32: one rounding of the exact product, the same bits as the float64 product
    # (exact for two fp32 factors) rounded to fp32, without the float64 copy of W
    wg = w * np.tile(np.asarray(gn_w, np.float32), taps)
    b = np.tile(np.asarray(gn_b, np.float64), taps)
    return wg, (bias.astype(np.float64) + w.astype(np.float64) @ b).astype(np.float32)


def fold_table(w: np.ndarray, precision: str, k0: int, gn_w: np.ndarray, gn_b: np.ndarray) -> np.ndarray:
    """The folded GroupNorm's gn_fold blob: r = gn_b / gn_w (Cin), then Q[n] = the sum of the packed,
    rounded weights' first k0 columns (segment 0, padding included: zeros) for each of the Npad rows."""
    q = (w[:, :k0] if precision == "fp16" else from_device(w[:, :k0], precision)).astype(np.float64).sum(axis=1)
    r = np.asarray(gn_b, np.float64) / np.asarray(gn_w, np.float64)
    return np.concatenate([r, q]).astype(np.float32)


# ---- the GEMM conv and the gate -------------------------------------------------------------------

def gemm_key(op: Op, ctx: Ctx) -> ConvKey:
    plan = ctx.plan
    xt, ot = plan.tensors[op.x], plan.tensors[op.out]
    kh, st, up = {"none": (op.k, 1, 1), "up2": (op.k, 1, 2), "unshuffle2": (2, 2, 1)}[op.in_map]
    if op.in_map == "unshuffle2" and (op.k != 1 or op.norm):
        raise ConfigError(f"{op.out}: unshuffle2 is supported for a 1x1 conv without norm only")
    if op.residual_conv and op.act != "none":
        raise ConfigError(f"{op.out}: a fused residual_conv needs act 'none' (it joins the GEMM)")
    xr = k_residual(op)
    cr = plan.tensors[xr].channels if xr else 0
    vec = vec_for(ctx.precision, ctx, (op.x, xr, op.out), (xt.channels, cr, ot.channels))
    tile = choose_tile(ctx.precision, ot.size * ot.size, ot.channels, ctx.tile_batch or ctx.batch,
                       ctx.sms, gate=False, k=kh * kh * xt.channels + cr, pipelined=pipelined(ctx, vec))
    if vec == 1 and tile[0] > 64:   # scalar loads: 128 rows would hold 32 loads + 64 indices per thread
        tile = (64,) + tuple(tile[1:])
    bm, bn, wm, wn = tile
    key = ConvKey(ctx.precision, bm, bn, choose_bk(ctx.precision, bm, bn, vec, False), wm, wn, kh, st, up,
                  vec, False)
    dyn = 8 * xt.channels if op.norm else 0
    key = (tuned_key(key, ctx, op.out, ot.channels, dyn, conv_geom(op, ctx))
           or builtin_halo(key, op, ctx, ot)
           or (with_pipeline(key, ctx, dyn) if ctx.conv_stages else key))
    if op.norm and fold_norm(key, ctx.params[op.norm + ".weight"], ctx.params[op.norm + ".bias"], ctx.gn_fold):
        key = dataclasses.replace(key, fold=True)
    return key


def k_residual(op: Op) -> Optional[str]:
    """The tensor that joins a conv's GEMM as its second K segment (the residual A rows of
    kernels/conv.cu), or None: a residual_conv's input, with its 1x1 weights, or an identity residual
    of a conv without activation, with identity weights (exact: x * 1 in fp32 accumulation). As a K
    segment the residual streams through the copy pipeline with the GEMM's operands; as the
    epilogue's `res` its loads came after the k loop, exposed on every CTA of a one-wave grid
    (Nsight Compute, batch 16: 21% of a 64x64-level conv2's warp stall samples; docs/perf-notes.md
    session 24). The residual of a conv with an activation stays in the epilogue (act(conv) + res)."""
    if op.residual and (op.residual_conv or op.act == "none"):
        return op.residual
    return None


def builtin_halo(key: ConvKey, op: Op, ctx: Ctx, ot: Tensor) -> Optional[ConvKey]:
    """The halo conv (kernels/conv_halo.cu) for `key`'s tile where the tuning files picked it: a 3x3
    conv without a residual, normalized (a block's conv1) or upsampled (up2), of whole 64-channel
    chunks (with BK 32 it ran up to 1.6x slower), whose grid fills every SM twice (it never won at
    batch 1 on 132 SMs: latency chains). None elsewhere (docs/perf-notes.md, session 22)."""
    if not (pipelined(ctx, key.vec) and key.kh == 3 and key.stride == 1 and not (op.residual or op.residual_conv)
            and (op.norm or key.up == 2)):
        return None
    geom = conv_geom(op, ctx)
    if (geom.cin % 64 or (ctx.tile_batch or ctx.batch) * cdiv(ot.size * ot.size, key.bm) * cdiv(ot.channels, key.bn)
            < 2 * ctx.sms):
        return None
    halo = dataclasses.replace(key, bk=64, stages=HALO_STAGES, halo=True)
    return None if halo_problems(halo, geom) else halo


def gemm_conv_spec(op: Op, ctx: Ctx) -> OpSpec:
    plan, p, prec = ctx.plan, ctx.params, ctx.precision
    xt, ot = plan.tensors[op.x], plan.tensors[op.out]
    key = gemm_key(op, ctx)
    tile = (key.bm, key.bn)
    n, m = ot.channels, ot.size * ot.size
    segs = [conv_matrix(op, p)]
    bias = np.asarray(p[op.prefix + ".bias"], dtype=np.float32)
    xr = k_residual(op)
    cr = plan.tensors[xr].channels if xr else 0
    if op.residual_conv:
        segs.append(np.asarray(p[op.residual_conv + ".weight"]).reshape(n, cr))
        bias = bias + np.asarray(p[op.residual_conv + ".bias"], dtype=np.float32)
    elif xr:
        if cr != n:
            raise ConfigError(f"{op.out}: identity residual {xr} has {cr} channels, the conv {n}")
        segs.append(np.eye(n, dtype=np.float32))
    res = op.residual if (op.residual and not xr) else None
    gn_w, gn_b = (p[op.norm + ".weight"], p[op.norm + ".bias"]) if op.norm else (None, None)
    fold = key.fold   # gemm_key decided (fold_norm)
    if fold:
        segs[0], bias = fold_weights(segs[0], bias, gn_w, gn_b)
    w, ldw, nks = pack_gemm(prec, tile[1], key.bk, segs)
    blobs = {"w": w, "bias": padded(bias, round_up(n, tile[1]))}
    if fold:
        blobs["gn_fold"] = fold_table(w, prec, nks[0] * key.bk, gn_w, gn_b)
    elif op.norm:
        blobs["gn_w"] = padded(gn_w, xt.channels)
        blobs["gn_b"] = padded(gn_b, xt.channels)
    mtiles, ntiles = cdiv(m, tile[0]), cdiv(n, tile[1])
    splits, ws_bytes = split_k(blobs, mtiles, ntiles, sum(nks), key, ctx, op.out)
    # several M tiles per CTA (kernels/conv_pipe.cu PERSIST): CTA g runs tiles g, g + grid.x, ...
    grid = (cdiv(mtiles, ctx.tiles[op.out].mt) if key.persist else mtiles * splits, ntiles, ctx.batch)
    # (normalized: 8 * Cin bytes for the table; a folded norm uses 2 * Cin of them)
    smem = halo_smem(key, conv_geom(op, ctx)) if key.halo else pipe_smem(key, 8 * xt.channels if op.norm else 0)
    act = {"none": 0, "gelu": 1}[op.act]

    def make_args(r: Resolver) -> Tuple[Any, ...]:
        x_ptr, ldx = r.tensor(op.x)
        xr_ptr, ldr = r.tensor(xr) if xr else (0, 0)
        res_ptr, ldres = r.tensor(res) if res else (0, 0)
        out_ptr, ldo = r.tensor(op.out)
        tb_ptr, tb_stride = r.tbias(op.tbias) if op.tbias else (0, 0)
        gn_part, gn_n = r.stats_in(op) if op.norm else (0, 0)
        gn_w_ptr = r.blob(op.out, "gn_w") if op.norm and not fold else 0
        gn_b_ptr = r.blob(op.out, "gn_b") if op.norm and not fold else 0
        gn_fold = r.blob(op.out, "gn_fold") if fold else 0
        return (P(x_ptr), I(xt.size), I(xt.size), I(xt.channels), I(ldx), P(xr_ptr), I(cr), I(ldr),
                P(r.blob(op.out, "w")), I(ldw), I(nks[0]), I(nks[1] if len(nks) > 1 else 0),
                P(r.blob(op.out, "bias")), P(tb_ptr), I(tb_stride), r.t_idx if op.tbias else P(0),
                P(gn_w_ptr), P(gn_b_ptr), P(gn_fold), P(gn_part), I(gn_n), F(r.norm_eps), P(res_ptr), I(ldres),
                P(out_ptr), I(ot.size), I(ot.size), I(n), I(ldo), P(r.stats_out(op.out)), I(act),
                P(0), F(0.0), *split_args(r, op.out, splits, ws_bytes))

    return OpSpec(op, key, grid, (key.threads, 1, 1), smem, blobs, make_args, mtiles * ntiles, ws_bytes)


def gemm_workspace(batch: int, mtiles: int, ntiles: int, splits: int, bm: int, bn: int, gate: bool) -> Tuple[int, int]:
    """(fp32 workspace elements, int32 counters) of a GEMM launch, as kernels/conv.cu conv_finish lays
    them out: with splits > 1 the split-K partial tiles and one ticket per (sample, tile); then, for
    a gate whose N is split over ntiles CTAs, each (sample, m tile)'s row partials of psi and its
    ticket."""
    tiles = batch * mtiles * ntiles
    ws, ctr = (tiles * splits * bm * bn, tiles) if splits > 1 else (0, 0)
    if gate and ntiles > 1:
        ws, ctr = ws + tiles * bm, ctr + batch * mtiles
    return ws, ctr


def split_k(blobs: Dict[str, np.ndarray], mtiles: int, ntiles: int, nk: int, key: ConvKey, ctx: Ctx,
            name: str) -> Tuple[int, int]:
    """Splits, workspace bytes; adds the zeroed tickets (gemm_workspace) to the op's blobs."""
    t = ctx.tiles.get(name)
    tiles = mtiles * ntiles
    splits = (1 if key.persist else min(t.splits, nk) if (t and t.splits) else
              choose_splits(nk, tiles * ctx.batch, ctx.sms))
    ws, ctr = gemm_workspace(ctx.batch, mtiles, ntiles, splits, key.bm, key.bn, key.gate)
    if ctr:
        blobs["counters"] = np.zeros(ctr, dtype=np.int32)
    return splits, 4 * ws


def split_args(r: Resolver, name: str, splits: int, ws_bytes: int) -> Tuple[Any, ...]:
    if not ws_bytes:
        return I(splits), P(0), P(0)
    return I(splits), P(r.workspace(name)), P(r.blob(name, "counters"))


def gate_key(op: Op, ctx: Ctx) -> ConvKey:
    xname, skip = op.inputs
    g, r_ch, size = (ctx.plan.tensors[xname].channels, ctx.plan.tensors[skip].channels,
                     ctx.plan.tensors[skip].size)
    vec = vec_for(ctx.precision, ctx, (xname, skip, op.out), (g, r_ch))
    pipe = pipelined(ctx, vec)
    bm, bn, wm, wn = choose_tile(ctx.precision, size * size, g, ctx.tile_batch or ctx.batch, ctx.sms, gate=True,
                                 pipelined=pipe)
    bk = 64 if (pipe and bn < g) else choose_bk(ctx.precision, bm, bn, vec, True)   # the split gates' tuned BK
    key = ConvKey(ctx.precision, bm, bn, bk, wm, wn, 1, 1, 1, vec, True, nsplit=bn < g)
    return tuned_key(key, ctx, op.out, g, 0) or (with_pipeline(key, ctx, 0) if ctx.conv_stages else key)


def gate_spec(op: Op, ctx: Ctx) -> OpSpec:
    plan, p, prec = ctx.plan, ctx.params, ctx.precision
    xname, skip = op.inputs
    g, r_ch, size = plan.tensors[xname].channels, plan.tensors[skip].channels, plan.tensors[skip].size
    m = size * size
    key = gate_key(op, ctx)
    tile = (key.bm, key.bn)
    f32 = lambda k: np.asarray(p[op.prefix + k], dtype=np.float32)  # noqa: E731
    segs = [np.asarray(p[op.prefix + ".gate_conv.weight"]).reshape(g, g),   # their own dtype: pack_gemm converts
            np.asarray(p[op.prefix + ".residual_conv.weight"]).reshape(g, r_ch)]
    bias = f32(".gate_conv.bias") + f32(".residual_conv.bias")
    w, ldw, nks = pack_gemm(prec, tile[1], key.bk, segs)
    npad = round_up(g, tile[1])
    blobs = {"w": w, "bias": padded(bias, npad), "psi": padded(f32(".psi.weight"), npad)}
    psi_b = float(f32(".psi.bias").ravel()[0])
    mtiles, ntiles = cdiv(m, tile[0]), cdiv(g, tile[1])   # ntiles > 1: N split, psi summed by a ticket
    splits, ws_bytes = split_k(blobs, mtiles, ntiles, sum(nks), key, ctx, op.out)
    grid = (mtiles * splits, ntiles, ctx.batch)

    def make_args(r: Resolver) -> Tuple[Any, ...]:
        x_ptr, ldx = r.tensor(xname)
        s_ptr, lds = r.tensor(skip)
        out_ptr, ldo = r.tensor(op.out)
        return (P(x_ptr), I(size), I(size), I(g), I(ldx), P(s_ptr), I(r_ch), I(lds),
                P(r.blob(op.out, "w")), I(ldw), I(nks[0]), I(nks[1]),
                P(r.blob(op.out, "bias")), P(0), I(0), P(0),
                P(0), P(0), P(0), P(0), I(0), F(0.0), P(0), I(0),
                P(out_ptr), I(size), I(size), I(g), I(ldo), P(0), I(0),
                P(r.blob(op.out, "psi")), F(psi_b), *split_args(r, op.out, splits, ws_bytes))

    return OpSpec(op, key, grid, (key.threads, 1, 1), pipe_smem(key, 0), blobs, make_args, 0, ws_bytes)


# ---- depthwise 7x7, init_conv, final_conv -------------------------------------------------------

def dw_ctas(size: int, channels: int, batch: int) -> int:
    """CTAs of the depthwise conv's grid with one channel per thread and 8-wide tiles."""
    return cdiv(size, DW_TILE) ** 2 * cdiv(channels, DW_CC) * batch


def dwconv_tw(size: int, channels: int, batch: int, sms: int) -> int:
    """The depthwise tile's width (outputs per thread along a row): 8, or 4 where even the 4-wide
    grid (twice the CTAs) fits in one wave with an SM each, so that each thread's serial chain of
    FMAs is half as long. Measured on the H100 (docs/perf-notes.md, session 7): 3.4 -> 2.8 us for
    4-64 CTAs of the 8-wide grid, but 3.6 -> 3.9 us for 128 (batch 1, 64x64, 64 channels); never 4
    on a GPU the 8-wide grid fills (the Orin's 8 SMs), where 4 costs 1.4x the smem reads per output."""
    return 4 if 2 * dw_ctas(size, channels, batch) <= sms else 8


def dwconv_cp(size: int, channels: int, batch: int, sms: int, vec: int) -> int:
    """Channels per thread of the depthwise conv: 2 (16 rows x 8 per CTA, an fp32 halo tile, half
    the instructions per output, half the CTAs) where the 1-channel grid has more CTAs than the GPU
    has SMs and the image has the 16 rows; else 1, whose shorter per-thread chain wins when each SM
    runs one CTA. Measured per op on the H100 (docs/perf-notes.md, session 10): 2 wins from ~1.5
    CTAs per SM up (batch 16, 64x64, 64 channels: 29.0 -> 21.2 us), loses 3.3 -> 4.5 us at one or
    fewer, and on 8x8 images (half of each 16-row tile idle). Needs vector loads (vec > 1)."""
    return 2 if vec > 1 and size >= 2 * DW_TILE and dw_ctas(size, channels, batch) > sms else 1


def dwconv_tc(precision: str, vec: int, size: int, k: int) -> bool:
    """Where kernels/dwconv.cu dwconv_tc runs: 16-bit types with 16-byte vectors, odd k <= 9 (the
    Toeplitz band inside 16 columns), images of at least one 16-row tile (smaller ones would leave
    most of each mma idle)."""
    return precision != "fp32" and vec == 8 and size >= DW_TC_TILE and k % 2 == 1 and k <= 9


def dwconv_tc_cpw(size: int, channels: int, batch: int, sms: int) -> int:
    """dwconv_tc's channels per warp (a CTA: 8 warps, 8 CPW channels): 4 where that grid still has a
    CTA per SM, else 2, else 1 (2-4x the CTAs, each a shorter chain), like dwconv_tw. Every choice
    it made for the seed model at batch 1 and 16 beat the FFMA kernel's (docs/perf-notes.md session 21)."""
    for cpw in (4, 2):
        if cdiv(size, DW_TC_TILE) ** 2 * cdiv(channels, 8 * cpw) * batch >= sms:
            return cpw
    return 1


def pack_dw_tc(w: np.ndarray, k: int, precision: str) -> np.ndarray:
    """dwconv_tc's weights: for channel c and kernel row ky, B[k][n] = w[c, ky, k - n] where
    0 <= k - n < K, else 0 (16 x 8), in mma.m16n8k16 B-fragment order: lane l (g = l // 4, t = l % 4)
    holds (k, k + 1) = 2 t (+ 8) at column g. Returned as the 16-bit storage type, [C, K, 32 lanes,
    2 registers, 2 halves]."""
    c = w.shape[0]
    w = np.asarray(w, dtype=np.float32).reshape(c, k, k)
    ch, ky, lane, r, e = np.ix_(np.arange(c), np.arange(k), np.arange(32), np.arange(2), np.arange(2))
    kk, n = b_fragment(lane, r, e)
    kx = kk - n
    vals = np.where((kx >= 0) & (kx < k), w[ch, ky, np.clip(kx, 0, k - 1)], 0.0)
    return to_device(vals, precision)


def dwconv_key(op: Op, ctx: Ctx) -> SimpleKey:
    c, size = ctx.plan.tensors[op.x].channels, ctx.plan.tensors[op.x].size
    batch, vec = ctx.tile_batch or ctx.batch, vec_for(ctx.precision, ctx, (op.x, op.out), (c,))
    if ctx.dw_tc and dwconv_tc(ctx.precision, vec, size, op.k):
        return SimpleKey("dwconv_tc", ctx.precision, op.k, vec, DW_TC_TILE, dwconv_tc_cpw(size, c, batch, ctx.sms))
    cp = dwconv_cp(size, c, batch, ctx.sms, vec)
    return SimpleKey("dwconv", ctx.precision, op.k, vec, dwconv_tw(size, c, batch, ctx.sms) if cp == 1 else 8, cp)


def dwconv_spec(op: Op, ctx: Ctx) -> OpSpec:
    xt = ctx.plan.tensors[op.x]
    c, size, k = xt.channels, xt.size, op.k
    w = np.asarray(ctx.params[op.prefix + ".weight"], dtype=np.float32).reshape(c, k * k)
    key = dwconv_key(op, ctx)
    tc = key.kind == "dwconv_tc"
    blobs = {"w": pack_dw_tc(w, k, ctx.precision) if tc else np.ascontiguousarray(w.T),
             "bias": padded(ctx.params[op.prefix + ".bias"], c)}
    rows, cc = (DW_TC_TILE, 8 * key.cp) if tc else (DW_TILE * key.cp, DW_CC)
    grid = (cdiv(size, rows) * cdiv(size, key.tw), cdiv(c, cc), ctx.batch)

    def make_args(r: Resolver) -> Tuple[Any, ...]:
        x_ptr, ldx = r.tensor(op.x)
        out_ptr, ldo = r.tensor(op.out)
        tb_ptr, tb_stride = r.tbias(op.tbias) if op.tbias else (0, 0)
        return (P(x_ptr), I(size), I(size), I(c), I(ldx), P(r.blob(op.out, "w")),
                P(r.blob(op.out, "bias")), P(tb_ptr), I(tb_stride), r.t_idx if op.tbias else P(0),
                P(out_ptr), I(ldo), P(r.stats_out(op.out)))

    return OpSpec(op, key, grid, (DW_THREADS, 1, 1), 0, blobs, make_args, grid[0] * grid[1])


def init_row(halo: int) -> int:
    """init_conv's halo-tile row stride in floats (kernels/io.cu RS): an odd multiple of 8 >= halo."""
    return 8 if halo <= 8 else 8 * (2 * ((halo - 8 + 15) // 16) + 1)


def init_tw(size: int, batch: int, sms: int) -> int:
    """init_conv's tile width: 8, or 16 where the 8-wide grid is at least 4 CTAs per SM (batch 16 on
    the H100, batch 1 on the Orin), so that each weight read from shared memory serves 2 pixels;
    a small grid keeps 8 (at batch 1 on the H100, 64 CTAs for 132 SMs)."""
    return 16 if cdiv(size, INIT_TILE) ** 2 * batch >= 4 * sms else 8


INIT_TC_THREADS, INIT_TC_TILE = 128, (4, 16)   # io.cu init_conv_tc: 4 warps over 4 rows x 16 columns


def init_tc(precision: str, cin: int) -> bool:
    """Whether init_conv runs on tensor cores: 16-bit activations and an image of <= 4 channels
    (kernels/io.cu init_conv_tc; fp32 keeps the FFMA kernel, as every fp32 conv does)."""
    return precision != "fp32" and cin <= 4


def init_key(op: Op, ctx: Ctx) -> SimpleKey:
    xt = ctx.plan.tensors[op.x]
    if init_tc(ctx.precision, xt.channels):
        return SimpleKey("init_tc", ctx.precision, op.k, xt.channels)
    return SimpleKey("init", ctx.precision, op.k, xt.channels, init_tw(xt.size, ctx.tile_batch or ctx.batch, ctx.sms))


def b_fragment(lane: Any, r: Any, e: Any) -> Tuple[Any, Any]:
    """(k, n) of the B element that lane l holds in register r, half e, of an mma.m16n8k16 B
    fragment (k 16 deep, n 8 wide): k = 2 (l % 4) + 8 r + e, n = l // 4 (arrays broadcast)."""
    return 2 * (lane % 4) + 8 * r + e, lane // 4


def init_tc_steps(k: int) -> int:
    """16-deep mma steps of init_conv_tc: k * k taps of 4 channels each."""
    return cdiv(4 * k * k, 16)


def pack_init_tc(w: np.ndarray, precision: str, coutp: int) -> np.ndarray:
    """init_conv_tc's weights: w [Cout, Cin <= 4, k, k] as the GEMM matrix B[k = tap * 4 + c][n]
    (zero for c >= Cin, padded taps and n >= Cout), in mma.m16n8k16 B-fragment order: for step s,
    n8 tile j and lane l (g = l // 4, t = l % 4), two u32 of (k, k + 1) = 16 s + 2 t (+ 8) at column
    8 j + g. Returned as the 16-bit storage type, [steps, coutp / 8, 32, 2 registers, 2 halves]."""
    cout, cin, k, _ = w.shape
    steps = init_tc_steps(k)
    b = np.zeros((coutp, 16 * steps), dtype=np.float32)
    w4 = np.zeros((cout, k, k, 4), dtype=np.float32)
    w4[..., :cin] = np.asarray(w, dtype=np.float32).transpose(0, 2, 3, 1)
    b[:cout, :4 * k * k] = w4.reshape(cout, -1)
    s, j, lane, r, e = np.ix_(np.arange(steps), np.arange(coutp // 8), np.arange(32), np.arange(2), np.arange(2))
    kk, n = b_fragment(lane, r, e)
    return to_device(b[8 * j + n, 16 * s + kk], precision)


def init_spec(op: Op, ctx: Ctx) -> OpSpec:
    xt, ot = ctx.plan.tensors[op.x], ctx.plan.tensors[op.out]
    cin, cout, k, size = xt.channels, ot.channels, op.k, xt.size
    key = init_key(op, ctx)
    w = np.asarray(ctx.params[op.prefix + ".weight"], dtype=np.float32)
    if key.kind == "init_tc":
        coutp = round_up(cout, 32)   # whole 32-channel passes
        wb = pack_init_tc(w, ctx.precision, coutp)
        th, tw = INIT_TC_TILE
        smem = 8 * (th + k - 1) * (tw + k - 1) + wb.nbytes
        tiles, threads = cdiv(size, th) * cdiv(size, tw), INIT_TC_THREADS
    else:
        coutp = round_up(cout, 8)
        wb = np.zeros((k, k, cin, coutp), dtype=np.float32)
        wb[..., :cout] = w.transpose(2, 3, 1, 0)
        smem = 4 * (cin * (INIT_TILE + k - 1) * init_row(key.tw + k - 1) + wb.size)
        tiles, threads = cdiv(size, INIT_TILE) * cdiv(size, key.tw), 256
    if smem > SMEM_LIMIT:
        raise ConfigError(f"{op.out}: init_conv needs {smem} B of shared memory (> {SMEM_LIMIT})")
    blobs = {"w": wb.reshape(-1), "bias": padded(ctx.params[op.prefix + ".bias"], coutp)}

    def make_args(r: Resolver) -> Tuple[Any, ...]:
        x_ptr, _ = r.tensor(op.x)
        out_ptr, ldo = r.tensor(op.out)
        return (P(x_ptr), I(size), I(size), I(cin), P(r.blob(op.out, "w")), P(r.blob(op.out, "bias")),
                P(out_ptr), I(cout), I(coutp), I(ldo), I(tiles), r.advance, P(0), P(0), P(0), P(0), P(0), I(0))

    # one CTA more per sample: the sampler's step advance (kernels/io.cu; it returns at once in a plain call)
    return OpSpec(op, key, (tiles + 1, 1, ctx.batch), (threads, 1, 1), smem, blobs, make_args)


def final_spec(op: Op, ctx: Ctx) -> OpSpec:
    xt, ot = ctx.plan.tensors[op.x], ctx.plan.tensors[op.out]
    cin, cout, size = xt.channels, ot.channels, ot.size
    if op.k != 1 or cout > 8 or op.norm or op.residual or op.tbias or op.act != "none":
        raise ConfigError(f"{op.out}: final_conv supports a plain 1x1 conv to <= 8 channels")
    w = np.asarray(ctx.params[op.prefix + ".weight"], dtype=np.float32).reshape(cout, cin)
    blobs = {"w": np.ascontiguousarray(w), "bias": padded(ctx.params[op.prefix + ".bias"], 8)}
    npix = ctx.batch * size * size
    key = SimpleKey("final", ctx.precision, 0, vec_for(ctx.precision, ctx, (op.x,), (cin,)))

    def make_args(r: Resolver) -> Tuple[Any, ...]:
        x_ptr, ldx = r.tensor(op.x)
        out_ptr, _ = r.tensor(op.out)
        return (P(x_ptr), I(npix), I(cin), I(ldx), P(r.blob(op.out, "w")), P(r.blob(op.out, "bias")),
                P(out_ptr), I(cout), r.step, P(0), P(0), I(size * size))

    return OpSpec(op, key, (cdiv(npix, FINAL_THREADS), 1, 1), (FINAL_THREADS, 1, 1), 4 * cout * cin,
                  blobs, make_args)


# The GEMM kernels' set-up divides with common.cuh's div_small, exact for dividends under 2^22: one
# sample's pixels (M) and GEMM depth (K) must stay below it (a 2048 x 2048 image would not).
DIV_LIMIT = 1 << 22


def check_div_range(op: Op, plan: Plan) -> None:
    t = [plan.tensors[n] for n in (op.out, *op.inputs) if n in plan.tensors]
    pixels = max(x.size for x in t) ** 2
    depth = sum(x.channels for x in t) * max(op.k, 1) ** 2
    if pixels >= DIV_LIMIT or depth >= DIV_LIMIT:
        raise ConfigError(f"{op.out}: {pixels} pixels per sample and GEMM depth {depth} must both stay "
                          f"below {DIV_LIMIT} for the GPU GEMM kernels")


def kernel_kind(op: Op, plan: Plan) -> str:
    """Which kernel family runs `op`: init/final convs at the fp32 image ends, depthwise, GEMM, gate."""
    if op.kind == GATE:
        check_div_range(op, plan)
        return "gate"
    if op.kind != CONV:
        raise ConfigError(f"{op.out}: op kind {op.kind!r} has no GPU kernel")
    cin = plan.tensors[op.x].channels
    if op.x == plan.input:
        if op.norm or op.residual or op.tbias or op.act != "none" or op.in_map != "none":
            raise ConfigError(f"{op.out}: the image-input conv supports a plain conv only")
        return "init"
    if op.out == plan.output:
        return "final"
    if op.groups == cin and op.groups > 1:
        if op.norm or op.residual or op.act != "none" or op.in_map != "none":
            raise ConfigError(f"{op.out}: the depthwise kernel fuses bias and time bias only")
        return "dwconv"
    if op.groups != 1:
        raise ConfigError(f"{op.out}: grouped convs other than depthwise have no GPU kernel")
    check_div_range(op, plan)
    return "gemm"


SPEC_BUILDERS = {"gate": gate_spec, "init": init_spec, "final": final_spec, "dwconv": dwconv_spec,
                 "gemm": gemm_conv_spec}


def op_spec(op: Op, ctx: Ctx) -> OpSpec:
    return SPEC_BUILDERS[kernel_kind(op, ctx.plan)](op, ctx)


def all_tile_keys(ctx: Ctx, batches: Sequence[int] = (1, 2, 4, 8, 16, 32, 64)) -> List[Any]:
    """Every instantiation the tile heuristics (GEMM tiles, depthwise and init widths) can pick for
    this plan at any of `batches`: one module per (config, precision) then serves every batch size
    (one compile, one cache entry)."""
    key_of = {"gate": gate_key, "gemm": gemm_key, "dwconv": dwconv_key, "init": init_key}   # batch-dependent
    keyed = [(op, key_of.get(kernel_kind(op, ctx.plan))) for op in ctx.plan.ops if op.kind in (CONV, GATE)]
    keys = set()
    for b in batches:
        sub = Ctx(ctx.plan, ctx.params, ctx.precision, ctx.batch, ctx.sms, ctx.views, tile_batch=b,
                  conv_stages=ctx.conv_stages, gn_fold=ctx.gn_fold)
        keys.update(fn(op, sub) for op, fn in keyed if fn)
    return sorted(keys, key=lambda k: k.symbol)

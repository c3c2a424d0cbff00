"""What every launcher shares: fixed-width argument scalars, host dtype conversion, the op spec
(`OpSpec`: grid, block, shared memory, packed weights, argument maker) and its context (`Ctx`), the
device-address interface (`Resolver`) the executor implements, and one op's measured tile
(`TileChoice`).

Nothing here touches the GPU: an `OpSpec` is built from the plan and the parameters alone, and its
`make_args(resolver)` turns device addresses (known once the arena and weights are allocated) into
the launch arguments (pointers as np.uint64, 4-byte scalars as np.int32 / np.float32: CuPy passes a
Python int as 8 bytes).
"""
from __future__ import annotations

import numpy as np
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from jetson_unet.errors import ConfigError
from jetson_unet.model.plan import Op, Plan


VEC_MAX = {"fp32": 4, "fp16": 8, "bf16": 8}          # 16-byte vectors
ELEM_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
SMEM_LIMIT = 48 * 1024                               # static + dynamic without an opt-in
MAX_STAGES = 6                                       # the deepest cp.async ring a tuning file may ask for


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
    step: Any = None       # a marker: final_conv's sampler-step arguments (xs, noise, step, hist, rows), null unless swapped
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
    tile_batch: Optional[int] = None           # batch the tiles are chosen for (None: batch; else a
                                               # neighbouring tuning file's, or the module grid's)
    extra_keys: List[Any] = field(default_factory=list)
    tiles: Mapping[str, "TileChoice"] = field(default_factory=dict)       # op.out -> measured tile
    # what `memoized` derived from these params (packed weights, module keys): a caller that builds many
    # executors of the same weights (jetson-tune: one per round) passes one dict to all of them
    memo: Dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)


def memoized(ctx: Ctx, key: Tuple[Any, ...], make: Callable[[], Any]) -> Any:
    """make(), or what it returned for `key` before with ctx.memo (key: whatever the value depends on
    besides the params; the caller treats the value as read-only)."""
    if key not in ctx.memo:
        ctx.memo[key] = make()
    return ctx.memo[key]


def vec_for(precision: str, ctx: Ctx, names: Sequence[Optional[str]], channels: Sequence[int]) -> int:
    """16-byte vectors when every channel count, pixel stride and view offset allows them."""
    v = VEC_MAX[precision]
    ok = all(c % v == 0 for c in channels)
    for name in names:
        if name:
            ld, c0 = ctx.views[name]
            ok = ok and ld % v == 0 and c0 % v == 0
    return v if ok else 1


def padded(v: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(n, dtype=np.float32)
    out[:v.size] = np.asarray(v, dtype=np.float32).ravel()
    return out


def k_residual(op: Op) -> Optional[str]:
    """The tensor that joins a conv's GEMM as its second K segment (the residual A rows of
    kernels/conv.cu), or None: a residual_conv's input, with its 1x1 weights, or an identity residual
    of a conv without activation, with identity weights (exact: x * 1 in fp32 accumulation). As a K
    segment the residual streams through the copy pipeline with the GEMM's operands; as the
    epilogue's `res` its loads came after the k loop, exposed on every CTA of a one-wave grid
    (Nsight Compute, H200, batch 16: 21% of a 64x64-level conv2's warp stall samples). The residual
    of a conv with an activation stays in the epilogue (act(conv) + res)."""
    if op.residual and (op.residual_conv or op.act == "none"):
        return op.residual
    return None


def b_fragment(lane: Any, r: Any, e: Any) -> Tuple[Any, Any]:
    """(k, n) of the B element that lane l holds in register r, half e, of an mma.m16n8k16 B
    fragment (k 16 deep, n 8 wide): k = 2 (l % 4) + 8 r + e, n = l // 4 (arrays broadcast)."""
    return 2 * (lane % 4) + 8 * r + e, lane // 4


def b_fragments(b: np.ndarray) -> np.ndarray:
    """A GEMM's B operand b [N][K] (N a multiple of 8, K of 16) in mma.m16n8k16 B-fragment order:
    [K / 16 steps][N / 8 tiles][32 lanes][2 registers][2 halves], so that lane l's two registers of
    step s and tile j are one 8-byte load."""
    n, k = b.shape
    s, j, lane, r, e = np.ix_(np.arange(k // 16), np.arange(n // 8), np.arange(32), np.arange(2), np.arange(2))
    kk, nn = b_fragment(lane, r, e)
    return b[8 * j + nn, 16 * s + kk]


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


@dataclass(frozen=True)
class TileChoice:
    """One op's tile, measured instead of guessed (jetson-tune): it replaces choose_tile,
    choose_bk, pipe_tile and (splits > 0) choose_splits for that op. Checked by check_key."""
    bm: int
    bn: int
    wm: int
    wn: int
    bk: int
    stages: int = 0      # 0: conv_gemm; n: the cp.async conv with n stages
    splits: int = 0      # 0: choose_splits decides
    halo: int = 0        # 1: the halo conv (kernels/conv_halo.cu) with `stages` weight slots; 2: its row tiles
    ks: int = 1          # k slices of the cp.async conv (ConvKey.ks)

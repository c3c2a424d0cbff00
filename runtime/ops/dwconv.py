"""Launchers of kernels/dwconv.cu: the 7x7 depthwise conv, on tensor cores (dwconv_tc) for 16-bit maps
of 16+ rows, else the FFMA kernel.
"""
from __future__ import annotations

import numpy as np
from typing import Any, Tuple

from jetson_unet.ops.common import Ctx, I, OpSpec, P, Resolver, b_fragment, cdiv, padded, to_device, vec_for
from jetson_unet.ops.conv import output_scale
from jetson_unet.ops.keys import SimpleKey
from jetson_unet.model.plan import Op


DW_TILE, DW_CC, DW_THREADS = 8, 32, 256              # dwconv.cu (rows and channels of a tile)
DW_TC_TILE = 16                                      # dwconv.cu dwconv_tc: 16 x 16 outputs x 8 CPW channels


# ---- depthwise 7x7, init_conv, final_conv -------------------------------------------------------

def dw_ctas(size: int, channels: int, batch: int) -> int:
    """CTAs of the depthwise conv's grid with one channel per thread and 8-wide tiles."""
    return cdiv(size, DW_TILE) ** 2 * cdiv(channels, DW_CC) * batch


def dwconv_tw(size: int, channels: int, batch: int, sms: int) -> int:
    """The depthwise tile's width (outputs per thread along a row): 8, or 4 where even the 4-wide
    grid (twice the CTAs) fits in one wave with an SM each, so that each thread's serial chain of
    FMAs is half as long. Measured on the H100: 3.4 -> 2.8 us for
    4-64 CTAs of the 8-wide grid, but 3.6 -> 3.9 us for 128 (batch 1, 64x64, 64 channels); never 4
    on a GPU the 8-wide grid fills (the Orin's 8 SMs), where 4 costs 1.4x the smem reads per output."""
    return 4 if 2 * dw_ctas(size, channels, batch) <= sms else 8


def dwconv_cp(size: int, channels: int, batch: int, sms: int, vec: int) -> int:
    """Channels per thread of the depthwise conv: 2 (an fp32 halo tile, half the instructions per
    output, half the CTAs) where the 1-channel grid has more CTAs than the GPU has SMs; else 1,
    whose shorter per-thread chain wins when each SM runs one CTA. Measured per op on the H100: 2
    wins from ~1.5 CTAs per SM up (batch 16, 64x64, 64 channels: 29.0 -> 21.2 us), loses 3.3 -> 4.5
    us at one or fewer. Needs vector loads (vec > 1)."""
    return 2 if vec > 1 and dw_ctas(size, channels, batch) > sms else 1


def dwconv_rows(size: int, cp: int) -> int:
    """The FFMA depthwise tile's rows: 8 a channel per thread (256 threads); for channel pairs 16
    (256 threads), or 8 (128 threads) on maps of fewer than 16 rows, where a 16-row tile would
    leave half its rows idle (the 8x8 level)."""
    return 8 if cp == 1 or size < 2 * DW_TILE else 2 * DW_TILE


def dwconv_tc(precision: str, vec: int, size: int, k: int) -> bool:
    """Where kernels/dwconv.cu dwconv_tc runs: 16-bit types with 16-byte vectors, odd k <= 9 (the
    Toeplitz band inside 16 columns), images of at least one 16-row tile (smaller ones would leave
    most of each mma idle)."""
    return precision != "fp32" and vec == 8 and size >= DW_TC_TILE and k % 2 == 1 and k <= 9


def dwconv_tc_cpw(size: int, channels: int, batch: int, sms: int) -> int:
    """dwconv_tc's channels per warp (a CTA: 8 warps, 8 CPW channels): 4 where that grid still has a
    CTA per SM, else 2, else 1 (2-4x the CTAs, each a shorter chain), like dwconv_tw. Every choice
    it made for the seed model at batch 1 and 16 beat the FFMA kernel's."""
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
    if dwconv_tc(ctx.precision, vec, size, op.k):
        return SimpleKey("dwconv_tc", ctx.precision, op.k, vec, DW_TC_TILE, dwconv_tc_cpw(size, c, batch, ctx.sms))
    cp = dwconv_cp(size, c, batch, ctx.sms, vec)
    rows = dwconv_rows(size, cp)
    return SimpleKey("dwconv", ctx.precision, op.k, vec, dwconv_tw(size, c, batch, ctx.sms) if cp == 1 else 8, cp,
                     rows if rows != DW_TILE * cp else 0)


def dwconv_spec(op: Op, ctx: Ctx) -> OpSpec:
    xt = ctx.plan.tensors[op.x]
    c, size, k = xt.channels, xt.size, op.k
    w = np.asarray(ctx.params[op.prefix + ".weight"], dtype=np.float32).reshape(c, k * k)
    key = dwconv_key(op, ctx)
    tc = key.kind == "dwconv_tc"
    blobs = {"w": pack_dw_tc(w, k, ctx.precision) if tc else np.ascontiguousarray(w.T),
             "bias": padded(ctx.params[op.prefix + ".bias"], c)}
    oscale = output_scale(op, ctx)   # the next conv folds its GroupNorm: store gn_w * out
    if oscale is not None:
        blobs["oscale"] = padded(oscale, c)
    rows, cc = (DW_TC_TILE, 8 * key.cp) if tc else (key.th or DW_TILE * key.cp, DW_CC)
    grid = (cdiv(size, rows) * cdiv(size, key.tw), cdiv(c, cc), ctx.batch)
    threads = DW_THREADS if tc else DW_CC // key.cp * rows

    def make_args(r: Resolver) -> Tuple[Any, ...]:
        x_ptr, ldx = r.tensor(op.x)
        out_ptr, ldo = r.tensor(op.out)
        tb_ptr, tb_stride = r.tbias(op.tbias) if op.tbias else (0, 0)
        return (P(x_ptr), I(size), I(size), I(c), I(ldx), P(r.blob(op.out, "w")),
                P(r.blob(op.out, "bias")), P(tb_ptr), I(tb_stride), r.t_idx if op.tbias else P(0),
                P(out_ptr), I(ldo), P(r.stats_out(op.out)), P(r.blob(op.out, "oscale") if oscale is not None else 0))

    return OpSpec(op, key, grid, (threads, 1, 1), 0, blobs, make_args, grid[0] * grid[1])

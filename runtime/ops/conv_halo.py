"""Launcher rules of kernels/conv_halo.cu, the halo 3x3 conv (GEMM tiles, and row tiles: ConvKey.rows):
where it can run, its dynamic shared memory, and where the built-in tiles pick it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import List, Optional

from jetson_unet.ops.common import Ctx, VEC_MAX, cdiv, k_residual, round_up
from jetson_unet.ops.conv_pipe import pipelined
from jetson_unet.ops.keys import ConvKey
from jetson_unet.model.plan import Op, Tensor


HALO_SMEM_LIMIT = 76 * 1024                          # conv_halo.cu's dynamic smem: 2 CTAs per sm_87 SM (164 KB)
HALO_STAGES = 3                                      # conv_halo.cu's weight slots in flight (built-in and tuned)


@dataclass(frozen=True)
class ConvGeom:
    """What the halo conv's feasibility and shared memory depend on beyond its key."""
    cin: int
    cr: int       # residual K segment channels (0: none)
    wout: int
    norm: bool
    cout: int = 0   # output channels N (0: not checked)


def halo_smem(key: ConvKey, g: ConvGeom) -> int:
    """Dynamic smem bytes of the halo conv of `key` (its row tiles: rows_smem)."""
    return rows_smem(key, g) if key.rows else gemm_halo_smem(key, g)


def gemm_halo_smem(key: ConvKey, g: ConvGeom) -> int:
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
    if key.rows:
        return rows_problems(key, g)
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
                    bool(op.norm), t[op.out].channels)


def builtin_halo(key: ConvKey, op: Op, ctx: Ctx, ot: Tensor) -> Optional[ConvKey]:
    """The halo conv (kernels/conv_halo.cu) for `key`'s tile where the tuning files picked it: a 3x3
    conv without a residual, normalized (a block's conv1), of whole 64-channel chunks (with BK 32 it
    ran up to 1.6x slower), whose grid fills every SM twice (it never won at batch 1 on 132 SMs:
    latency chains). None elsewhere; an up2 conv takes the cp.async conv's sub-pixel form (on the
    8-SM slice 2-2.5x faster than the halo conv's 3x3 map: docs/kernels.md)."""
    if not (pipelined(ctx, key.vec) and key.kh == 3 and key.stride == 1 and not (op.residual or op.residual_conv)
            and op.norm and key.up == 1):
        return None
    geom = conv_geom(op, ctx)
    if (geom.cin % 64 or (ctx.tile_batch or ctx.batch) * cdiv(ot.size * ot.size, key.bm) * cdiv(ot.channels, key.bn)
            < 2 * ctx.sms):
        return None
    halo = dataclasses.replace(key, bk=64, stages=HALO_STAGES, halo=True)
    return None if halo_problems(halo, geom) else halo


# ---- row tiles (conv_gemm_halo_rows) ------------------------------------------------------------------

ROWS_BK = 16        # conv_gemm_halo_rows: one 16-channel chunk per stage
ROWS_MAX_SMS = 16   # builtin_rows: the GPUs whose built-in tiles take the row tiles at any batch,
ROWS_SMS_PER_SAMPLE = 4   # and larger ones from one sample per this many SMs


def rows_smem(key: ConvKey, g: ConvGeom) -> int:
    """Dynamic smem bytes of conv_gemm_halo_rows: GroupNorm table, alignment slack, `stages` x (the
    halo of TH + 2 rows of TW + 8 pixels of 32 bytes, and 9 taps x BN weight rows of 32 bytes)."""
    th, tw = key.bm // g.wout, g.wout
    return (8 * g.cin if g.norm else 0) + 128 + key.stages * ((th + 2) * (tw + 8) * 32 + 9 * key.bn * 32)


def rows_problems(key: ConvKey, g: ConvGeom) -> List[str]:
    """Why conv_gemm_halo_rows cannot run this op with this key ([] if it can)."""
    th = key.bm // g.wout if g.wout else 0
    return [msg for cond, msg in [
        (key.kh != 3 or key.stride != 1 or key.gate or key.up != 1, "3x3 stride-1 convs only"),
        (key.dtype == "fp32" or key.vec != VEC_MAX[key.dtype], "16-bit with 16-byte vectors only"),
        (key.bk != ROWS_BK or g.cin % ROWS_BK or g.cr % ROWS_BK,
         f"BK {key.bk}, Cin {g.cin}, residual {g.cr}: 16-channel chunks"),
        (16 * key.wm != g.wout, f"{key.wm} warps across a row of {g.wout} pixels (16 each)"),
        (not th or key.bm % g.wout or g.wout % th, f"BM {key.bm}: whole rows that divide the {g.wout} rows"),
        (g.cout % key.bn, f"BN {key.bn} does not divide the {g.cout} output channels (whole tiles only)"),
        ((key.bn // key.wn) % 16 or key.wm * key.wn > 16,
         f"warp tile of {key.bn // key.wn} channels, {key.threads} threads"),
        (not 2 <= key.stages <= 4, f"{key.stages} stages"),
        ((th + 2) * (g.wout + 2) * 2 > 32 * key.threads, "more than 32 halo vectors per thread (one bit mask)"),
        (rows_smem(key, g) > HALO_SMEM_LIMIT, f"{rows_smem(key, g)} B of shared memory"),
    ] if cond]


def rows_key(key: ConvKey, g: ConvGeom, th: int, bn: int, stages: int, wtn: int = 32) -> ConvKey:
    """The row-tile key of TH rows x BN channels (warps: one per 16 pixels x one per `wtn` channels)."""
    return dataclasses.replace(key, bm=th * g.wout, bn=bn, bk=ROWS_BK, wm=max(g.wout // 16, 1), wn=max(bn // wtn, 1),
                               stages=stages, halo=True, rows=True, ks=1)


def builtin_rows(key: ConvKey, op: Op, ctx: Ctx, ot: Tensor) -> Optional[ConvKey]:
    """The row tiles for a 16-bit 3x3 stride-1 conv of 32- or 64-pixel rows on a GPU of at most 16 SMs
    (the Orin's regime, where they were measured), or on a larger one from one sample per 4 SMs up: TH
    rows (4, else 2) by BN channels (64, else 32), the largest whose grid gives every SM two CTAs; 2
    stages (two CTAs of the 64x64 level's tile fit an sm_87 SM). On 132 SMs (H100) they won at batch 64
    (2.989 -> 2.787 ms a call) and lost at 16 (0.932 -> 1.022). None elsewhere: on 16-pixel rows one
    warp per row ran 3x slower than the cp.async conv with split-K at batch 1 on the 8-SM slice (45
    against 15 us)."""
    batch = ctx.tile_batch or ctx.batch
    if not (pipelined(ctx, key.vec) and key.kh == 3 and key.stride == 1 and key.up == 1 and not key.gate
            and (ctx.sms <= ROWS_MAX_SMS or ROWS_SMS_PER_SAMPLE * batch >= ctx.sms)):
        return None
    geom = conv_geom(op, ctx)
    if geom.wout < 32:
        return None
    for th in (4, 2):
        for bn in (64, 32):
            rk = rows_key(key, geom, th, bn, 2)
            if (ot.channels % bn == 0 and not rows_problems(rk, geom)
                    and batch * (ot.size // th) * (ot.channels // bn) >= 2 * ctx.sms):
                return rk
    return None

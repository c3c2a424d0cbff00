"""Launcher rules of kernels/conv_halo.cu, the halo 3x3 conv: where it can run, its dynamic shared
memory, and where the built-in tiles pick it.
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

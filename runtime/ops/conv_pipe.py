"""Launcher rules of kernels/conv_pipe.cu, the cp.async GEMM conv: its ring (stages x BK), the deep
rings in dynamic shared memory, and where it replaces conv_gemm (16-bit convs with 16-byte vectors).
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple, Union

from jetson_unet.ops.common import Ctx, SMEM_LIMIT, VEC_MAX
from jetson_unet.ops.tiles import choose_bk
from jetson_unet.ops.common import TileChoice
from jetson_unet.ops.keys import ConvKey


PIPE_STAGES = 3                                      # the built-in ring depth: s3 = s4 > s6 > conv_gemm (H100)
PIPE_RING_LIMIT = 40 * 1024                          # conv_pipe.cu's static smem ring, at most (DEEP_RING)
PIPE_DEEP_LIMIT = 76 * 1024                          # a deeper ring's dynamic smem (+ table): 2 CTAs per sm_87 SM
PIPE_SCRATCH = 3 * 1024                              # its other static smem (reductions, gate, epilogue operands)


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


def pipelined(ctx: Ctx, vec: int) -> bool:
    """Whether a 16-bit GEMM with `vec`-wide loads runs the cp.async kernels (else conv_gemm)."""
    return ctx.precision != "fp32" and vec == VEC_MAX[ctx.precision]


def with_pipeline(key: ConvKey, ctx: Ctx, dyn_smem: int) -> ConvKey:
    """`key` as the cp.async variant (PIPE_STAGES deep) where the tile allows it."""
    pipe = pipe_tile(key.dtype, key.bm, key.bn, key.vec, key.gate, PIPE_STAGES, dyn_smem, key.bk)
    return key if pipe is None else dataclasses.replace(key, bk=pipe[0], stages=pipe[1])

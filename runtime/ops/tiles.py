"""The built-in tile rules of the GEMM convs and gates (rows, columns, warps, k depth, split-K), and
`TileChoice`, one op's measured tile that replaces them (jetson_unet.ops.tuning).
"""
from __future__ import annotations

from typing import Tuple

from jetson_unet.ops.common import cdiv
from jetson_unet.errors import ConfigError


GATE_MAX_N = 256


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
        # what the tuner picked on the H100 and the H200 at batch 1 and 16 alike: N > 128
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
    # no taller than a sample's M (the GEMM is per sample): the 8x8 level (M 64) at batch 4 on 8 SMs
    # or at batch 64 on 132 took BM 128, half of each tile padding (mid.block1: 99 us on an H100's
    # 8-SM slice where a dense 64-row GEMM of the same shape took 32)
    choices = tuple(b for b in choices if b < 2 * m) or choices[-1:]
    bm = next((b for b in choices if batch * cdiv(m, b) * cdiv(n, bn) >= target), choices[-1])
    ctas = batch * cdiv(m, bm) * cdiv(n, bn)
    if pipelined and bn == 64 and ctas * choose_splits(cdiv(k, 64), ctas, sms) < target:
        # the grid stays short of two CTAs per SM even split over K (k: the GEMM's depth): twice the
        # CTAs, each a shorter chain (every batch-1 conv of a 132-SM GPU; at batch 16 the split
        # 32x64 tile was measured faster on the H100 and the H200)
        bn = 32
    if tc and bm * bn > 64 * 64:
        # 8 warps (32x32 each): 4 warps would hold 64 accumulators per thread, ~190-255 registers,
        # and measured slower at every shape where both ran
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

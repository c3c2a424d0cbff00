"""Launchers of kernels/io.cu: init_conv (the fp32 image in, on tensor cores for 16-bit) and
final_conv (eps out, with gpu mode's sampler step fused).
"""
from __future__ import annotations

import numpy as np
from typing import Any, Tuple

from jetson_unet.ops.common import (Ctx, I, OpSpec, P, Resolver, SMEM_LIMIT, b_fragments, cdiv, padded,
                                    round_up, to_device, vec_for)
from jetson_unet.errors import ConfigError
from jetson_unet.ops.keys import SimpleKey
from jetson_unet.model.plan import Op


INIT_TILE, FINAL_THREADS = 8, 128                    # io.cu
FINAL_PIXELS = 2 * FINAL_THREADS                     # final_conv: a CTA's pixels (two a thread)


def init_row(halo: int) -> int:
    """init_conv's halo-tile row stride in floats (kernels/io.cu RS): an odd multiple of 8 >= halo."""
    return 8 if halo <= 8 else 8 * (2 * ((halo - 8 + 15) // 16) + 1)


def init_tw(size: int, batch: int, sms: int) -> int:
    """init_conv's tile width: 8, or 16 where the 8-wide grid is at least 4 CTAs per SM (batch 16 on
    the H100, batch 1 on the Orin), so that each weight read from shared memory serves 2 pixels;
    a small grid keeps 8 (at batch 1 on the H100, 64 CTAs for 132 SMs)."""
    return 16 if cdiv(size, INIT_TILE) ** 2 * batch >= 4 * sms else 8


INIT_TC_THREADS, INIT_TC_TILE = 128, (4, 16)   # io.cu init_conv_tc: 4 warps over 4 rows (x init_tc_rows) x 16 columns


def init_tc_rows(size: int, batch: int, sms: int) -> int:
    """init_conv_tc's output rows per warp: 4 where the one-row grid has >= 16 CTAs per SM (batch 64
    on 132 SMs, batch 4 on 8), so that a CTA's weight staging serves 4x the pixels; else 1."""
    th, tw = INIT_TC_TILE
    return 4 if cdiv(size, th) * cdiv(size, tw) * batch >= 16 * sms else 1


def init_tc(precision: str, cin: int) -> bool:
    """Whether init_conv runs on tensor cores: 16-bit activations and an image of <= 4 channels
    (kernels/io.cu init_conv_tc; fp32 keeps the FFMA kernel, as every fp32 conv does)."""
    return precision != "fp32" and cin <= 4


def init_key(op: Op, ctx: Ctx) -> SimpleKey:
    xt = ctx.plan.tensors[op.x]
    if init_tc(ctx.precision, xt.channels):
        return SimpleKey("init_tc", ctx.precision, op.k, xt.channels,
                         cp=init_tc_rows(xt.size, ctx.tile_batch or ctx.batch, ctx.sms))
    return SimpleKey("init", ctx.precision, op.k, xt.channels, init_tw(xt.size, ctx.tile_batch or ctx.batch, ctx.sms))


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
    return to_device(b_fragments(b), precision)


def init_spec(op: Op, ctx: Ctx) -> OpSpec:
    xt, ot = ctx.plan.tensors[op.x], ctx.plan.tensors[op.out]
    cin, cout, k, size = xt.channels, ot.channels, op.k, xt.size
    key = init_key(op, ctx)
    w = np.asarray(ctx.params[op.prefix + ".weight"], dtype=np.float32)
    if key.kind == "init_tc":
        coutp = round_up(cout, 32)   # whole 32-channel passes
        wb = pack_init_tc(w, ctx.precision, coutp)
        th, tw = INIT_TC_TILE[0] * key.cp, INIT_TC_TILE[1]
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


def final_key(op: Op, ctx: Ctx) -> SimpleKey:
    cin, cout = ctx.plan.tensors[op.x].channels, ctx.plan.tensors[op.out].channels
    return SimpleKey("final", ctx.precision, cout, vec_for(ctx.precision, ctx, (op.x,), (cin,)))


def final_spec(op: Op, ctx: Ctx) -> OpSpec:
    xt, ot = ctx.plan.tensors[op.x], ctx.plan.tensors[op.out]
    cin, cout, size = xt.channels, ot.channels, ot.size
    if op.k != 1 or cout > 8 or op.norm or op.residual or op.tbias or op.act != "none":
        raise ConfigError(f"{op.out}: final_conv supports a plain 1x1 conv to <= 8 channels")
    w = np.asarray(ctx.params[op.prefix + ".weight"], dtype=np.float32).reshape(cout, cin)
    blobs = {"w": np.ascontiguousarray(w), "bias": padded(ctx.params[op.prefix + ".bias"], 8)}
    npix = ctx.batch * size * size
    key = final_key(op, ctx)

    def make_args(r: Resolver) -> Tuple[Any, ...]:
        x_ptr, ldx = r.tensor(op.x)
        out_ptr, _ = r.tensor(op.out)
        return (P(x_ptr), I(npix), I(cin), I(ldx), P(r.blob(op.out, "w")), P(r.blob(op.out, "bias")),
                P(out_ptr), I(cout), r.step, P(0), P(0), P(0), I(0), I(size * size))

    return OpSpec(op, key, (cdiv(npix, FINAL_PIXELS), 1, 1), (FINAL_THREADS, 1, 1), 0, blobs, make_args)

"""Launcher of kernels/gate.cu: the narrow attention gates (16-bit, Cg <= 64, Cg + Cr <= 128), one
warp per 16 pixel rows. Wider gates, fp32 and unaligned views run conv.cu's GEMM gate (ops.conv).
"""
from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from jetson_unet.ops.common import Ctx, F, I, OpSpec, P, Resolver, b_fragments, cdiv, to_device, vec_for
from jetson_unet.ops.keys import SimpleKey
from jetson_unet.model.plan import Op

GATE_ROWS_WARPS, GATE_ROWS_CTAS_PER_SM = 4, 8   # gate.cu: 4 warps a CTA; the grid's cap per SM


def gate_channels(op: Op, ctx: Ctx) -> Tuple[int, int]:
    """(Cg, Cr): the gate's x (and output conv) channels and its skip channels."""
    xname, skip = op.inputs
    return ctx.plan.tensors[xname].channels, ctx.plan.tensors[skip].channels


def rows_gate(op: Op, ctx: Ctx) -> bool:
    """Whether gate.cu runs this gate: 16-bit with 16-byte vectors on x, skip and the output, Cg and
    Cr multiples of 16, Cg <= 64 and Cg + Cr <= 128 (its accumulators and weights per lane)."""
    g, r = gate_channels(op, ctx)
    xname, skip = op.inputs
    return (ctx.precision != "fp32" and vec_for(ctx.precision, ctx, (xname, skip, op.out), (g, r)) == 8
            and g % 16 == 0 and r % 16 == 0 and g <= 64 and g + r <= 128)


def rows_key(op: Op, ctx: Ctx) -> SimpleKey:
    g, r = gate_channels(op, ctx)
    return SimpleKey("gate_rows", ctx.precision, 0, g, r)


def pack_gate_rows(wg: np.ndarray, wr: np.ndarray, precision: str) -> np.ndarray:
    """The B operand [k = x channels, then skip channels][n = Cg] of gate.cu in mma.m16n8k16
    B-fragment order: for k step s, n8 tile j and lane l, two u32 of (k, k + 1) = 16 s + 2 (l % 4)
    (+ 8) at column 8 j + l // 4. Returned as the 16-bit storage type, [K / 16, Cg / 8, 32, 2, 2]."""
    w = np.concatenate([np.asarray(wg, np.float32), np.asarray(wr, np.float32)], axis=1)   # [n][k]
    return to_device(b_fragments(w), precision)


def rows_spec(op: Op, ctx: Ctx) -> OpSpec:
    xname, skip = op.inputs
    g, r = gate_channels(op, ctx)
    size, p = ctx.plan.tensors[skip].size, ctx.params
    f32 = lambda k: np.asarray(p[op.prefix + k], dtype=np.float32)  # noqa: E731
    w = pack_gate_rows(np.asarray(p[op.prefix + ".gate_conv.weight"]).reshape(g, g),
                       np.asarray(p[op.prefix + ".residual_conv.weight"]).reshape(g, r), ctx.precision)
    blobs = {"w": w.reshape(-1), "bias": f32(".gate_conv.bias") + f32(".residual_conv.bias"),
             "psi": f32(".psi.weight").ravel()}
    psi_b = float(f32(".psi.bias").ravel()[0])
    m = ctx.batch * size * size
    grid = min(cdiv(cdiv(m, 16), GATE_ROWS_WARPS), ctx.sms * GATE_ROWS_CTAS_PER_SM)

    def make_args(res: Resolver) -> Tuple[Any, ...]:
        x_ptr, ldx = res.tensor(xname)
        s_ptr, lds = res.tensor(skip)
        out_ptr, ldo = res.tensor(op.out)
        return (P(x_ptr), I(ldx), P(s_ptr), I(lds), P(res.blob(op.out, "w")), P(res.blob(op.out, "bias")),
                P(res.blob(op.out, "psi")), F(psi_b), P(out_ptr), I(ldo), I(m))

    return OpSpec(op, rows_key(op, ctx), (grid, 1, 1), (32 * GATE_ROWS_WARPS, 1, 1), 0, blobs, make_args)

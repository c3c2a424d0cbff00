"""Launcher of kernels/gate.cu: the 16-bit attention gates with 16-byte vectors. The narrow ones (Cg
<= 64, Cg + Cr <= 128) one warp per 16 pixel rows (gate_rows); the wide ones (Cg of 96-256 in
multiples of 32) a CTA of Cg / 32 warps per 16 rows (gate_wide). fp32, unaligned views and other
shapes run conv.cu's GEMM gate (ops.conv).
"""
from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from jetson_unet.ops.common import Ctx, F, I, OpSpec, P, Resolver, b_fragments, cdiv, to_device, vec_for
from jetson_unet.ops.keys import SimpleKey, narrow_gate
from jetson_unet.model.plan import Op

GATE_ROWS_WARPS, GATE_ROWS_CTAS_PER_SM = 4, 8   # gate.cu: 4 warps a CTA; the grid's cap per SM


def gate_channels(op: Op, ctx: Ctx) -> Tuple[int, int]:
    """(Cg, Cr): the gate's x (and output conv) channels and its skip channels."""
    xname, skip = op.inputs
    return ctx.plan.tensors[xname].channels, ctx.plan.tensors[skip].channels


WIDE_CTAS_PER_SM = 4   # gate_wide where its grid (a CTA per 16 rows) has at most this many CTAs per SM


def wide_gate(g: int, r: int, rows: int, sms: int) -> bool:
    """gate_wide's shapes (Cg of 96-256 in multiples of 32, Cg + Cr <= 512) where its grid has at
    most WIDE_CTAS_PER_SM CTAs per SM: every CTA reads its warps' weights from L2 (48 KB a CTA for
    the 16x16 level's gate), which deep grids pay more for than the GEMM gate's round trip. H200,
    per op against the GEMM gate (tools.lab.knockout --per-op): the 8x8 level's gate (256 + 128) 5.4
    -> 3.3 us at batch 1 and 8.0 -> 5.2 at batch 4 on 8 SMs, 8.6 -> 5.5 at batch 64 on 132 (at most
    2 CTAs per SM); the 16x16 level's (128 + 64) 3.4 -> 2.6 us at batch 1 on 8 SMs (2 per SM), but
    5.8 -> 6.0 at batch 4 there (8 per SM) and 6.4 -> 6.8 at batch 64 (7.8 per SM)."""
    return g % 32 == 0 and 64 < g <= 256 and g + r <= 512 and cdiv(rows, 16) <= WIDE_CTAS_PER_SM * sms


def rows_gate(op: Op, ctx: Ctx) -> bool:
    """Whether gate.cu runs this gate: 16-bit with 16-byte vectors on x, skip and the output, Cg and
    Cr multiples of 16, and the shapes of gate_rows (keys.narrow_gate) or gate_wide (wide_gate)."""
    g, r = gate_channels(op, ctx)
    xname, skip = op.inputs
    rows = (ctx.tile_batch or ctx.batch) * ctx.plan.tensors[skip].size ** 2
    return (ctx.precision != "fp32" and vec_for(ctx.precision, ctx, (xname, skip, op.out), (g, r)) == 8
            and g % 16 == 0 and r % 16 == 0 and (narrow_gate(g, r) or wide_gate(g, r, rows, ctx.sms)))


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
    if narrow_gate(g, r):
        grid, block = min(cdiv(cdiv(m, 16), GATE_ROWS_WARPS), ctx.sms * GATE_ROWS_CTAS_PER_SM), 32 * GATE_ROWS_WARPS
    else:
        grid, block = cdiv(m, 16), g

    def make_args(res: Resolver) -> Tuple[Any, ...]:
        x_ptr, ldx = res.tensor(xname)
        s_ptr, lds = res.tensor(skip)
        out_ptr, ldo = res.tensor(op.out)
        return (P(x_ptr), I(ldx), P(s_ptr), I(lds), P(res.blob(op.out, "w")), P(res.blob(op.out, "bias")),
                P(res.blob(op.out, "psi")), F(psi_b), P(out_ptr), I(ldo), I(m))

    return OpSpec(op, rows_key(op, ctx), (grid, 1, 1), (block, 1, 1), 0, blobs, make_args)

"""Which kernel family runs each op of the plan, and its OpSpec; every instantiation a module needs.
"""
from __future__ import annotations

from typing import Any, List, Sequence

from jetson_unet.ops.common import Ctx, OpSpec, check_div_range
from jetson_unet.ops.conv import gate_key, gate_spec, gemm_conv_spec, gemm_key
from jetson_unet.ops.dwconv import dwconv_key, dwconv_spec
from jetson_unet.ops.io import final_spec, init_key, init_spec
from jetson_unet.errors import ConfigError
from jetson_unet.model.plan import CONV, GATE, Op, Plan


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
        sub = Ctx(ctx.plan, ctx.params, ctx.precision, ctx.batch, ctx.sms, ctx.views, tile_batch=b)
        keys.update(fn(op, sub) for op, fn in keyed if fn)
    return sorted(keys, key=lambda k: k.symbol)

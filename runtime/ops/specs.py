"""Which kernel family runs each op of the plan, and its OpSpec; every instantiation a module needs.
"""
from __future__ import annotations

from typing import Any, List, Mapping, Sequence, Tuple

from jetson_unet.ops.common import Ctx, OpSpec, check_div_range, memoized
from jetson_unet.ops.conv import gate_key, gate_spec, gemm_conv_spec, gemm_key
from jetson_unet.ops.conv_halo import ROWS_MAX_SMS
from jetson_unet.ops.dwconv import dwconv_key, dwconv_spec
from jetson_unet.ops.io import final_key, final_spec, init_key, init_spec
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


KEY_OF = {"gate": gate_key, "init": init_key, "final": final_key, "dwconv": dwconv_key, "gemm": gemm_key}


def op_key(op: Op, ctx: Ctx) -> Any:
    """op_spec(op, ctx).key, without packing the op's weights."""
    return KEY_OF[kernel_kind(op, ctx.plan)](op, ctx)


# The (batch, SM count) grid of every module: batch 1..64 on the 8 SMs of an Orin Nano and the 132 of an
# H100 / H200. The rules compare batch x CTAs with multiples of the SM count, so a key depends on batch / SMs
# alone; these ratios (1/132 .. 8) reach every tile the rules pick for the shipped model from batch 1 on
# 256 SMs to batch 64 on one SM (tests/host/test_shipped_cubins.py checks GPUs' SM counts against it).
# One rule also has a threshold on the SM count itself (the halo conv's row tiles up to ROWS_MAX_SMS):
# its largest SM count joins the grid, so that every count up to it finds its ratios there.
MODULE_BATCHES = (1, 2, 4, 8, 16, 32, 64)
MODULE_SMS = (8, ROWS_MAX_SMS, 132)
Tuned = Sequence[Tuple[int, Mapping[str, Any]]]   # (batch, tiles) of each tuning file of the run's SM count


def all_tile_keys(ctx: Ctx, tuned: Tuned = ()) -> List[Any]:
    """Every instantiation the tile rules pick for this plan and precision on the grid MODULE_BATCHES x
    MODULE_SMS, and those of the measured tiles `tuned` (a file whose tiles do not fit is left out): one
    module per (config, precision) then serves every batch size and SM count (one compile, one cache
    entry, one shipped cubin per arch)."""
    memo = ("all_tile_keys", ctx.precision, ctx.batch, ctx.sms,
            tuple((b, tuple(sorted(tiles.items()))) for b, tiles in tuned))
    return list(memoized(ctx, memo, lambda: _tile_keys(ctx, tuned)))


def _tile_keys(ctx: Ctx, tuned: Tuned) -> List[Any]:
    ops = [op for op in ctx.plan.ops if op.kind in (CONV, GATE)]
    subs = [Ctx(ctx.plan, ctx.params, ctx.precision, ctx.batch, s, ctx.views, tile_batch=b)
            for s in MODULE_SMS for b in MODULE_BATCHES]
    keys = {op_key(op, sub) for sub in subs for op in ops}
    for b, tiles in tuned:
        sub = Ctx(ctx.plan, ctx.params, ctx.precision, b, ctx.sms, ctx.views, tiles=dict(tiles))
        try:
            keys.update([op_key(op, sub) for op in ops])
        except ConfigError:   # refused by a run that names that file, not by every other run
            continue
    return sorted(keys, key=lambda k: k.symbol)


def module_keys(ctx: Ctx, tuned: Tuned = ()) -> List[Any]:
    """The instantiations of a run's module: all_tile_keys, and the run's own (its batch, SM count and
    tiles) where they fall outside the grid."""
    own = {op_key(op, ctx) for op in ctx.plan.ops if op.kind in (CONV, GATE)}
    return sorted(set(all_tile_keys(ctx, tuned)) | own, key=lambda k: k.symbol)

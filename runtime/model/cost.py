"""FLOPs and minimum bytes of every op of the plan (a multiply-add counts as 2 FLOPs).

Minimum bytes = each input and residual read once, the weights read once, the output written
once, in the activation dtype (weights in the parameter dtype): the floor no kernel can beat.
Used by the roofline tool and the benchmarks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

from jetson_unet.model import plan as P
from jetson_unet.model.plan import Op, Plan


@dataclass(frozen=True)
class OpCost:
    name: str
    op_class: str      # conv3x3, conv1x1, conv7x7, dwconv7x7, gate
    flops: float       # per sample
    act_elems: float   # activation elements read + written, per sample
    weight_elems: float


def _numel(plan: Plan, name: str) -> int:
    return plan.tensors[name].numel


def op_cost(plan: Plan, op: Op) -> OpCost:
    out = plan.tensors[op.out]
    hw = out.size * out.size
    if op.kind == P.CONV:
        w = plan.params[op.prefix + ".weight"]
        cout, cin_g, k, _ = w
        flops = 2.0 * hw * cout * cin_g * k * k
        weights = cout * cin_g * k * k + cout
        acts = _numel(plan, op.x) + out.numel
        if op.residual:
            acts += _numel(plan, op.residual)
            if op.residual_conv:
                rw = plan.params[op.residual_conv + ".weight"]
                flops += 2.0 * hw * rw[0] * rw[1]
                weights += rw[0] * rw[1] + rw[0]
        cls = f"dwconv{k}x{k}" if op.groups > 1 else f"conv{k}x{k}"
        return OpCost(op.out, cls, flops, acts, weights)
    if op.kind == P.GATE:
        g, r = plan.tensors[op.inputs[0]].channels, plan.tensors[op.inputs[1]].channels
        flops = 2.0 * hw * (g * g + r * g + g) + hw * r
        acts = _numel(plan, op.inputs[0]) + 2 * _numel(plan, op.inputs[1])
        return OpCost(op.out, "gate", flops, acts, g * g + r * g + g + 2 * g + 1)
    raise ValueError(f"no cost model for op kind {op.kind!r}")


def plan_costs(plan: Plan) -> List[OpCost]:
    """Per-op costs of one U-Net call (cat ops cost nothing: they are views)."""
    return [op_cost(plan, op) for op in plan.ops if op.kind != P.CAT]


def totals(plan: Plan, batch: int = 1, act_bytes: int = 2, weight_bytes: int = 2) -> Dict[str, float]:
    costs = plan_costs(plan)
    return {
        "flops": batch * sum(c.flops for c in costs),
        "bytes": batch * sum(c.act_elems for c in costs) * act_bytes + sum(c.weight_elems for c in costs) * weight_bytes,
        "ops": float(len(costs)),
    }

"""The rounds of tile variants that tests/gpu/test_gpu_tile_variants.py runs, and how it finds their
launches: plain helpers (no GPU), so that a CPU test (tests/test_tune_tiles.py) checks them on the
fake backend."""
from __future__ import annotations

import dataclasses
import re

from jetson_unet.model.arena import view_layout
from jetson_unet.model.plan import build_plan
from jetson_unet.ops.common import Ctx
from jetson_unet.ops.conv_pipe import deep, deep_ring
from jetson_unet.ops.specs import op_spec
from jetson_unet.ops.tuning import candidates, tunable


def deep_symbol(symbol: str) -> bool:
    m = re.search(r"_(\d+)x(\d+)x(\d+)_\d+x\d+_v\d+_s(\d+)(_k\d+)?(_f)?_x\w+$", symbol)
    return bool(m) and deep(*(int(g) for g in m.groups()[:4]))


# kind -> (its variants of an op's candidates, whether a kernel symbol is of the kind, also with split-K)
KINDS = {"halo": (lambda c, op: [t for t in c if t.halo == 1], re.compile(r"_h\d+(_f)?_x\w+$").search, True),
         # the halo conv's row tiles (no split-K)
         "rows": (lambda c, op: [t for t in c if t.halo == 2], re.compile(r"_r\d+(_f)?_x\w+$").search, False),
         "k slices": (lambda c, op: [t for t in c if t.ks > 1], re.compile(r"_k\d+(_f)?_x\w+$").search, True),
         "deep ring": (lambda c, op: [t for t in c if deep_ring(t)], deep_symbol, True),
         # up2 convs on the cp.async conv: its sub-pixel 2x2 form (ops.conv.subpixel)
         "sub-pixel": (lambda c, op: [t for t in c if op.in_map == "up2" and t.stages and not t.halo],
                       re.compile(r"^conv2x2s1u2_").search, True)}


def halo_rounds(weights, precision: str, batch: int, sms: int, kind: str = "halo"):
    """[{op: TileChoice}, ...]: round r gives every op that can run `kind` its r-th candidate of that
    kind (then the first one again with 3 splits, where the kind allows split-K), and the kernel keys
    of all rounds (one module)."""
    plan = build_plan(weights.config)
    ctx = Ctx(plan, weights.params, precision, batch, sms, view_layout(plan))
    variants, _, splits = KINDS[kind]
    per_op = {op.out: variants(candidates(op, ctx), op) for op in plan.ops if tunable(op, ctx)}
    per_op = {n: c + ([dataclasses.replace(c[0], splits=3)] if splits else []) for n, c in per_op.items() if c}
    width = max(len(c) for c in per_op.values())
    rounds = [{n: c[r] for n, c in per_op.items() if r < len(c)} for r in range(width)]
    ops_by_name = {op.out: op for op in plan.ops}
    keys = {op_spec(ops_by_name[n], dataclasses.replace(ctx, tiles={n: t})).key
            for rnd in rounds for n, t in rnd.items()}
    return rounds, sorted(keys, key=lambda k: k.symbol)


def halo_symbols(ex, kind: str = "halo", names=None) -> list:
    """The symbols of ex's launches of the kind (of the ops in `names` only, where given: the
    built-in tiles of the others may be of the kind too, as the sub-pixel up2 convs are)."""
    return [L.fn.symbol for L in ex.launches if KINDS[kind][1](L.fn.symbol) and (names is None or L.name in names)]

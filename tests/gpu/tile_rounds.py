"""The rounds of tile variants that tests/gpu/test_gpu_tile_variants.py runs, and how it finds their
launches: plain helpers (no GPU), so that a CPU test (tests/test_tune_tiles.py) checks them on the
fake backend."""
from __future__ import annotations

import dataclasses
import re

from runtime.gpu.executor import view_layout
from runtime.gpu.ops import Ctx, op_spec
from runtime.gpu.tuning import candidates, tunable, with_mts
from runtime.plan import CONV, build_plan


def mt_variants(cands: list, op) -> list:
    """A conv's cp.async tiles of 3 stages with 2 M tiles per CTA (the tuner's --mt rounds), the
    first of them also with 3; none for gates."""
    two = [v for t in cands if t.stages == 3 for v in with_mts(t, (2,))] if op.kind == CONV else []
    return two[:6] + [dataclasses.replace(two[0], mt=3)] if two else []


# kind -> (its variants of an op's candidates, the symbol suffix of its kernels, also with split-K)
KINDS = {"halo": (lambda c, op: [t for t in c if t.halo], r"_h\d+(_f)?$", True),
         "k slices": (lambda c, op: [t for t in c if t.ks > 1], r"_k\d+(_f)?$", True),
         "M tiles per CTA": (mt_variants, r"_p$", False)}


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


def halo_symbols(ex, kind: str = "halo") -> list:
    return [L.fn.symbol for L in ex.launches if re.search(KINDS[kind][1], L.fn.symbol)]

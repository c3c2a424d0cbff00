"""Measure the tile of every GEMM conv and gate on this GPU and write the fastest per op to a tuning
file (runtime/gpu/tuning.py) that GpuExecutor(tiles=...) uses instead of the built-in guess.

    python tools/tune_tiles.py --precision fp16 --batch 1 16

The files go where the executor looks for them (runtime/gpu/tuning.py: $JETSON_UNET_TILES, else
~/.cache/jetson-unet/tiles), named after the GPU, SM count, precision and batch; from then on every
executor of that batch on that GPU uses them (`--out-dir` writes elsewhere).

Method: every candidate tile of every op is compiled into one module (one NVRTC build); round r
builds an executor whose ops each take their r-th candidate and times every GEMM/gate launch alone
(a CUDA graph of 20 back-to-back launches, median of 3 windows; tools/bench_unet.per_op_times).
Then the split-K factors of each op's fastest few tile shapes (`--split-top`, default 3) are timed the
same way (a tile that loses at the heuristic's split can win at another: session 28 of
docs/perf-notes.md), and with `--mt` each count of
M tiles per CTA of the best tile of every conv that can run several (kernels/conv_pipe.cu PERSIST;
no split-K with them); for each of these two kinds one line says on how many ops it won and how near
its best came on the others (the file's "variant_us"). Last, the whole call is timed
as a graph replay with the heuristic tiles and with the tuned ones, side by side, and the eps of
the two are compared (relative L2; the tiles change the summation order only).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_unet import bench_weights, per_op_times, timed  # noqa: E402
from jetson_unet.backends import get_backend  # noqa: E402
from jetson_unet.executor.executor import GpuExecutor, device_sm_count, view_layout  # noqa: E402
from jetson_unet.ops.common import Ctx
from jetson_unet.ops.specs import op_spec  # noqa: E402
from jetson_unet.ops.tuning import candidates, dump_tiles, file_name, k_segments, tiles_dirs, tunable, with_mts, with_splits  # noqa: E402
from jetson_unet.model.plan import CONV, build_plan  # noqa: E402


def graph_ms(ex, backend, x, iters: int = 100) -> float:
    ex.eps(x, 50)
    s, tp = ex.stream, ex.t_row_ptr(50)
    backend.capture_begin(s)
    ex.run(s, tp)
    g = backend.capture_end(s)
    return timed(backend, s, lambda: g.launch(s), 20, iters, 3)


def time_rounds(weights, precision, batch, backend, rounds, names, extra) -> dict:
    """{op: [(us, TileChoice), ...]} over executors built with each round's tiles."""
    seen = {n: [] for n in names}
    for i, tiles in enumerate(rounds):
        t0 = time.perf_counter()
        with GpuExecutor(weights, precision, batch=batch, backend=backend, tiles=tiles, extra_keys=extra) as ex:
            for name, _sym, _grid, us in per_op_times(ex, backend, only=set(tiles)):
                seen[name].append((us, tiles[name]))
        print(f"  round {i + 1}/{len(rounds)}: {len(tiles)} ops, {time.perf_counter() - t0:.1f} s", flush=True)
    return seen


def as_rounds(cands: dict) -> list:
    """Round r: every op's r-th candidate (ops with fewer sit out)."""
    width = max((len(c) for c in cands.values()), default=0)
    return [{n: c[r] for n, c in cands.items() if r < len(c)} for r in range(width)]


def variant_summary(batch: int, label: str, rec: dict) -> str:
    """One line: on how many ops a variant kind won, and the spread of its best time against each
    op's best without it (negative: faster)."""
    pct = sorted(100.0 * (r["best"] / r["without"] - 1.0) for r in rec.values())
    return (f"b{batch} {label}: faster on {sum(p < 0 for p in pct)} of {len(pct)} ops; its best against the "
            f"op's best without it: median {pct[len(pct) // 2]:+.1f}% ({pct[0]:+.1f}% .. {pct[-1]:+.1f}%)")


def top_shapes(timings: list, n: int) -> list:
    """The fastest variant of each of the n fastest tile shapes (BM, BN, warps, halo, k slices) of an
    op's [(us, TileChoice)], fastest first."""
    out, shapes = [], set()
    for _us, t in sorted(timings, key=lambda r: r[0]):
        shape = (t.bm, t.bn, t.wm, t.wn, t.halo, t.ks)
        if shape not in shapes:
            shapes.add(shape)
            out.append(t)
    return out[:n]


def tune(weights, precision: str, batch: int, backend, extra: list, cands: dict, ksegs: dict, mts: dict,
         out_dir: Path, split_top: int = 3) -> dict:
    """mts: {op: [M tiles per CTA to try]} for the ops that can run several; split_top: how many of
    each op's fastest tile shapes get the split-K rounds."""
    names = list(cands)
    rounds = as_rounds(cands)
    print(f"b{batch}: {len(names)} ops, {len(rounds)} tile rounds", flush=True)
    seen = time_rounds(weights, precision, batch, backend, rounds, names, extra)
    best = {n: min(seen[n], key=lambda r: r[0]) for n in names}
    heur = {n: seen[n][0][0] for n in names}   # candidate 0 is the heuristic's tile
    variant_us = {}   # {kind: {op: {"without": us, "best": us}}}: how near a kind came where it lost
    kinds = (("split-K", lambda n: [v for t in top_shapes(seen[n], split_top) for v in with_splits(t, ksegs[n])]),
             ("M tiles per CTA", lambda n: with_mts(best[n][1], mts.get(n, ()))))   # of the best after split-K
    for label, variants in kinds:
        rounds = as_rounds({n: [t for t in variants(n) if t != best[n][1]] for n in names})
        print(f"b{batch}: {len(rounds)} {label} rounds", flush=True)
        rec = variant_us[label] = {}
        for n, rs in time_rounds(weights, precision, batch, backend, rounds, names, extra).items():
            if rs:
                top = min(rs, key=lambda r: r[0])
                rec[n] = {"without": best[n][0], "best": top[0]}
                if top[0] < best[n][0]:
                    best[n] = top
        if rec:
            print(variant_summary(batch, label, rec), flush=True)
    tiles = {n: best[n][1] for n in names}

    cfg = weights.config
    x = np.random.default_rng(0).standard_normal((batch, cfg.channels, cfg.image_size, cfg.image_size)).astype(np.float32)
    with GpuExecutor(weights, precision, batch=batch, backend=backend, tiles={}, extra_keys=extra) as ex:
        base_ms, base_eps = graph_ms(ex, backend, x), ex.eps(x, 50)
    with GpuExecutor(weights, precision, batch=batch, backend=backend, tiles=tiles, extra_keys=extra) as ex:
        tuned_ms, tuned_eps = graph_ms(ex, backend, x), ex.eps(x, 50)
    rel = float(np.linalg.norm(tuned_eps - base_eps) / max(float(np.linalg.norm(base_eps)), 1e-30))
    print(f"b{batch} {precision}: graph {base_ms:.3f} ms heuristic -> {tuned_ms:.3f} ms tuned "
          f"({base_ms / tuned_ms:.2f}x); eps rel L2 {rel:.1e}; per op (us, heuristic -> tuned):")
    for n in sorted(names, key=lambda n: heur[n] - best[n][0], reverse=True):
        t = best[n][1]
        print(f"  {heur[n]:7.2f} -> {best[n][0]:7.2f}  {n:28s} {t.bm}x{t.bn}x{t.bk} {t.wm}x{t.wn} "
              f"{'h' if t.halo else 's'}{t.stages}{f' k{t.ks}' if t.ks > 1 else ''}"
              f"{f' mt{t.mt}' if t.mt > 1 else ''} split {t.splits or '-'}")
    sms = device_sm_count(backend)
    meta = {"device": backend.device_name(), "sms": sms, "precision": precision, "config": cfg.to_dict(),
            "batch": batch, "graph_ms_heuristic": base_ms, "graph_ms_tuned": tuned_ms, "eps_rel_l2": rel,
            "op_us": {n: {"heuristic": heur[n], "tuned": best[n][0]} for n in names}, "variant_us": variant_us,
            "measured_by": "python3 tools/tune_tiles.py " + " ".join(sys.argv[1:])}
    path = out_dir / file_name(meta["device"], sms, precision, batch)
    dump_tiles(path, tiles, meta)
    print(f"wrote {path}")
    return meta


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precision", default="fp16", choices=("fp32", "fp16", "bf16"))
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--out-dir", default="", help="where the tuning files go (default: where the executor looks, "
                    "$JETSON_UNET_TILES or ~/.cache/jetson-unet/tiles)")
    ap.add_argument("--json", default="", help="also write the measurements to this JSON file")
    ap.add_argument("--split-top", type=int, default=3, metavar="N",
                    help="time the split-K factors of each op's N fastest tile shapes (default 3)")
    ap.add_argument("--mt", type=int, nargs="*", default=[], metavar="N",
                    help="also time N M tiles per CTA of each conv's best cp.async tile (e.g. --mt 2 4)")
    args = ap.parse_args(argv)
    if args.split_top < 1:
        ap.error(f"--split-top must be at least 1, got {args.split_top}")   # exit 2, before any GPU work
    backend = get_backend("cupy")
    weights, _ = bench_weights()
    out_dir = Path(args.out_dir) if args.out_dir else tiles_dirs()[0]
    out_dir.mkdir(parents=True, exist_ok=True)
    plan, sms = build_plan(weights.config), device_sm_count(backend)
    per_batch, extra = {}, set()
    for b in args.batch:   # every candidate of every batch in one module: one NVRTC build for all rounds
        ctx = Ctx(plan, weights.params, args.precision, b, sms, view_layout(plan))
        cands, ksegs, mts = {}, {}, {}
        for op in plan.ops:
            if not tunable(op, ctx):
                continue
            cands[op.out] = candidates(op, ctx)
            mts[op.out] = args.mt if op.kind == CONV else []
            for t in cands[op.out]:   # and its kernel with several M tiles per CTA (one for every count)
                for tt in [t] + with_mts(t, mts[op.out])[:1]:
                    spec = op_spec(op, Ctx(plan, weights.params, args.precision, b, sms, view_layout(plan),
                                           tiles={op.out: tt}))
                    extra.add(spec.key)
            ksegs[op.out] = k_segments(op, ctx)
        per_batch[b] = (cands, ksegs, mts)
    extra = sorted(extra, key=lambda k: k.symbol)
    print(f"device: {backend.device_name()} ({sms} SMs); {len(extra)} candidate kernels", flush=True)
    t0 = time.perf_counter()
    GpuExecutor(weights, args.precision, batch=1, backend=backend, tiles={}, extra_keys=extra).close()
    print(f"module built in {time.perf_counter() - t0:.1f} s", flush=True)
    results = [tune(weights, args.precision, b, backend, extra, *per_batch[b], out_dir, args.split_top)
               for b in args.batch]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

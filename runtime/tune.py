"""`jetson-tune`: measure the tile of every GEMM conv and gate on this GPU and write the fastest per op
to a tuning file (jetson_unet.ops.tuning) that the executor then uses instead of the built-in tiles.

    jetson-tune --precision fp16 --batch 1 16

The files go where the executor looks for them (jetson_unet.paths.user_tiles_dir: $JETSON_UNET_TILES,
else $XDG_CACHE_HOME/jetson-unet/tiles, ~/.cache by default), named after the GPU, SM count,
precision and batch; from then on every executor of that batch on that GPU uses them (`--out-dir`
writes elsewhere).

Method: every candidate tile of every op (jetson_unet.ops.tuning.candidates) is compiled once for all
rounds, split into one module per core and compiled side by side (build_shards); round r builds an
executor whose ops each take their r-th candidate and times every GEMM/gate launch alone (a CUDA
graph of 20 back-to-back launches, median of 3 event-timed windows;
jetson_unet.bench.timing.per_op_times). Then the split-K factors of each
op's fastest few tile shapes (`--split-top`, default 3) are timed the same way, their kernels (a
kernel knows its op's split) compiled once, side by side, before those rounds: a tile that loses at
the built-in split can win at another (on an H100 at batch 16, downs.2.block1.conv1 went from 9.41
to 8.21 us as a 32x64 tile unsplit, where the built-in rule splits it in two and the 32x32 tile had
won the tile round). One line says on how many ops split-K won and how near its best came on the
others (the file's "variant_us"). Last, the whole call is timed as a graph replay with the built-in
tiles, the tuned ones and the tiles in use (the file this run would replace, else the one the
executor finds: an earlier tune, the shipped default for this GPU, or a neighbouring batch's file
as this batch runs it), in turns, three rounds, and
the fastest is what the file holds: the tuned tiles, or the built-in ones, or nothing written where
the tiles in use win (tiles that each time faster alone can run the call slower). The eps of the
chosen tiles is compared with the built-in ones' (relative L2; the tiles change the summation order
only).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from jetson_unet import logs
from jetson_unet.backends import get_backend
from jetson_unet.bench.timing import bench_weights, per_op_times, timed
from jetson_unet.cli import _Parser, _run, add_verbosity, number, set_verbosity
from jetson_unet.files import atomic_open, check_writable, writing
from jetson_unet.executor.executor import GpuExecutor
from jetson_unet.model.arena import view_layout
from jetson_unet.model.plan import build_plan
from jetson_unet.ops.common import Ctx, TileChoice
from jetson_unet.ops.policy import BUILTIN, KernelPolicy, run_context
from jetson_unet.ops.specs import module_keys, op_key
from jetson_unet.ops.tuning import (candidates, dump_tiles, file_name, find_tiles, k_segments, tiles_dirs, tunable,
                                    with_splits)
from jetson_unet.paths import user_tiles_dir
from jetson_unet.sampling.host import available_bytes

PROG = "jetson-tune"
# one NVRTC compile of an ~18-kernel module peaked at ~200 MB (pip NVRTC 12, x86-64): twice that, and more
SHARD_BYTES = 512 << 20
CALL_ROUNDS = 3   # whole-call timings per tile set, alternated (time_calls)
POLICY_LOG = "jetson_unet.ops.policy"   # where executors say which tiles they run


def graph_ms(ex: GpuExecutor, backend: Any, x: np.ndarray, iters: int = 100) -> float:
    """ms per call of the executor's whole call, captured once as a CUDA graph and replayed."""
    ex.eps(x, 50)
    s, tp = ex.stream, ex.t_row_ptr(50)
    backend.capture_begin(s)
    ex.run(s, tp)
    g = backend.capture_end(s)
    return timed(backend, s, lambda: g.launch(s), 20, iters, 3)


def time_calls(weights: Any, precision: str, batch: int, backend: Any, calls: Dict[str, KernelPolicy],
               extra: Sequence[Any], shards: int, memo: Dict[Any, Any],
               rounds: int = CALL_ROUNDS) -> Tuple[Dict[str, float], Dict[str, np.ndarray]]:
    """({label: median ms per call}, {label: eps}) of each policy's tiles, the labels taking turns for
    `rounds` rounds, each round a fresh executor: per-op picks can lose as a whole call (code size,
    L2), and one timing of one executor carries a percent of noise."""
    cfg = weights.config
    x = np.random.default_rng(0).standard_normal((batch, cfg.channels, cfg.image_size, cfg.image_size)).astype(np.float32)
    ms: Dict[str, List[float]] = {k: [] for k in calls}
    eps: Dict[str, np.ndarray] = {}
    with logs.muted(POLICY_LOG):   # which tiles each runs: settle_file says so once
        for _ in range(rounds):
            for label, policy in calls.items():
                with GpuExecutor(weights, precision, batch=batch, backend=backend, policy=policy,
                                 extra_keys=extra, shards=shards, memo=memo) as ex:
                    ms[label].append(graph_ms(ex, backend, x))
                    if label not in eps:
                        eps[label] = ex.eps(x, 50)
    return {k: float(np.median(v)) for k, v in ms.items()}, eps


def tile_key(ops: Dict[str, Any], ctx: Ctx, name: str, tile: TileChoice) -> Any:
    """The kernel key of op `name` (of `ops`) with `tile`."""
    return op_key(ops[name], dataclasses.replace(ctx, tiles={name: tile}))


def build_modules(weights: Any, precision: str, backend: Any, keys: Sequence[Any], shards: int,
                  memo: Dict[Any, Any]) -> float:
    """Compile the modules of `keys` (build_shards modules, side by side) by building an executor
    that carries them; every later executor with the same extra keys loads them. Returns seconds."""
    t0 = time.perf_counter()
    GpuExecutor(weights, precision, batch=1, backend=backend, policy=KernelPolicy(tiles=BUILTIN),
                extra_keys=keys, shards=shards, memo=memo).close()
    return time.perf_counter() - t0


def build_shards(cpus: Optional[int] = None, available: Optional[int] = None) -> int:
    """Modules the candidate kernels are split into and compiled side by side (build.loader.KernelSet):
    one per core, at most 16, and no more than the host memory holds at SHARD_BYTES each. One value
    per run: the split decides the modules' text, so every executor of the run must use the same."""
    cpus = (os.cpu_count() or 1) if cpus is None else cpus
    free = available_bytes() if available is None else available
    return int(max(1, min(cpus, 16, cpus if free is None else free // SHARD_BYTES)))


def time_rounds(weights: Any, precision: str, batch: int, backend: Any, rounds: List[Dict[str, TileChoice]],
                names: Sequence[str], extra: Sequence[Any], shards: int = 1,
                memo: Optional[Dict[Any, Any]] = None) -> Dict[str, list]:
    """{op: [(us, TileChoice), ...]} over executors built with each round's tiles (memo: GpuExecutor's,
    one for the run)."""
    seen: Dict[str, list] = {n: [] for n in names}
    for i, tiles in enumerate(rounds):
        t0 = time.perf_counter()
        with GpuExecutor(weights, precision, batch=batch, backend=backend, policy=KernelPolicy(tiles=tiles),
                         extra_keys=extra, shards=shards, memo=memo) as ex:
            for name, _sym, _grid, us in per_op_times(ex, backend, only=set(tiles)):
                seen[name].append((us, tiles[name]))
        print(f"  round {i + 1}/{len(rounds)}: {len(tiles)} ops, {time.perf_counter() - t0:.1f} s", flush=True)
    return seen


def as_rounds(cands: Dict[str, List[TileChoice]]) -> List[Dict[str, TileChoice]]:
    """Round r: every op's r-th candidate (ops with fewer sit out)."""
    width = max((len(c) for c in cands.values()), default=0)
    return [{n: c[r] for n, c in cands.items() if r < len(c)} for r in range(width)]


def variant_summary(batch: int, label: str, rec: Dict[str, Dict[str, float]]) -> str:
    """One line: on how many ops a variant kind won, and the spread of its best time against each
    op's best without it (negative: faster)."""
    pct = sorted(100.0 * (r["best"] / r["without"] - 1.0) for r in rec.values())
    return (f"b{batch} {label}: faster on {sum(p < 0 for p in pct)} of {len(pct)} ops; its best against the "
            f"op's best without it: median {pct[len(pct) // 2]:+.1f}% ({pct[0]:+.1f}% .. {pct[-1]:+.1f}%)")


def tile_label(t: TileChoice) -> str:
    """A tile as the tuner prints it: BMxBNxBK, warps, the kernel (s: cp.async ring, h: halo conv, r:
    its row tiles) with its stages, k slices, split-K."""
    return (f"{t.bm}x{t.bn}x{t.bk} {t.wm}x{t.wn} {({2: 'r', 1: 'h'}).get(t.halo, 's')}{t.stages}"
            f"{f' k{t.ks}' if t.ks > 1 else ''} split {t.splits or '-'}")


def top_shapes(timings: list, n: int) -> List[TileChoice]:
    """The fastest variant of each of the n fastest tile shapes (BM, BN, warps, halo, k slices) of an
    op's [(us, TileChoice)], fastest first."""
    out, shapes = [], set()
    for _us, t in sorted(timings, key=lambda r: r[0]):
        shape = (t.bm, t.bn, t.wm, t.wn, t.halo, t.ks)
        if shape not in shapes:
            shapes.add(shape)
            out.append(t)
    return out[:n]


def tune(weights: Any, precision: str, batch: int, backend: Any, extra: Sequence[Any],
         cands: Dict[str, List[TileChoice]], ksegs: Dict[str, List[int]], key_of: Callable[[str, TileChoice], Any],
         out_dir: Path, split_top: int = 3, command: str = PROG, shards: int = 1,
         memo: Optional[Dict[Any, Any]] = None) -> Dict[str, Any]:
    """Time the candidates, then the split-K factors of each op's `split_top` fastest tile shapes;
    then the whole call with the built-in tiles, the tuned ones and the tiles in use (the file this
    run would replace, else the one the executor finds), and write the fastest as the tuning file
    of this batch into out_dir (nothing where the tiles in use win). Returns what the file records,
    plus `candidate_us`: every tile timed per op, fastest first (the --json report only).
    `extra`: the candidates' kernel keys (built); key_of(op, tile): the key of one more tile of an op."""
    memo = {} if memo is None else memo
    names = list(cands)
    rounds = as_rounds(cands)
    print(f"b{batch}: {len(names)} ops, {len(rounds)} tile rounds", flush=True)
    seen = time_rounds(weights, precision, batch, backend, rounds, names, extra, shards, memo)
    best = {n: min(seen[n], key=lambda r: r[0]) for n in names}
    heur = {n: seen[n][0] for n in names}   # candidate 0 is the built-in rule's tile
    splits = {n: [v for t in top_shapes(seen[n], split_top) for v in with_splits(t, ksegs[n]) if v != best[n][1]]
              for n in names}
    # a kernel knows its op's split: the split rounds' kernels, built once before them, side by side
    # (left to the rounds, each round's executor built a module set of its own: 15-30 s a round, H200)
    extra = sorted(set(extra) | {key_of(n, t) for n, ts in splits.items() for t in ts} |
                   in_use_keys(weights, precision, batch, backend, out_dir, memo), key=lambda k: k.symbol)
    secs = build_modules(weights, precision, backend, extra, shards, memo)
    rounds = as_rounds(splits)
    print(f"b{batch}: {len(rounds)} split-K rounds ({len(extra)} kernels built in {secs:.1f} s)", flush=True)
    rec: Dict[str, Dict[str, float]] = {}   # how near split-K came where it lost
    split_seen = time_rounds(weights, precision, batch, backend, rounds, names, extra, shards, memo)
    for n, rs in split_seen.items():
        if rs:
            top = min(rs, key=lambda r: r[0])
            rec[n] = {"without": best[n][0], "best": top[0]}
            if top[0] < best[n][0]:
                best[n] = top
    if rec:
        print(variant_summary(batch, "split-K", rec), flush=True)
    meta = {"device": backend.device_name(), "sms": backend.sm_count(), "precision": precision,
            "config": weights.config.to_dict(), "batch": batch,
            "op_us": {n: {"heuristic": heur[n][0], "tuned": best[n][0]} for n in names},
            "variant_us": {"split-K": rec}, "measured_by": command}
    if getattr(backend, "slice", None) is not None:   # tiles for a small GPU, measured on a large one's slice
        meta["measured_on"] = f"a green-context slice of {backend.slice.describe()}"
    print(f"b{batch} {precision}, per op (us, built-in -> tuned):")
    for n in sorted(names, key=lambda n: heur[n][0] - best[n][0], reverse=True):
        print(f"  {heur[n][0]:7.2f} -> {best[n][0]:7.2f}  {n:28s} {tile_label(best[n][1])}")
    settle_file(weights, precision, batch, backend, {n: best[n][1] for n in names}, {n: heur[n][1] for n in names},
                meta, out_dir, extra, shards, memo)
    timed = {n: sorted((us, tile_label(t)) for us, t in seen[n] + split_seen.get(n, [])) for n in names}
    return dict(meta, candidate_us={n: [[round(us, 3), label] for us, label in timed[n]] for n in names})


def in_use_dirs(out_dir: Path) -> List[Path]:
    """Where the tiles in use are looked for: this run's output folder first, then the executor's."""
    return [out_dir, *tiles_dirs()]


def in_use_keys(weights: Any, precision: str, batch: int, backend: Any, out_dir: Path, memo: Dict[Any, Any]) -> set:
    """The module keys of the run settle_file times as "in use": every executor of the split rounds and of
    settle_file then has the same module (a file of another SM count brings that count's module)."""
    plan = build_plan(weights.config)
    ctx, *_, tuned = run_context(weights, plan, precision, batch, backend.device_name(), backend.sm_count(),
                                 KernelPolicy(tile_dirs=in_use_dirs(out_dir)), memo)
    return set(module_keys(ctx, tuned))


def settle_file(weights: Any, precision: str, batch: int, backend: Any, tiles: Dict[str, TileChoice],
                builtin: Dict[str, TileChoice], meta: Dict[str, Any], out_dir: Path, extra: Sequence[Any],
                shards: int, memo: Dict[Any, Any]) -> None:
    """Time the whole call with the built-in tiles, the tuned ones and the tiles in use, add the figures
    to meta and write the fastest into out_dir: the tuned tiles, or the built-in ones as a file, or
    nothing where the tiles in use win (a shipped default or an earlier tune stays). Per-op picks
    can lose as a whole call: on the H200 a batch-64 re-tune picked 29 tiles that each timed faster
    alone and ran the call in 2.024 / 2.027 ms against the shipped file's 2.018 / 2.018 (2026-11-29)."""
    cfg, device, sms = weights.config, meta["device"], meta["sms"]
    dirs = in_use_dirs(out_dir)
    in_use = find_tiles(cfg, device, sms, precision, batch, dirs)   # this batch's file, or a neighbour's
    calls = {"built-in": KernelPolicy(tiles=BUILTIN), "tuned": KernelPolicy(tiles=tiles)}
    if in_use is not None:
        calls["in use"] = KernelPolicy(tile_dirs=dirs)   # as the executor runs them (a neighbour's: at its batch)
        which = ("" if (in_use.batch, in_use.sms) == (batch, sms) else
                 f" (the tiles of batch {in_use.batch} on {in_use.sms} SMs, which batch {batch} runs without a file)")
        print(f"b{batch} {precision}: tiles in use {in_use.path}{which}", flush=True)
    ms, eps = time_calls(weights, precision, batch, backend, calls, extra, shards, memo)
    chosen = min(ms, key=lambda k: ms[k])
    base = eps["built-in"]
    rel = float(np.linalg.norm(eps[chosen] - base) / max(float(np.linalg.norm(base)), 1e-30))
    meta.update(graph_ms_heuristic=ms["built-in"], graph_ms_tuned=ms["tuned"], eps_rel_l2=rel, chosen=chosen)
    if in_use is not None:
        meta.update(graph_ms_in_use=ms["in use"], tiles_in_use=str(in_use.path))
    line = ", ".join(f"{k} {v:.3f} ms" for k, v in ms.items())
    print(f"b{batch} {precision}: the whole call as a graph, median of {CALL_ROUNDS}: {line}; "
          f"eps of the {chosen} tiles vs built-in rel L2 {rel:.1e}", flush=True)
    if chosen == "in use":
        print(f"kept {in_use.path}: the tiles in use ran the call fastest; nothing written")
        return
    path = out_dir / file_name(device, sms, precision, batch)
    with writing(path):
        dump_tiles(path, builtin if chosen == "built-in" else tiles, meta)
    print(f"wrote {path}" + (" (the built-in tiles ran the call fastest: the file records them)"
                             if chosen == "built-in" else ""))


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--precision", default="fp16", choices=("fp32", "fp16", "bf16"), help="(default: fp16)")
    p.add_argument("--batch", type=number("--batch", 1), nargs="+", default=[1, 16],
                   help="batch sizes, one file each (default: 1 16)")
    p.add_argument("--out-dir", default=None, metavar="DIR",
                   help="where the tuning files go (default: where the executor looks, $JETSON_UNET_TILES, "
                        "else $XDG_CACHE_HOME or ~/.cache, then jetson-unet/tiles)")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="also write the measurements, every candidate tile's time per op included, to this JSON file")
    p.add_argument("--split-top", type=number("--split-top", 1), default=3, metavar="N",
                   help="time the split-K factors of each op's N fastest tile shapes (default: 3)")
    p.add_argument("--sms", type=number("--sms", 1), default=None,
                   help="tune on a slice of N SMs (a CUDA green context): tiles for an N-SM GPU such as the Orin Nano")
    add_verbosity(p)
    return p


def tune_main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    set_verbosity(args)
    # usage errors before any GPU work (the numbers: as they are parsed): every output proven writable
    if args.json is not None:
        check_writable(args.json, "--json")
    out_dir = Path(args.out_dir) if args.out_dir else user_tiles_dir()
    flag = "--out-dir" if args.out_dir else "tiles folder"
    check_writable(out_dir, flag, folder=True, create=True)
    with writing(out_dir):   # made now: where the executor looks, an empty folder is harmless
        out_dir.mkdir(parents=True, exist_ok=True)
    command = " ".join([PROG, *(sys.argv[1:] if argv is None else argv)])

    backend = get_backend("cupy", args.sms)
    weights, _ = bench_weights()
    plan, sms = build_plan(weights.config), backend.sm_count()
    per_batch, extra, memo = {}, set(), {}   # memo: each op's weights packed once per tile shape
    for b in args.batch:   # every candidate of every batch in one module: one build for all rounds
        ctx = Ctx(plan, weights.params, args.precision, b, sms, view_layout(plan), memo=memo)
        ops = {op.out: op for op in plan.ops if tunable(op, ctx)}
        key_of = functools.partial(tile_key, ops, ctx)
        cands = {n: candidates(op, ctx) for n, op in ops.items()}
        extra.update(key_of(n, t) for n, ts in cands.items() for t in ts)
        per_batch[b] = (cands, {n: k_segments(op, ctx) for n, op in ops.items()}, key_of)
    keys = sorted(extra, key=lambda k: k.symbol)
    shards = build_shards()
    print(f"device: {backend.device_name()} ({sms} SMs); {len(keys)} candidate kernels in {shards} modules",
          flush=True)
    secs = build_modules(weights, args.precision, backend, keys, shards, memo)
    print(f"module built in {secs:.1f} s", flush=True)
    results = [tune(weights, args.precision, b, backend, keys, *per_batch[b], out_dir, args.split_top, command,
                    shards, memo) for b in args.batch]
    if args.json:
        with writing(args.json), atomic_open(args.json, "w") as f:
            f.write(json.dumps(results, indent=1) + "\n")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    return _run(tune_main, PROG, argv)


if __name__ == "__main__":
    sys.exit(main())

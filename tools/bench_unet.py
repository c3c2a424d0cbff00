"""Time one U-Net call (64x64 by default) on the GPU: our executor per precision and batch, direct
launches and CUDA-graph replay, and, when torch is importable, PyTorch eager and
torch.compile(mode="reduce-overhead") fp16 on the same weights, side by side.

    python -m tools.bench_unet                           # fp32,fp16,bf16 x batch 1,16; torch if present
    python -m tools.bench_unet --batches 1 --precisions fp16 --iters 500 --no-torch
    python -m tools.bench_unet --no-torch --precisions fp16 --tiles auto builtin   # tuned vs built-in tiles
    python -m tools.bench_unet --no-torch --precisions fp16 --batches 1,4 --sms 8  # the Orin's regime: an 8-SM slice

Timing: CUDA events around `iters` back-to-back calls after `warmup` calls and then peers.SETTLE_S
seconds of calls (the same for the torch peers); the figure is the mean
per call over that window, repeated `repeats` times and the median reported (METHOD: warm up,
many calls, events, median). Inputs are random (never zeros). Every row (each configuration of
ours, each torch peer) is measured in a fresh process of its own (peers.in_fresh_process says why).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from jetson_unet.backends import get_backend
from jetson_unet.bench.timing import bench_weights, per_op_times, timed
from jetson_unet.executor.executor import GpuExecutor
from jetson_unet.ops.policy import KernelPolicy
from tools.peers import SETTLE_S, in_fresh_process

TILES = {"auto": None, "builtin": "builtin"}   # --tiles -> KernelPolicy(tiles=...)


def bench_ours(weights, precision: str, batch: int, args, backend, tiles: str = "auto") -> dict:
    """One configuration of ours: direct and graph-replay ms per call (and, with args.per_op, every
    launch alone); tiles: "auto" (a tuning file for this GPU and batch where there is one) or
    "builtin" (the built-in tile rules)."""
    t0 = time.perf_counter()
    shards = getattr(args, "shards", 1)   # > 1 only where asked: an older tree's executor may not take it
    ex = GpuExecutor(weights, precision, batch=batch, backend=backend, policy=KernelPolicy(tiles=TILES[tiles]),
                     **({"shards": shards} if shards > 1 else {}))
    build_s = time.perf_counter() - t0
    cfg = ex.config
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, cfg.channels, cfg.image_size, cfg.image_size)).astype(np.float32)
    ex.eps(x, 50)                                   # uploads x; warms every kernel
    s, tp = ex.stream, ex.t_row_ptr(50)
    direct = timed(backend, s, lambda: ex.run(s, tp), args.warmup, args.iters, args.repeats, SETTLE_S)
    backend.capture_begin(s)
    ex.run(s, tp)
    graph = backend.capture_end(s)
    replay = timed(backend, s, lambda: graph.launch(s), args.warmup, args.iters, args.repeats, SETTLE_S)
    rep = ex.arena_report()
    measured = f"b{ex.tile_batch}" + (f"@{ex.tile_sms}" if ex.tile_sms else "")   # another batch's / SM count's file
    label = f"ours {precision}" + (" tuned" if ex.tiles_from else "") + (f" ({measured}'s)" if ex.tile_batch else "")
    ops_t = []
    if args.per_op:
        ops_t = per_op_times(ex, backend)
        total = sum(t for *_, t in ops_t)
        print(f"per-op GPU time, {label} b{batch}: sum {total:.1f} us (graph of the call: {1000 * replay:.1f} us)")
        for name, sym, grid, us in sorted(ops_t, key=lambda r: -r[3])[:args.per_op]:
            print(f"  {us:7.2f} us  {name:28s} {sym:36s} grid {grid}")
    ex.close()
    return {"impl": label, "batch": batch, "direct_ms": direct, "graph_ms": replay,
            "launches": ex.launches_per_call, "build_s": build_s, "arena": rep["text"],
            "arena_bytes": rep["arena_bytes"], "weights_bytes": rep["weights_bytes"],
            "precision": precision, "tiles": ex.tiles_from or "built-in",
            "tile_batch": ex.tile_batch or batch, "tile_sms": ex.tile_sms, "per_op_us": per_op_sums(ops_t)}


def per_op_sums(ops_t: list) -> dict:
    """{op name: us} from per_op_times' rows, an op's launches summed (empty when not timed)."""
    out: dict = {}
    for name, _sym, _grid, us in ops_t:
        out[name] = out.get(name, 0.0) + us
    return out


def ours_row(precision: str, batch: int, args, tiles: str) -> dict:
    """bench_ours in a process of its own (in_fresh_process), on a slice of args.sms SMs if set."""
    return bench_ours(bench_weights()[0], precision, batch, args, get_backend("cupy", args.sms), tiles)


# name -> (torch.compile mode or None for eager, layout: tools.peers.LAYOUTS)
TORCH_PEERS = {"torch eager fp16": (None, "nchw"), "torch.compile reduce-overhead fp16": ("reduce-overhead", "nchw"),
               "torch.compile reduce-overhead fp16 NHWC": ("reduce-overhead", "nhwc")}


def bench_torch(batch: int, args, name: str) -> dict:
    """One of TORCH_PEERS on the shipped (or random) weights, in a process of its own (in_fresh_process)."""
    from tools.peers import peer_call, torch_model, torch_slice
    torch_slice(args.sms)
    weights = bench_weights()[0]
    cfg = weights.config
    x = np.random.default_rng(0).standard_normal((batch, cfg.channels, cfg.image_size, cfg.image_size))
    t = np.full((batch,), 50, dtype=np.int64)
    mode, layout = TORCH_PEERS[name]
    _, st = peer_call(weights, x, t, "fp16", mode, args.warmup, args.iters, args.repeats,
                      model=torch_model(weights, "fp16", mode, layout=layout))
    print(f"  ({name}: warm-up incl. compile {st['warmup_s']:.1f} s)", flush=True)
    return {"impl": name, "batch": batch, "graph_ms": st["call_ms"], "warm_s": st["warmup_s"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precisions", default="fp32,fp16,bf16", help="our precisions (default: all three)")
    ap.add_argument("--batches", default="1,16", help="batch sizes (default: 1,16)")
    ap.add_argument("--iters", type=int, default=200, help="calls per timed window (default: 200)")
    ap.add_argument("--warmup", type=int, default=20, help="calls before timing (default: 20)")
    ap.add_argument("--repeats", type=int, default=5, help="timed windows; the median is kept (default: 5)")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch comparison")
    ap.add_argument("--per-op", type=int, default=0, metavar="N",
                    help="also time every kernel alone and print the N slowest (default: off)")
    ap.add_argument("--tiles", nargs="+", default=["auto"], choices=tuple(TILES),
                    help="auto: measured tiles where a tuning file exists for this GPU and batch (jetson-tune; "
                         "rows marked 'tuned'), builtin: the built-in tile rules; both: side by side (default: auto)")
    ap.add_argument("--sms", type=int, default=None, metavar="N",
                    help="run ours and the torch peers on a slice of N SMs (a CUDA green context; default: the whole GPU)")
    ap.add_argument("--shards", type=int, default=1, metavar="N",
                    help="our kernels in N modules compiled side by side, as jetson-tune builds them (each "
                         "kernel's code the same): for runs that compile, e.g. tools.lab.knockout's copies "
                         "(default: 1, the one module the shipped cubins serve)")
    ap.add_argument("--json", default="", help="also write the rows to this JSON file")
    args = ap.parse_args(argv)
    if args.shards < 1:
        ap.error(f"--shards must be at least 1, got {args.shards}")
    rows = []
    print(f"device: {get_backend('cupy').device_name()}  weights: {bench_weights()[1]}")
    print(f"{'impl':40s} {'batch':>5s} {'direct ms':>10s} {'graph ms':>9s} {'img/s':>8s}", flush=True)

    def show(new: list) -> None:   # as they come: a long torch.compile must not hide earlier rows
        for r in new:
            rows.append(r)
            d = f"{r['direct_ms']:.3f}" if "direct_ms" in r else "-"
            print(f"{r['impl']:40s} {r['batch']:5d} {d:>10s} {r['graph_ms']:9.3f} "
                  f"{1000 * r['batch'] / r['graph_ms']:8.0f}", flush=True)

    for b in [int(v) for v in args.batches.split(",")]:
        for p in args.precisions.split(","):
            for t in args.tiles:
                show([in_fresh_process(ours_row, p, b, args, t)])
        for name in () if args.no_torch else TORCH_PEERS:
            try:
                show([in_fresh_process(bench_torch, b, args, name)])
            except ImportError as e:
                print(f"torch comparison skipped: {e}")
                break
            except Exception as e:   # one peer's failure (a torch.compile error) must not lose the others
                print(f"{name} failed at batch {b}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    for r in rows:
        if "launches" in r:
            print(f"{r['impl']} b{r['batch']}: {r['launches']} launches/call, build {r['build_s']:.1f} s, {r['arena']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

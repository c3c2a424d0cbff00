#!/usr/bin/env python3
"""Each kernel's time inside one CUDA-graph replay of the call, beside its time alone: where a
change's cost shows in the call but not in the per-op figures (`tools.bench_unet --per-op`).

    python -m tools.lab.graph_timeline --batch 64
    python -m tools.lab.graph_timeline --batch 1 --sms 8 --top 20 --json $OUT/timeline.json

The kernels of `--replays` replays come from the CUDA profiling interface through torch.profiler
(the only use of torch here: the `train` extra), which records a graph's kernels one by one; the
graph is replayed `--warm` times first. A kernel's in-graph figure is its median duration over the
replays and its gap the idle time before it; "alone" is `per_op_times` (a graph of 20 launches of
that kernel). The two differ by the cache state a kernel finds (its code and weights are cold in
the call, hot alone: a large kernel's code is the larger part, docs/kernels.md "Code size") and by
what the one before leaves behind. In another tree: run it from a
`tools.lab.knockout --keep` copy with that copy on PYTHONPATH.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np

from jetson_unet.errors import UsageError

Kernel = Tuple[float, float, str]   # (start us, duration us, symbol) as the profiler reports them


def replay_rows(kernels: Sequence[Kernel], names: Sequence[str], symbols: Sequence[str]) -> List[Dict]:
    """Per launch of the call, in order: its name, symbol, median in-graph duration and median gap
    before it (us), from the profiled kernels of whole replays (each the call's launches in order)."""
    n = len(names)
    ks = sorted(kernels)
    if not n or len(ks) % n:
        raise ValueError(f"{len(ks)} kernels are not whole replays of {n} launches")
    reps = [ks[i:i + n] for i in range(0, len(ks), n)]
    for rep in reps:
        for (_, _, got), want in zip(rep, symbols):
            if want not in got:
                raise ValueError(f"the profiled order differs from the launches: {got} where {want} was launched")
    rows = []
    for j in range(n):
        dur = statistics.median(r[j][1] for r in reps)
        gap = statistics.median(r[j][0] - r[j - 1][0] - r[j - 1][1] for r in reps) if j else 0.0
        rows.append({"op": names[j], "symbol": symbols[j], "graph_us": dur, "gap_us": gap})
    return rows


def report(rows: List[Dict], alone: Dict[str, float], top: int) -> List[str]:
    """The `top` ops whose in-graph time exceeds their time alone the most, then the sums."""
    for r in rows:
        r["alone_us"] = alone.get(r["op"], float("nan"))
    lines = [f"{'op':28s} {'in graph':>9s} {'alone':>8s} {'more':>7s} {'gap':>6s}  symbol"]
    for r in sorted(rows, key=lambda r: r["alone_us"] - r["graph_us"])[:top]:
        lines.append(f"{r['op']:28s} {r['graph_us']:9.1f} {r['alone_us']:8.1f} {r['graph_us'] - r['alone_us']:7.1f} "
                     f"{r['gap_us']:6.1f}  {r['symbol']}")
    g, a, gaps = (sum(r[k] for r in rows) for k in ("graph_us", "alone_us", "gap_us"))
    lines.append(f"{'sum of ' + str(len(rows)) + ' launches':28s} {g:9.1f} {a:8.1f} {g - a:7.1f} {gaps:6.1f}")
    return lines


def profile(args: argparse.Namespace) -> Tuple[List[Dict], Dict[str, float]]:
    import torch   # the train extra; only here
    from jetson_unet.backends import get_backend
    from jetson_unet.bench.timing import bench_weights, per_op_times
    from jetson_unet.executor.executor import GpuExecutor
    backend = get_backend("cupy", args.sms)
    ex = GpuExecutor(bench_weights()[0], args.precision, batch=args.batch, backend=backend)
    try:
        cfg = ex.config
        x = np.random.default_rng(0).standard_normal((args.batch, cfg.channels, cfg.image_size, cfg.image_size))
        ex.eps(x.astype(np.float32), 50)
        s, tp = ex.stream, ex.t_row_ptr(50)
        backend.capture_begin(s)
        ex.run(s, tp)
        graph = backend.capture_end(s)
        for _ in range(args.warm):
            graph.launch(s)
        s.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(args.replays):
                graph.launch(s)
            s.synchronize()
        with tempfile.TemporaryDirectory() as tmp:   # the trace's kernel records, as Perfetto reads them
            prof.export_chrome_trace(str(Path(tmp) / "trace.json"))
            events = json.loads((Path(tmp) / "trace.json").read_text())["traceEvents"]
        kernels = [(e["ts"], e["dur"], e["name"]) for e in events if e.get("cat") == "kernel"]
        rows = replay_rows(kernels, [L.name for L in ex.launches], [L.fn.symbol for L in ex.launches])
        alone: Dict[str, float] = {}
        for name, _, _, us in per_op_times(ex, backend):
            alone[name] = alone.get(name, 0.0) + us
        return rows, alone
    finally:
        ex.close()


def check(args: argparse.Namespace) -> None:
    """UsageError for arguments no run can take, and where torch is missing."""
    if args.batch < 1 or args.replays < 1 or args.warm < 0:
        raise UsageError("--batch and --replays must be at least 1, --warm at least 0")
    try:
        import torch.profiler  # noqa: F401
    except ImportError:
        raise UsageError("needs torch (its profiler reads the graph's kernels): pip install -e '.[train]'") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--sms", type=int, default=None, help="on a slice of N SMs (a CUDA green context)")
    ap.add_argument("--precision", default="fp16", choices=("fp32", "fp16", "bf16"))
    ap.add_argument("--replays", type=int, default=5, help="profiled replays (default: 5)")
    ap.add_argument("--warm", type=int, default=200, help="replays before profiling (default: 200)")
    ap.add_argument("--top", type=int, default=15, help="ops listed (default: 15)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows to this JSON file")
    args = ap.parse_args(argv)
    try:
        check(args)
    except UsageError as e:   # one line, exit 2, before the GPU is touched
        print(f"graph_timeline: {e}", file=sys.stderr)
        return 2
    rows, alone = profile(args)
    print("\n".join(report(rows, alone, args.top)))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

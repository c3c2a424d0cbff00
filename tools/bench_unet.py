"""Time one U-Net call (64x64 by default) on the GPU: our executor per precision and batch, direct
launches and CUDA-graph replay, and, when torch is importable, PyTorch eager and
torch.compile(mode="reduce-overhead") fp16 on the same weights, side by side.

    python tools/bench_unet.py                           # fp32,fp16,bf16 x batch 1,16; torch if present
    python tools/bench_unet.py --batches 1 --precisions fp16 --iters 500 --no-torch
    python tools/bench_unet.py --no-torch --precisions fp16,bf16 --variants 0 3   # conv kernels side by side

Timing: CUDA events around `iters` back-to-back calls after `warmup` calls and then peers.SETTLE_S
seconds of calls (the same for the torch peers); the figure is the mean
per call over that window, repeated `repeats` times and the median reported (METHOD: warm up,
many calls, events, median). Inputs are random (never zeros). Every row (each configuration of
ours, each torch peer) is measured in a fresh process of its own (peers.in_fresh_process says why).

--variants: the GEMM conv family per run, as $JETSON_UNET_CONV_STAGES would pick it (0: the
register-staged conv_gemm; n: the cp.async conv of kernels/conv_pipe.cu with n stages, 3 by default);
each variant is built and
timed in turn, then compared with the first: graph ms, speedup, and the relative L2 distance of its
eps from the first variant's on the same input (a correctness smoke test, not a tolerance check).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jetson_unet.paths import models_dir  # noqa: E402
from jetson_unet.model.config import UNetConfig  # noqa: E402
from jetson_unet.backends import get_backend  # noqa: E402
from jetson_unet.executor.executor import GpuExecutor  # noqa: E402
from jetson_unet.ops.common import DEFAULT_STAGES, STAGES_ENV  # noqa: E402
from jetson_unet.model.weights import load_weights, random_params  # noqa: E402
from tools.peers import SETTLE_S, in_fresh_process, settle  # noqa: E402


class RandomWeights:
    def __init__(self, cfg: UNetConfig, seed: int = 0) -> None:
        self.config, self.params = cfg, random_params(cfg, seed)


def bench_weights():
    """The shipped model when present, else random weights of the default config: (weights, label)."""
    path = models_dir() / "seed-unet-emoji64.npz"
    return (load_weights(path), "shipped") if path.is_file() else (RandomWeights(UNetConfig()), "random")


def timed(backend, stream, fn, warmup: int, iters: int, repeats: int, settle_s: float = 0.0) -> float:
    """Median over `repeats` of (event time of `iters` calls) / iters, in ms, after `warmup` calls
    and then calls until `settle_s` seconds of load have passed."""
    for _ in range(warmup):
        fn()
    stream.synchronize()
    if settle_s > 0:
        settle(fn, stream.synchronize, settle_s, every=50)
    per = []
    for _ in range(repeats):
        e0, e1 = backend.event(), backend.event()
        e0.record(stream)
        for _ in range(iters):
            fn()
        e1.record(stream)
        e1.synchronize()
        per.append(e0.elapsed_ms(e1) / iters)
    return statistics.median(per)


@contextlib.contextmanager
def conv_stages(stages: int):
    """$JETSON_UNET_CONV_STAGES = stages while executors are built, restored after."""
    old = os.environ.pop(STAGES_ENV, None)
    os.environ[STAGES_ENV] = str(stages)
    try:
        yield
    finally:
        os.environ.pop(STAGES_ENV, None)
        if old is not None:
            os.environ[STAGES_ENV] = old


def bench_ours(weights, precision: str, batch: int, args, backend, stages: int = DEFAULT_STAGES,
               tiles: str = "auto", pdl: str = "env") -> dict:
    t0 = time.perf_counter()
    with conv_stages(stages):
        ex = GpuExecutor(weights, precision, batch=batch, backend=backend, tiles=None if tiles == "auto" else {},
                         pdl=None if pdl == "env" else pdl == "on")
    if pdl == "on" and not ex.pdl:
        raise SystemExit("--pdl on: programmatic dependent launch needs sm_90+ and the CuPy backend")
    build_s = time.perf_counter() - t0
    cfg = ex.config
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, cfg.channels, cfg.image_size, cfg.image_size)).astype(np.float32)
    eps = ex.eps(x, 50)                             # uploads x; warms every kernel
    s, tp = ex.stream, ex.t_row_ptr(50)
    direct = timed(backend, s, lambda: ex.run(s, tp), args.warmup, args.iters, args.repeats, SETTLE_S)
    backend.capture_begin(s)
    ex.run(s, tp)
    graph = backend.capture_end(s)
    replay = timed(backend, s, lambda: graph.launch(s), args.warmup, args.iters, args.repeats, SETTLE_S)
    rep = ex.arena_report()
    label = (f"ours {precision}" + (f" conv-s{stages}" if getattr(args, "variants", [stages]) != [DEFAULT_STAGES] else "")
             + (" tuned" if ex.tiles_from else "") + (" pdl" if ex.pdl else ""))
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
            "precision": precision, "conv_stages": stages, "tiles": ex.tiles_from or "built-in", "_eps": eps,
            "_per_op": ops_t, "per_op_us": per_op_sums(ops_t)}


def compare_variants(rows: list, per_op: int) -> None:
    """Side by side: each variant against the first one of the same precision and batch."""
    groups = {}
    for r in rows:
        if "conv_stages" in r:
            groups.setdefault((r["precision"], r["batch"]), []).append(r)
    print("conv variants (graph ms per call; vs the first: speedup, rel L2 of eps):")
    for (prec, b), rs in groups.items():
        base = rs[0]
        cells = []
        for r in rs:
            err = float(np.linalg.norm(r["_eps"] - base["_eps"]) / np.linalg.norm(base["_eps"]))
            r["eps_rel_l2_vs_first"] = err
            cells.append(f"s{r['conv_stages']} {r['graph_ms']:.3f}"
                         + ("" if r is base else f" ({base['graph_ms'] / r['graph_ms']:.2f}x, {err:.1e})"))
        print(f"  {prec} b{b}: " + " | ".join(cells))
        if per_op and len(rs) > 1 and base["_per_op"]:
            times = [{name: (sym, us) for name, sym, _, us in r["_per_op"]} for r in rs]
            print(f"  per-op us, {prec} b{b} ({' / '.join('s%d' % r['conv_stages'] for r in rs)}), slowest first:")
            for name, (sym, us) in sorted(times[0].items(), key=lambda kv: -kv[1][1])[:per_op]:
                others = " / ".join(f"{t[name][1]:7.2f}" for t in times[1:] if name in t)
                print(f"    {us:7.2f} / {others}  {name:28s} {times[-1].get(name, (sym,))[0]}")


def per_op_sums(ops_t: list) -> dict:
    """{op name: us} from per_op_times' rows, an op's launches summed (empty when not timed)."""
    out: dict = {}
    for name, _sym, _grid, us in ops_t:
        out[name] = out.get(name, 0.0) + us
    return out


def per_op_times(ex, backend, reps: int = 20, windows: int = 3, only=None) -> list:
    """GPU time of each launch alone (of the ops in `only`, when given): a graph of `reps`
    back-to-back launches of that kernel, its replays timed with events (CuPy's ~10 us of host work
    per direct launch would hide the kernel)."""
    s, out = ex.stream, []
    for L in ex.launches:
        if only is not None and L.name not in only:
            continue
        backend.capture_begin(s)
        for _ in range(reps):
            L.fn.launch(L.grid, L.block, L.args, L.smem, s)
        g = backend.capture_end(s)
        ms = timed(backend, s, lambda: g.launch(s), 2, 5, windows)
        out.append((L.name, L.fn.symbol, L.grid, 1000.0 * ms / reps))
    return out


def ours_row(precision: str, batch: int, args, stages: int, tiles: str, pdl: str = "env") -> dict:
    """bench_ours in a process of its own (in_fresh_process)."""
    return bench_ours(bench_weights()[0], precision, batch, args, get_backend("cupy"), stages, tiles, pdl)


# name -> (torch.compile mode or None for eager, layout: tools/peers.py LAYOUTS)
TORCH_PEERS = {"torch eager fp16": (None, "nchw"), "torch.compile reduce-overhead fp16": ("reduce-overhead", "nchw"),
               "torch.compile reduce-overhead fp16 NHWC": ("reduce-overhead", "nhwc")}


def bench_torch(batch: int, args, name: str) -> dict:
    """One of TORCH_PEERS on the shipped (or random) weights, in a process of its own (in_fresh_process)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # peers' `import torch_unet`
    from tools.peers import peer_call, torch_model
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
    ap.add_argument("--variants", type=int, nargs="+", default=[DEFAULT_STAGES], metavar="STAGES",
                    help="GEMM conv kernels to time side by side: 0 = register-staged conv_gemm, n = cp.async "
                         f"with n stages (default: {DEFAULT_STAGES} only, the runtime's default)")
    ap.add_argument("--tiles", nargs="+", default=["auto"], choices=("auto", "builtin"),
                    help="auto: measured tiles where a tuning file exists for this GPU and batch (tools/tune_tiles.py; "
                         "rows marked 'tuned'), builtin: the heuristic's; both: side by side (default: auto)")
    ap.add_argument("--pdl", nargs="+", default=["env"], choices=("off", "on", "env"),
                    help="on: programmatic dependent launch (sm_90+, runtime/gpu/launch_ex.py; rows marked 'pdl'), "
                         "off: plain launches, the default path, env: as $JETSON_UNET_PDL; several: side by side "
                         "(default: env)")
    ap.add_argument("--json", default="", help="also write the rows to this JSON file")
    args = ap.parse_args(argv)
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
            for v in args.variants:
                for t in args.tiles:
                    for pdl in args.pdl:
                        show([in_fresh_process(ours_row, p, b, args, v, t, pdl)])
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
    if len(args.variants) > 1:
        compare_variants(rows, args.per_op)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

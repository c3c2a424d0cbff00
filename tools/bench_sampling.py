#!/usr/bin/env python3
"""End-to-end sampling benchmark: one 100-step 64x64 DDPM image, our modes vs PyTorch, one run.

    python -m tools.bench_sampling --batch 1 16 --precision fp16 --json out.json
    python -m tools.bench_sampling --batch 16 --noise host device --no-torch   # noise drawn on the CPU vs the GPU

For each batch: our GPU mode with CUDA graphs (once per --noise source), without graphs, and the
CPU p_sample mode; then,
when torch is importable, PyTorch eager fp16 and torch.compile(mode="reduce-overhead") fp16 on
the same weights and the same noise (their loop runs the same affine step on the GPU with all
noise uploaded before the clock starts, which favours them). Setup (compile + weight upload) is
reported separately and excluded from the per-image figures. Each figure is the median of
--repeat timed runs after one warm-up run and then peers.SETTLE_S seconds of runs (every runner,
ours and the peers alike). Every runner is measured in a fresh process of its own, as jetson-sample
runs (peers.in_fresh_process says why).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from jetson_unet.backends import get_backend
from jetson_unet.bench.timing import settle
from jetson_unet.model.schedule import make_steps
from jetson_unet.model.weights import load_weights
from jetson_unet.paths import models_dir
from jetson_unet.sampling.gpu import GpuSampler
from jetson_unet.trace import Timeline
from tools.peers import SETTLE_S, in_fresh_process, time_torch  # the PyTorch peer loop (tools.bench_peers too)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR of two x_0 arrays mapped to [0, 1] as the image out does."""
    ia, ib = np.clip((a + 1) / 2, 0, 1), np.clip((b + 1) / 2, 0, 1)
    mse = float(np.mean((ia - ib) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)


def time_ours(weights, steps, batch, precision, mode, graphs, repeat, seed, noise="host"):
    t0 = time.perf_counter()
    s = GpuSampler(weights, precision, batch, mode=mode, graphs=graphs, noise=noise)
    setup = time.perf_counter() - t0
    try:
        x0 = s.run(steps, seed)                              # warm-up (graph capture, pinned buffers)
        settle(lambda: s.run(steps, seed), lambda: None, SETTLE_S)   # then SETTLE_S seconds of runs, as the peers
        walls = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            x0 = s.run(steps, seed)
            walls.append(time.perf_counter() - t0)
        tl = Timeline(s.backend)                             # one traced run for the step breakdown
        s.run(steps, seed, timeline=tl)
        ev = [e for e in tl.events() if e.get("ph") == "X"]
        gpu = [e["dur"] for e in ev if e["name"].startswith(("step", "unet"))]
        cpu = [e["dur"] for e in ev if e["name"].startswith("p_sample")]
        wall = statistics.median(walls)
        stats = {"setup_s": setup, "wall_s": wall, "s_per_image": wall / batch, "images_per_s": batch / wall,
                 "gpu_ms_per_step": sum(gpu) / 1e3 / len(steps), "cpu_p_sample_ms_per_step": sum(cpu) / 1e3 / len(steps),
                 "launches_per_unet": s.executors[0].launches_per_call}
        stats["gpu_busy_fraction"] = min(1.0, stats["gpu_ms_per_step"] * len(steps) / 1e3 / wall)
        return x0, stats
    finally:
        s.close()


def time_to_first_step(weights, precision, early, repeat=5):
    """Upload start -> end of the first U-Net call (ms, CUDA events), blocking vs early start.
    Kernels are compiled and the host buffer is packed before the clock starts in both cases."""
    from jetson_unet.executor.executor import GpuExecutor
    out = []
    for _ in range(repeat):
        ex = GpuExecutor(weights, precision, 1, early_start=early)
        ex.run(ex.stream, ex.t_row_ptr(weights.config.timesteps - 1))
        end = ex.backend.event()
        end.record(ex.stream)
        end.synchronize()
        out.append(ex.upload_start.elapsed_ms(end))
        ex.close()
    return statistics.median(out)


def _loaded(path: str):
    weights = load_weights(path)
    return weights, make_steps(weights.config.schedule, "ddpm")


def ours_job(path: str, batch: int, precision: str, mode: str, graphs: bool, repeat: int, seed: int, noise: str):
    """time_ours in a process of its own (in_fresh_process)."""
    weights, steps = _loaded(path)
    return time_ours(weights, steps, batch, precision, mode, graphs, repeat, seed, noise)


def torch_job(path: str, batch: int, seed: int, compiled: bool, repeat: int):
    weights, steps = _loaded(path)
    return time_torch(weights, steps, batch, seed, compiled, repeat)


def first_step_job(path: str, precision: str, early: bool) -> float:
    return time_to_first_step(load_weights(path), precision, early)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", default=str(models_dir() / "seed-unet-emoji64.safetensors"))
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--noise", nargs="+", choices=("host", "device"), default=["host"],
                    help="noise sources of the gpu+graph runner (device: drawn on the GPU, jetson_unet.ops.noise)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    steps = make_steps(load_weights(args.weights).config.schedule, "ddpm")
    rows, results = [], {"device": get_backend("cupy").device_name(), "precision": args.precision,
                         "steps": len(steps), "runs": []}
    for b in args.batch:
        ref = None
        runners = [(f"ours gpu+graph{' dev-noise' if nz == 'device' else ''}", "gpu", True, nz) for nz in args.noise]
        runners += [("ours gpu", "gpu", False, "host"), ("ours cpu", "cpu", False, "host")]
        for name, mode, graphs, nz in runners:
            x0, st = in_fresh_process(ours_job, args.weights, b, args.precision, mode, graphs, args.repeat,
                                      args.seed, nz)
            ref = x0 if ref is None else ref
            st["psnr_vs_first_db"] = psnr(x0, ref)
            rows.append((b, name, st))
        if not args.no_torch:
            try:
                for name, compiled in (("torch eager fp16", False), ("torch.compile ro fp16", True)):
                    x0, st = in_fresh_process(torch_job, args.weights, b, args.seed, compiled, args.repeat)
                    st["psnr_vs_first_db"] = psnr(x0, ref)
                    rows.append((b, name, st))
            except ImportError as e:
                print(f"torch peers skipped: {e}", file=sys.stderr)
    results["first_step_ms"] = {k: in_fresh_process(first_step_job, args.weights, args.precision, early)
                                for k, early in (("blocking", False), ("early_start", True))}
    print(f"device {results['device']}, {len(steps)}-step DDPM, {args.precision}, median of {args.repeat}")
    print(f"{'batch':>5} {'runner':<26} {'s/image':>9} {'img/s':>8} {'GPU ms/step':>11} {'CPU ms/step':>11} "
          f"{'busy':>5} {'setup s':>7} {'PSNR':>6}")
    for b, name, st in rows:
        print(f"{b:>5} {name:<26} {st['s_per_image']:>9.4f} {st['images_per_s']:>8.1f} "
              f"{st.get('gpu_ms_per_step', float('nan')):>11.3f} {st.get('cpu_p_sample_ms_per_step', float('nan')):>11.3f} "
              f"{st.get('gpu_busy_fraction', float('nan')):>5.2f} {st.get('setup_s', float('nan')):>7.2f} "
              f"{st['psnr_vs_first_db']:>6.1f}")
        results["runs"].append({"batch": b, "runner": name, **st})
    fs = results["first_step_ms"]
    print(f"time to first step (weight upload + first U-Net call, batch 1): blocking {fs['blocking']:.2f} ms, "
          f"early start {fs['early_start']:.2f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

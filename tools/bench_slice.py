#!/usr/bin/env python3
"""The Orin's regime on a large GPU: ours and torch.compile on an N-SM slice (a CUDA green context)
and on the whole GPU, in one run, each row in a fresh process.

    python -m tools.bench_slice --sms 8 --batch 1 4 --whole-batch 1 4 16 64

Rows (fp16, DDPM over all T steps unless --sampler/--steps, median of --repeats after warm-up):
- ours: `Pipeline(backend="cupy", precision="fp16", sms=N).sample(...)`, the tiles for N SMs (a
  tuning file measured on the slice when there is one, else the built-in tiles);
- torch.compile fp16, mode="reduce-overhead": `torch.cuda.green_contexts.GreenContext.create(
  num_sms=N).set_context()` before the model is built (an external stream is not enough for its
  graphs);
- a 4096^3 fp16 torch matmul: what the slice can do at best.
TFLOP/s counts the U-Net's FLOPs (jetson_unet.model.cost) over the steps and images per second.
Needs CuPy, the CUDA Python bindings and the `train` extra (torch).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Dict, List, Optional

from jetson_unet.bench.timing import settle
from jetson_unet.model.cost import totals
from jetson_unet.model.plan import build_plan
from jetson_unet.model.schedule import make_steps
from jetson_unet.pipeline import default_weights_path
from tools.peers import SETTLE_S, in_fresh_process, peer_sampling, torch_slice

MATMUL_N = 4096


def _steps(weights: Any, args: argparse.Namespace) -> list:
    return make_steps(weights.config.schedule, args.sampler, None if args.sampler == "ddpm" else args.steps)


def ours_row(args: argparse.Namespace, sms: Optional[int], batch: int) -> Dict[str, Any]:
    from jetson_unet.pipeline import Pipeline
    with Pipeline(args.weights, backend="cupy", precision="fp16", sms=sms) as pipe:
        n = len(_steps(pipe.weights, args))
        run = lambda: pipe.sample(batch, None if args.sampler == "ddpm" else args.steps, args.sampler, seed=0)  # noqa: E731
        run()
        settle(run, lambda: None, SETTLE_S)
        walls = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            run()
            walls.append(time.perf_counter() - t0)
    from jetson_unet.backends import get_backend
    sm_count = get_backend("cupy", sms).sm_count()
    return {"impl": "ours", "sms": sm_count, "batch": batch, "steps": n, "wall_s": statistics.median(walls)}


def torch_row(args: argparse.Namespace, sms: Optional[int], batch: int) -> Dict[str, Any]:
    from jetson_unet.model.weights import load_weights
    n_sms = torch_slice(sms)
    weights = load_weights(args.weights)
    steps = _steps(weights, args)
    _, st = peer_sampling(weights, steps, batch, 0, args.repeats, "fp16", "reduce-overhead")
    return {"impl": "torch.compile ro", "sms": n_sms, "batch": batch, "steps": len(steps), "wall_s": st["wall_s"]}


def matmul_row(sms: Optional[int]) -> Dict[str, Any]:
    import torch
    n_sms = torch_slice(sms)
    a = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.float16)
    b = torch.randn_like(a)
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    iters = 20 if sms is not None else 200
    e0.record()
    for _ in range(iters):
        a @ b
    e1.record()
    e1.synchronize()
    s = e0.elapsed_time(e1) / 1e3 / iters
    return {"impl": f"torch matmul {MATMUL_N}^3", "sms": n_sms, "tflops": 2 * MATMUL_N ** 3 / s / 1e12}


def with_rates(row: Dict[str, Any], flops_per_image_call: float) -> Dict[str, Any]:
    if "wall_s" in row:
        per_image = row["wall_s"] / row["batch"]
        row.update(ms_per_image=per_image * 1e3, images_per_s=1 / per_image,
                   tflops=flops_per_image_call * row["steps"] / per_image / 1e12)
    return row


def rows_for(args: argparse.Namespace, sms: Optional[int], batches: List[int]) -> List[Dict[str, Any]]:
    out = [in_fresh_process(matmul_row, sms)] if batches and not args.no_torch else []
    for b in batches:
        out.append(in_fresh_process(ours_row, args, sms, b))
        if not args.no_torch:
            try:
                out.append(in_fresh_process(torch_row, args, sms, b))
            except Exception as e:   # e.g. torch.compile without a C compiler
                out.append({"impl": "torch.compile ro", "sms": sms, "batch": b, "error": f"{type(e).__name__}: {e}"})
        print(json.dumps(out[-1]), file=sys.stderr, flush=True)
    return out


def print_table(rows: List[Dict[str, Any]]) -> None:
    print("| implementation | SMs | batch | ms/image | images/s | U-Net TFLOP/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['impl']} | {r['sms']} | {r['batch']} | {r['error'][:60]} | | |")
            continue
        ms = f"{r['ms_per_image']:.2f}" if "ms_per_image" in r else ""
        ips = f"{r['images_per_s']:.1f}" if "images_per_s" in r else ""
        print(f"| {r['impl']} | {r['sms']} | {r.get('batch', '')} | {ms} | {ips} | {r['tflops']:.1f} |")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m tools.bench_slice", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", default=str(default_weights_path()))
    ap.add_argument("--sms", type=int, default=8, help="SMs of the slice (default: 8, an Orin Nano 8GB's)")
    ap.add_argument("--batch", type=int, nargs="*", default=[1, 4], help="batch sizes on the slice (none: the whole GPU only)")
    ap.add_argument("--whole-batch", type=int, nargs="*", default=[1, 4, 16, 64], help="batch sizes on the whole GPU")
    ap.add_argument("--sampler", default="ddpm", choices=("ddpm", "ddim", "dpmpp-2m"))
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-torch", action="store_true", help="ours only")
    ap.add_argument("--json", default="")
    return ap


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from jetson_unet.model.weights import load_weights
    flops = totals(build_plan(load_weights(args.weights).config))["flops"]
    rows = rows_for(args, args.sms, args.batch) + rows_for(args, None, args.whole_batch)
    rows = [with_rates(r, flops) for r in rows]
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "unet_gflop_per_image_call": flops / 1e9, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What a batch of n one-image requests costs jetson-serve's model with each set of engines, in this
process: the callable the server binds (`jetson_unet.serve.Model`), without Triton or a network, so
that it needs neither the serve extra nor free ports.

    python -m tools.serve_batches --sms 8 --requests 1 3 4 16 --engines 16 1,4,16

Each --engines entry is a server's --batch-sizes (the largest its --max-batch-size): its engines are
built, warmed and timed as jetson-serve does (a batch runs as the engine calls of least summed time),
then each batch of --requests one-image requests (seeds 0..n-1,
one sampler and step count) is run once untimed and --repeats times timed; the table gives the median
milliseconds per batch.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Dict, List, Optional, Sequence

import numpy as np


def engines(text: str) -> List[int]:
    """An --engines entry: batch sizes joined by commas ("1,4,16")."""
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--engines takes batch sizes joined by commas, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--engines takes batch sizes >= 1, got {text!r}")
    return sizes


def one_image_requests(n: int, steps: int, sampler: str) -> List[Dict[str, np.ndarray]]:
    """n requests of one image each (seeds 0..n-1), as PyTriton hands a batch to the model."""
    return [{"seed": np.array([[k]], np.int64), "steps": np.array([[steps]], np.int32),
             "sampler": np.array([[sampler.encode()]], np.object_)} for k in range(n)]


def time_batches(model, requests: Sequence[int], steps: int, sampler: str, repeats: int) -> Dict[int, float]:
    """Median ms per batch of n requests, after one untimed run of each."""
    out = {}
    for n in requests:
        batch = one_image_requests(n, steps, sampler)
        model(batch)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            model(batch)
            times.append(1e3 * (time.perf_counter() - t0))
        out[n] = statistics.median(times)
    return out


def table(requests: Sequence[int], columns: Dict[str, Dict[int, float]]) -> str:
    lines = ["| requests in the batch | " + " | ".join(f"engines {name}" for name in columns) + " |",
             "| --- |" + " --- |" * len(columns)]
    lines += [f"| {n} | " + " | ".join(f"{col[n]:.1f} ms" for col in columns.values()) + " |" for n in requests]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.serve_batches", description=__doc__.splitlines()[0])
    p.add_argument("--engines", type=engines, nargs="+", default=[[16], [1, 4, 16]],
                   help="one server's --batch-sizes each, joined by commas")
    p.add_argument("--requests", type=int, nargs="+", default=[1, 3, 4, 16], help="one-image requests per batch")
    p.add_argument("--sampler", default="dpmpp-2m")
    p.add_argument("--steps", type=int, default=0, help="0: the sampler's default")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--weights", default=None, help="the shipped model by default")
    p.add_argument("--backend", default="cupy")
    p.add_argument("--precision", default="fp16")
    p.add_argument("--sms", type=int, default=None, help="an SM slice, as jetson-serve --sms")
    args = p.parse_args(argv)
    for sizes in args.engines:
        if max(args.requests) > max(sizes):
            p.error(f"--requests {max(args.requests)} is more than the engines {sizes} hold")
    from jetson_unet import serve
    from jetson_unet.pipeline import Pipeline
    columns = {}
    for sizes in args.engines:
        with Pipeline(args.weights, backend=args.backend, precision=args.precision, sms=args.sms) as pipe:
            serve.warm(pipe, serve.batch_sizes(max(sizes), sizes))
            columns[",".join(map(str, pipe.loaded)) or "(none: numpy)"] = time_batches(
                serve.Model(pipe), args.requests, args.steps, args.sampler, args.repeats)
            where = f"{args.sms}-SM slice" if args.sms else "the whole GPU" if pipe.backend != "numpy" else "the CPU"
            label = f"{pipe.backend} {pipe.precision}, {where}"
    print(f"one batch of n one-image requests through jetson-serve's model, {args.sampler}, "
          f"steps {args.steps or 'default'}, {label}; median of {args.repeats}")
    print(table(args.requests, columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())

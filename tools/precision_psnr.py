#!/usr/bin/env python3
"""Per-seed PSNR of whole sampled images at each precision against a base precision's image of the
same seed (issue 4: fp16 and bf16 against the fp32 run), through the public Pipeline API.

    python -m tools.precision_psnr                                  # GPU: fp16 bf16 vs fp32, seeds 0-7
    python -m tools.precision_psnr --base fp64 --precisions fp16    # GPU fp16 vs NumPy's float64
    python -m tools.precision_psnr --seeds 0 1 2 --json psnr.json
    python -m tools.precision_psnr --backend numpy --base fp64 --precisions fp32 --sampler ddim --steps 10

Every image is a batch-1 `Pipeline.sample(seed=s)` (the seed's own noise stream, so each seed is
one image a user could ask for), 100-step DDPM unless told otherwise. fp64 runs on the NumPy backend
whatever --backend says (no GPU backend computes in fp64), so the GPU's images can be held against
the float64 reference: the same seed draws the same noise on every backend. PSNR is over the uint8 images
the CLI writes (peak 255; inf when identical), so it counts what rounding does to the picture, not
to x_0's floats; the largest absolute pixel difference is printed beside it. One Pipeline per
precision (kernels compiled or loaded once), the base first.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, Dict, List, Sequence

import numpy as np

from jetson_unet.model.schedule import SAMPLERS
from jetson_unet.pipeline import BACKEND_CHOICES, Pipeline, default_weights_path


def psnr_u8(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of two uint8 images (peak 255); inf when they are equal."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0.0 else 10.0 * math.log10(255.0 ** 2 / mse)


def images(weights: Any, backend: str, precision: str, seeds: Sequence[int], sampler: str,
           steps: Any) -> List[np.ndarray]:
    backend = "numpy" if precision == "fp64" else backend   # the only backend with a float64 path
    with Pipeline(weights, backend=backend, precision=precision) as pipe:
        return [pipe.sample(batch=1, seed=s, sampler=sampler, steps=steps)[0] for s in seeds]


def compare(weights: Any, backend: str, base: str, precisions: Sequence[str], seeds: Sequence[int],
            sampler: str = "ddpm", steps: Any = None) -> Dict[str, Any]:
    """{"rows": [{seed, <p>_psnr_db, <p>_max_abs}...], "summary": {p: {min, median}}}."""
    ref = images(weights, backend, base, seeds, sampler, steps)
    rows: List[Dict[str, Any]] = [{"seed": s} for s in seeds]
    for p in precisions:
        for row, a, b in zip(rows, images(weights, backend, p, seeds, sampler, steps), ref):
            row[f"{p}_psnr_db"] = psnr_u8(a, b)
            row[f"{p}_max_abs"] = int(np.max(np.abs(a.astype(np.int16) - b.astype(np.int16))))
    summary = {p: {"min_db": min(r[f"{p}_psnr_db"] for r in rows),
                   "median_db": float(np.median([r[f"{p}_psnr_db"] for r in rows]))} for p in precisions}
    return {"base": base, "backend": backend, "sampler": sampler, "steps": steps, "rows": rows,
            "summary": summary}


def table(res: Dict[str, Any], precisions: Sequence[str]) -> List[str]:
    head = f"{'seed':>5} " + " ".join(f"{p + ' dB':>9} {'max|d|':>6}" for p in precisions)
    lines = [f"PSNR of each precision's image against the {res['base']} image of the same seed "
             f"({res['backend']}, {res['sampler']}; uint8, peak 255)", head]
    for r in res["rows"]:
        lines.append(f"{r['seed']:>5} " + " ".join(f"{r[f'{p}_psnr_db']:>9.2f} {r[f'{p}_max_abs']:>6}"
                                                  for p in precisions))
    lines.append(f"{'min':>5} " + " ".join(f"{res['summary'][p]['min_db']:>9.2f} {'':>6}" for p in precisions))
    lines.append(f"{'med':>5} " + " ".join(f"{res['summary'][p]['median_db']:>9.2f} {'':>6}" for p in precisions))
    return lines


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", default=str(default_weights_path()))
    ap.add_argument("--backend", choices=BACKEND_CHOICES, default="cupy")
    ap.add_argument("--base", default="fp32", help="the precision the others are compared with (default fp32)")
    ap.add_argument("--precisions", nargs="+", default=["fp16", "bf16"])
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(8)))
    ap.add_argument("--sampler", choices=SAMPLERS, default="ddpm")
    ap.add_argument("--steps", type=int, default=None, help="the sampler's steps (default: DDPM all T, the others theirs)")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    res = compare(args.weights, args.backend, args.base, args.precisions, args.seeds, args.sampler, args.steps)
    print("\n".join(table(res, args.precisions)))
    if args.json:   # identical images: PSNR "inf" (JSON has no infinity)
        rows = [{k: ("inf" if v == math.inf else v) for k, v in r.items()} for r in res["rows"]]
        with open(args.json, "w") as f:
            json.dump(dict(res, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

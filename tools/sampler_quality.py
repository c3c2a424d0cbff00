"""How close each deterministic sampler gets to the converged solution, per seed: DDIM (eta 0) and
DPM-Solver++(2M) at a few step counts against DDIM over all T timesteps, everything in float64 on
the NumPy reference (the spec's noise stream of each seed, x_T alike for all). PSNR on the image
(x_0 + 1) / 2 clipped to [0, 1], peak 1.

    python -m tools.sampler_quality --seeds 0 1 2 3 4 5 6 7 --steps 5 10 15 20 25 50 --json out.json
    python -m tools.sampler_quality --from out.json --plot docs/samplers.png     # the table and the plot

The runs go seed by seed and the JSON is rewritten after each, so an interrupted run keeps what it
measured (`--json` again resumes where it stopped).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Dict, List

import numpy as np

from jetson_unet.model.reference import Reference
from jetson_unet.model.schedule import make_steps, sample_loop
from jetson_unet.model.weights import load_weights
from jetson_unet.paths import models_dir

SAMPLERS = ("ddim", "dpmpp-2m")


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR of two x_0 (B, C, H, W) as images in [0, 1], peak 1."""
    ia = np.clip((a.astype(np.float64) + 1.0) / 2.0, 0.0, 1.0)
    ib = np.clip((b.astype(np.float64) + 1.0) / 2.0, 0.0, 1.0)
    mse = float(np.mean((ia - ib) ** 2))
    return math.inf if mse == 0 else 10.0 * math.log10(1.0 / mse)


def measure_seed(ref: Reference, seed: int, steps: List[int]) -> Dict[str, float]:
    c = ref.config
    shape = (1, c.channels, c.image_size, c.image_size)
    want = sample_loop(ref.eps, shape, make_steps(c.schedule, "ddim", c.timesteps), [seed])   # converged
    out = {}
    for sampler in SAMPLERS:
        for s in steps:
            got = sample_loop(ref.eps, shape, make_steps(c.schedule, sampler, s), [seed])
            out[f"{sampler}/{s}"] = psnr(got, want)
    return out


def table(doc: dict) -> str:
    """Markdown: mean and median PSNR over the seeds (min .. max) per sampler and step count."""
    steps = doc["steps"]
    lines = ["| steps | " + " | ".join(f"{s}: mean / median (min .. max), dB" for s in SAMPLERS) + " |",
             "| --- |" + " --- |" * len(SAMPLERS)]
    for s in steps:
        cells = []
        for sampler in SAMPLERS:
            v = [r[f"{sampler}/{s}"] for r in doc["seeds"].values()]
            cells.append(f"{np.mean(v):.1f} / {np.median(v):.1f} ({min(v):.1f} .. {max(v):.1f})")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_seed_table(doc: dict) -> str:
    """Markdown: every seed's PSNR per sampler and step count."""
    cols = [f"{sampler} {s}" for sampler in SAMPLERS for s in doc["steps"]]
    lines = ["| seed | " + " | ".join(cols) + " |", "| --- |" + " --- |" * len(cols)]
    for seed, r in doc["seeds"].items():
        lines.append(f"| {seed} | " + " | ".join(f"{r[c.replace(' ', '/')]:.1f}" for c in cols) + " |")
    return "\n".join(lines)


def plot(doc: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for sampler, color in zip(SAMPLERS, ("tab:blue", "tab:orange")):
        for r in doc["seeds"].values():
            ax.plot(doc["steps"], [r[f"{sampler}/{s}"] for s in doc["steps"]], color=color, alpha=0.25, lw=0.8)
        ax.plot(doc["steps"], [np.mean([r[f"{sampler}/{s}"] for r in doc["seeds"].values()]) for s in doc["steps"]],
                color=color, lw=2.2, marker="o", label=f"{sampler} (mean; thin: each seed)")
    ax.set_xlabel("U-Net calls (sampling steps)")
    ax.set_ylabel("PSNR against the converged solution (dB)")
    ax.set_title(f"{len(doc['seeds'])} seeds, float64, {doc['model']}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", default=str(models_dir() / "seed-unet-emoji64.safetensors"))
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(8)))
    ap.add_argument("--steps", type=int, nargs="+", default=[5, 10, 15, 20, 25, 50])
    ap.add_argument("--json", default=None, help="write (and resume) the per-seed results here")
    ap.add_argument("--from", dest="source", default=None, help="read the results from this JSON instead")
    ap.add_argument("--plot", default=None, help="also draw the figure (needs matplotlib)")
    args = ap.parse_args(argv)
    if args.source:
        doc = json.loads(Path(args.source).read_text())
    else:
        weights = load_weights(args.weights)
        ref = Reference(weights, np.float64)
        doc = {"model": Path(args.weights).name, "steps": args.steps, "reference": "ddim eta 0 over all T, float64",
               "seeds": {}}
        if args.json and Path(args.json).is_file():
            old = json.loads(Path(args.json).read_text())
            if old.get("steps") == args.steps:
                doc = old
        for seed in args.seeds:
            if str(seed) in doc["seeds"]:
                continue
            t0 = time.perf_counter()
            doc["seeds"][str(seed)] = measure_seed(ref, seed, args.steps)
            print(f"seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    print(table(doc))
    print()
    print(per_seed_table(doc))
    if args.plot:
        plot(doc, Path(args.plot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

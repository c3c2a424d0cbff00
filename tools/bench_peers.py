#!/usr/bin/env python3
"""Our GPU runtime against PyTorch on the same weights, noise and device: one U-Net call and the
whole sampling loop, with an agreement check, in one ratio table.

    python -m tools.bench_peers                               # shipped model, batch 1, 100-step DDPM
    python -m tools.bench_peers --batch 4 --json peers.json --skip-loop

Peers (tools.peers): PyTorch eager fp32 (TF32 off) and fp16, torch.compile fp16 with the default
mode and with mode="reduce-overhead" (CUDA graphs). Ours: the GPU executor at the peer's precision,
timed as a CUDA-graph replay (tools.bench_unet), and the gpu sampling mode with graphs
(tools.bench_sampling). Agreement: the relative L2 of each peer's eps against OUR fp32 executor's
eps on the same x and t must be within 1e-2 for fp16 and 1e-3 for fp32 (both sides accumulate in
fp32; the fp32 bound leaves room for a different summation order through ~75 layers). The loop's
x_0 is compared too (relative L2, PSNR), for information only: 100 steps amplify rounding.
Ratios are peer / ours: above 1 means we are faster. Each precision of ours and each peer runs in a
fresh process of its own. Needs the `train` extra (torch) and CuPy.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

import numpy as np

from jetson_unet.bench.timing import RandomWeights
from jetson_unet.model.config import UNetConfig
from jetson_unet.model.schedule import make_steps
from jetson_unet.model.weights import load_weights
from jetson_unet.paths import models_dir
from tools.bench_sampling import psnr, time_ours
from tools.bench_unet import bench_ours
from tools.peers import PEERS, in_fresh_process, peer_call, peer_sampling, strict_fp32, torch_model

EPS_TOL = {"fp32": 1e-3, "fp16": 1e-2}


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


def one_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return type(e).__name__ + (": " + lines[0][:200] if lines else "")


def _weights(path: str) -> Any:
    return load_weights(path) if os.path.isfile(path) else RandomWeights(UNetConfig())


def _steps(weights: Any, args: argparse.Namespace) -> list:
    return make_steps(weights.config.schedule, args.sampler, None if args.sampler == "ddpm" else args.steps)


def ours_job(path: str, x: np.ndarray, t: np.ndarray, args: argparse.Namespace, precision: str, what: str) -> Any:
    """Ours at one precision, in a process of its own, one of: "eps" on (x, t); "call", the
    graph-replay ms per call; "loop", the gpu-mode loop's x_0 and figures."""
    from jetson_unet.backends import get_backend
    from jetson_unet.executor.executor import GpuExecutor
    weights, backend = _weights(path), get_backend("cupy")
    if what == "eps":
        with GpuExecutor(weights, precision, batch=args.batch, backend=backend) as ex:
            return ex.eps(x, t)
    if what == "call":
        timing = SimpleNamespace(warmup=args.warmup, iters=args.iters, repeats=args.repeats, per_op=0)
        row = bench_ours(weights, precision, args.batch, timing, backend)
        return {"call_ms": row["graph_ms"], "direct_ms": row["direct_ms"]}
    x0, st = time_ours(weights, _steps(weights, args), args.batch, precision, "gpu", True, args.repeats, args.seed)
    return dict(st, x0=x0)


def peer_job(path: str, x: np.ndarray, t: np.ndarray, args: argparse.Namespace, name: str, precision: str,
             mode: Optional[str], layout: str = "nchw") -> dict:
    """One peer, in a process of its own: its eps and ms per call, then (unless --skip-loop) its
    loop; a failure (e.g. torch.compile without a C compiler for Triton) comes back as a line."""
    strict_fp32()
    weights = _weights(path)
    row: Dict[str, Any] = {"peer": name, "precision": precision, "compile": mode, "layout": layout}
    try:
        model = torch_model(weights, precision, mode, layout=layout)     # compiled once, for the call and the loop
        eps, st = peer_call(weights, x, t, precision, mode, args.warmup, args.iters, args.repeats, model=model)
    except Exception as e:
        row["error"] = one_line(e)
        return row
    row.update(st, _eps=eps)
    if not args.skip_loop:
        try:
            row["_x0"], row["_loop"] = peer_sampling(weights, _steps(weights, args), args.batch, args.seed,
                                                     args.repeats, precision, mode, model=model)
        except Exception as e:
            row["loop_error"] = one_line(e)
    return row


def compare(rows: List[dict], ours: Dict[str, dict]) -> None:
    """Each peer against ours at its precision; eps and x_0 against our fp32 ones."""
    for row in rows:
        if "error" in row:
            continue
        mine = ours[row["precision"]]
        row.update(eps_rel_l2=rel_l2(row.pop("_eps"), ours["fp32"]["eps"]), ours_call_ms=mine["call_ms"])
        row["eps_ok"] = row["eps_rel_l2"] <= EPS_TOL[row["precision"]]
        row["call_ratio"] = row["call_ms"] / row["ours_call_ms"]
        if "_loop" in row:
            st, x0, ref = row.pop("_loop"), row.pop("_x0"), ours["fp32"]["loop"]["x0"]
            row.update(loop_s_per_image=st["s_per_image"], loop_warmup_s=st["warmup_s"],
                       ours_loop_s_per_image=mine["loop"]["s_per_image"], x0_rel_l2=rel_l2(x0, ref),
                       x0_psnr_db=psnr(x0, ref))
            row["loop_ratio"] = st["s_per_image"] / mine["loop"]["s_per_image"]


def _f(v: Optional[float], spec: str) -> str:
    return "-" if v is None else spec.format(v)


def print_table(rows: List[dict], ours_eps16: float, device: str, args: argparse.Namespace, n_steps: int) -> None:
    print(f"device {device}, batch {args.batch}; call: median of {args.repeats} x {args.iters} calls (events); "
          f"loop: {n_steps}-step {args.sampler}, median of {args.repeats}; ratio = peer / ours (> 1: ours faster)")
    print(f"ours fp16 eps vs ours fp32: rel L2 {ours_eps16:.2e}")
    print(f"{'peer':<27} {'call ms':>8} {'ours ms':>8} {'ratio':>6} {'loop s/img':>10} {'ours s/img':>10} "
          f"{'ratio':>6} {'eps relL2':>9} {'ok':>3} {'x0 relL2':>8} {'PSNR':>5}")
    for r in rows:
        if "error" in r:
            print(f"{r['peer']:<27} failed: {r['error']}")
            continue
        print(f"{r['peer']:<27} {r['call_ms']:>8.3f} {r['ours_call_ms']:>8.3f} {r['call_ratio']:>6.2f} "
              f"{_f(r.get('loop_s_per_image'), '{:.4f}'):>10} {_f(r.get('ours_loop_s_per_image'), '{:.4f}'):>10} "
              f"{_f(r.get('loop_ratio'), '{:.2f}'):>6} {r['eps_rel_l2']:>9.1e} {'yes' if r['eps_ok'] else 'NO':>3} "
              f"{_f(r.get('x0_rel_l2'), '{:.1e}'):>8} {_f(r.get('x0_psnr_db'), '{:.1f}'):>5}")
        if r.get("loop_error"):
            print(f"{'':<27} loop failed: {r['loop_error']}")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", default=None, help="weights file (default: the shipped model, else random)")
    ap.add_argument("--batch", type=int, default=1, help="batch size (default: 1)")
    ap.add_argument("--sampler", choices=("ddpm", "ddim"), default="ddpm", help="loop sampler (default: ddpm)")
    ap.add_argument("--steps", type=int, default=None, help="DDIM steps (default: T)")
    ap.add_argument("--t", type=int, default=50, help="timestep of the single call (default: 50)")
    ap.add_argument("--iters", type=int, default=100, help="calls per timed window (default: 100)")
    ap.add_argument("--warmup", type=int, default=10, help="calls before timing (default: 10)")
    ap.add_argument("--repeats", type=int, default=3, help="timed windows / loops, median kept (default: 3)")
    ap.add_argument("--seed", type=int, default=0, help="seed of x and of the noise stream (default: 0)")
    ap.add_argument("--skip-loop", action="store_true", help="single U-Net call only")
    ap.add_argument("--json", default="", help="also write every figure to this JSON file")
    return ap


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.batch < 1 or args.iters < 1 or args.repeats < 1 or args.warmup < 0:
        raise SystemExit("bench_peers: --batch, --iters, --repeats must be >= 1 and --warmup >= 0")
    try:
        import torch  # noqa: F401  (fail now, not after our half of the work)
    except ImportError as e:
        raise SystemExit(f"bench_peers: PyTorch is not importable ({e}); install the extra: pip install -e '.[train]'")
    from jetson_unet.backends import get_backend
    device = get_backend("cupy").device_name()
    path = args.weights or str(models_dir() / "seed-unet-emoji64.safetensors")
    c = _weights(path).config
    x = np.random.default_rng(args.seed).standard_normal((args.batch, c.channels, c.image_size, c.image_size))
    x = x.astype(np.float32)
    t = np.full((args.batch,), args.t, dtype=np.int64)
    # every side in a process of its own (peers.in_fresh_process says why)
    ours = {}
    for p in ("fp32", "fp16"):
        ours[p] = dict(eps=in_fresh_process(ours_job, path, x, t, args, p, "eps"),
                       **in_fresh_process(ours_job, path, x, t, args, p, "call"))
        if not args.skip_loop:
            ours[p]["loop"] = in_fresh_process(ours_job, path, x, t, args, p, "loop")
    rows = [in_fresh_process(peer_job, path, x, t, args, *peer) for peer in PEERS]
    compare(rows, ours)
    n_steps = 0 if args.skip_loop else len(_steps(_weights(path), args))
    ours_eps16 = rel_l2(ours["fp16"]["eps"], ours["fp32"]["eps"])
    print_table(rows, ours_eps16, device, args, n_steps)
    if args.json:
        loop = {p: {k: v for k, v in d["loop"].items() if k != "x0"} for p, d in ours.items() if "loop" in d}
        doc = {"device": device, "args": vars(args), "weights": path if os.path.isfile(path) else "random",
               "ours_call": {p: {k: v for k, v in d.items() if k not in ("eps", "loop")} for p, d in ours.items()},
               "ours_eps16_rel_l2": ours_eps16, "ours_loop": dict(loop, n_steps=n_steps), "peers": rows}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=str)
    return 0 if all(r.get("eps_ok", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Write a torch-vs-runtime parity fixture: PyTorch float64 outputs of the spec'd U-Net.

    python -m tools.make_parity_fixture --weights weights/seed-unet-emoji64.safetensors
        -> tests/fixtures/parity.npz
    python -m tools.make_parity_fixture --random-seed 0 --out tests/fixtures/parity_random.npz
        -> random weights (jetson_unet.model.weights.random_params) of a small config, so CI checks
           parity even where no trained model is shipped

The fixture holds x (G, B, C, H, W) float32, t (G, B) int64, eps (G, B, C, H, W) float64 (torch,
float64 end to end), the weights' content hash, and the config JSON. tests/test_parity.py runs
jetson_unet.model.reference.Reference on the same inputs without torch. Torch is needed here only.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch

from jetson_unet.model.config import UNetConfig
from jetson_unet.model.weights import content_hash, load_weights, random_params
from tools.torch_unet import SeedUNet, load_numpy_params

# Both ends of the schedule and the middle; one group per row, so a failure names its t.
TIMESTEPS = [[99, 50], [10, 0]]
# Small but complete: 3 levels (so a resizing down/up and the last-level plain 3x3 both occur),
# res_conv in every up block, width 16 so GroupNorm(1) sees several channels.
RANDOM_CONFIG = {"image_size": 16, "dim": 16, "time_dim": 64, "dim_mults": [1, 2, 4]}


def torch_eps(cfg: UNetConfig, params: dict, x: np.ndarray, t: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    model = SeedUNet(cfg).to(dtype).eval()
    load_numpy_params(model, params)
    with torch.no_grad():
        return model(torch.from_numpy(x).to(dtype), torch.from_numpy(t)).double().numpy()


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--weights", help="a seed-unet weights file (.safetensors or .npz)")
    src.add_argument("--random-seed", type=int, help="random weights of a small config instead")
    ap.add_argument("--out", default=None, help="default: tests/fixtures/parity.npz (parity_random.npz with --random-seed)")
    ap.add_argument("--seed", type=int, default=1234, help="seed of the inputs x (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.weights:
        w = load_weights(args.weights)
        cfg, params, digest = w.config, w.params, w.manifest["content_hash"]
        out = args.out or "tests/fixtures/parity.npz"
    else:
        cfg = UNetConfig.from_dict(RANDOM_CONFIG)
        params = random_params(cfg, seed=args.random_seed)
        digest = content_hash(params)
        out = args.out or "tests/fixtures/parity_random.npz"
    # Parameters go in as stored (float16 or float32); torch widens them, as the reference does.
    params = {k: np.asarray(v) for k, v in params.items()}
    t = np.array(TIMESTEPS, dtype=np.int64)
    rng = np.random.Generator(np.random.PCG64(args.seed))
    x = rng.standard_normal(t.shape + (cfg.channels, cfg.image_size, cfg.image_size), dtype=np.float32)
    eps = np.stack([torch_eps(cfg, params, x[g], t[g], torch.float64) for g in range(len(t))])
    for g in range(len(t)):  # how far float32 torch is from float64: the scale of the f32 tolerance
        e32 = torch_eps(cfg, params, x[g], t[g], torch.float32)
        print(f"t={t[g].tolist()}: |eps| rms {np.sqrt(np.mean(eps[g] ** 2)):.3f}, "
              f"torch f32 vs f64 rel L2 {rel_l2(e32, eps[g]):.2e}")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    extra = {"random_seed": np.int64(args.random_seed)} if args.random_seed is not None else {}
    np.savez_compressed(out, x=x, t=t, eps=eps, content_hash=np.array(digest),
                        config=np.array(json.dumps(cfg.to_dict(), sort_keys=True)), **extra)
    print(f"wrote {out}: x {x.shape}, eps {eps.shape} float64, weights {digest[:23]}...")
    return 0


if __name__ == "__main__":
    sys.exit(main())

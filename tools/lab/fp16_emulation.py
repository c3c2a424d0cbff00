#!/usr/bin/env python3
"""Where a 16-bit image's distance from float64 comes from, on the CPU: the float64 reference
(jetson_unet.model.reference) with the GPU fp16 path's roundings put back one kind at a time, a whole
sampled image per seed, its uint8 PSNR against the float64 image of the same seed.

    python -m tools.lab.fp16_emulation --seeds 1                        # every op's output rounded
    python -m tools.lab.fp16_emulation --seeds 1 --round outputs input fold
    python -m tools.lab.fp16_emulation --seeds 1 --round outputs input prodscale
    python -m tools.lab.fp16_emulation --seeds 1 5 --ref fp64.npz       # float64 images made before

Roundings (--round): `outputs`, every op's output stored in fp16 (not eps, which stays fp32); `input`,
the sampler's image rounded to fp16 where `init_conv` reads it on tensor cores; `fold`, the fold as
first built: the folded GroupNorm's weights `W * gn_w` rounded once to fp16 (the 16-bit convs with a
GroupNorm on their input); `subpixel`, an up2 conv's four sub-pixel weight matrices summed from its
3x3 taps and rounded (ops.conv.subpixel_weights); `prodscale`, a normalized conv's input stored as
fp16(gn_w * x) and divided back, as the GPU's fold now does (kernels/conv.cu conv_gn_prologue).
`--ref` reads {seeds, images} (uint8, as `--save` writes them) instead of sampling in float64 again:
a 100-step image takes ~40 s on two cores either way. Findings: docs/performance.md, accuracy.
"""
from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

from jetson_unet.model import reference as R
from jetson_unet.model.schedule import SAMPLERS, make_steps, sample_loop, to_uint8
from jetson_unet.model.weights import load_weights
from jetson_unet.ops.conv import subpixel_weights
from jetson_unet.pipeline import default_weights_path
from tools.precision_psnr import psnr_u8

ROUNDINGS = ("outputs", "input", "fold", "subpixel", "prodscale")


def r16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float64)


def folded(op) -> bool:
    """The convs whose GroupNorm the GPU folds into the weights (ops.conv.fold_norm: not the gates,
    not the up2 or unshuffle input maps; the shipped model meets its ratio bound everywhere)."""
    return bool(op.norm) and op.kind == "conv" and op.groups == 1 and op.in_map == "none"


def fold_delta(op, env: R.Env, p, eps: float) -> np.ndarray:
    """What rounding W * gn_w to fp16 adds to a folded conv's output: conv(x_hat, dW), x_hat the input
    normalized without its affine (what the folded GEMM multiplies W * gn_w by), dW = fp16(W gn_w) - W gn_w."""
    x = env[op.x]
    m = x.mean(axis=(1, 2, 3), keepdims=True)
    xh = (x - m) / np.sqrt(((x - m) ** 2).mean(axis=(1, 2, 3), keepdims=True) + eps)
    g = np.asarray(p[op.norm + ".weight"], np.float64)[None, :, None, None]
    wg = (np.asarray(p[op.prefix + ".weight"], np.float64) * g).astype(np.float32)   # fold_weights: fp32
    dw = r16(wg) - wg.astype(np.float64)
    return R.conv2d(xh, dw, np.zeros(dw.shape[0]))


def subpixel_delta(x: np.ndarray, mats: Sequence[np.ndarray]) -> np.ndarray:
    """The up2 conv of x through the four sub-pixel matrices `mats` (Cout, (a, b, Cin)) in
    subpixel_weights' layout: conv2d(up2(x), W) when mats are subpixel_weights(W)."""
    B, C, H, W = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    rows = ((-1, 0), (0, 1))   # parity -> the input row (column) offsets of taps a (b) = 0, 1
    out = np.zeros((B, mats[0].shape[0], 2 * H, 2 * W))
    for i, (py, px) in enumerate(((0, 0), (0, 1), (1, 0), (1, 1))):
        m = np.asarray(mats[i], np.float64).reshape(-1, 2, 2, C)
        for a in (0, 1):
            for b in (0, 1):
                ya, xb = 1 + rows[py][a], 1 + rows[px][b]
                out[:, :, py::2, px::2] += np.einsum("oc,bchw->bohw", m[:, a, b, :], xp[:, :, ya:ya + H, xb:xb + W])
    return out


class Fp16Emulation:
    """eps(x, t) of the float64 reference with the chosen roundings (ROUNDINGS)."""

    def __init__(self, weights, roundings: Sequence[str]) -> None:
        self.ref, self.round = R.Reference(weights, np.float64), set(roundings)
        plan = self.ref.plan
        self.gamma: Dict[str, np.ndarray] = {   # prodscale: a folded conv's input -> its gn_w
            op.x: np.asarray(self.ref.params[op.norm + ".weight"], np.float64)[None, :, None, None]
            for op in plan.ops if folded(op)} if "prodscale" in self.round else {}
        self.sub: Dict[str, List[np.ndarray]] = {   # subpixel: each up2 conv's rounding of its matrices
            op.out: [r16(m) - m.astype(np.float64) for m in subpixel_weights(self.ref.params[op.prefix + ".weight"])]
            for op in plan.ops if op.in_map == "up2"} if "subpixel" in self.round else {}

    def run(self, op, env: R.Env) -> np.ndarray:
        ref = self.ref
        y = R.run_op(op, env, ref.params, ref.plan).astype(np.float64, copy=False)
        if "fold" in self.round and folded(op):
            y = y + fold_delta(op, env, ref.params, ref.config.norm_eps)
        if op.out in self.sub:
            y = y + subpixel_delta(env[op.x], self.sub[op.out])
        if "outputs" in self.round and op.out != ref.plan.output:
            g = self.gamma.get(op.out)
            y = r16(y) if g is None else r16(y * g) / g
        return y

    def eps(self, x: np.ndarray, t: np.ndarray) -> np.ndarray:
        env = self.ref.time_env(np.asarray(t, np.int64))
        x = np.asarray(x, np.float64)
        env[self.ref.plan.input] = r16(x) if "input" in self.round else x
        for op in self.ref.plan.ops:
            env[op.out] = self.run(op, env)
        return env[self.ref.plan.output]


def image(weights, eps_fn, seed: int, sampler: str, steps: Optional[int]) -> np.ndarray:
    c = weights.config
    shape = (1, c.channels, c.image_size, c.image_size)
    return to_uint8(sample_loop(eps_fn, shape, make_steps(c.schedule, sampler, steps), [seed]))[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", default=str(default_weights_path()))
    ap.add_argument("--seeds", type=int, nargs="+", default=[1])
    ap.add_argument("--round", nargs="*", default=["outputs"], choices=ROUNDINGS, metavar="KIND")
    ap.add_argument("--sampler", choices=SAMPLERS, default="ddpm")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--ref", default="", help="the float64 images ({seeds, images} .npz) instead of sampling them")
    ap.add_argument("--save", default="", help="write the float64 images sampled here (.npz) for --ref")
    args = ap.parse_args(argv)
    w = load_weights(args.weights)
    if args.ref:
        z = np.load(args.ref)
        known = {int(s): im for s, im in zip(z["seeds"], z["images"])}
        missing = [s for s in args.seeds if s not in known]
        if missing:
            print(f"fp16_emulation: {args.ref} has no image of seed {missing[0]}", file=sys.stderr)
            return 2
        refs = [known[s] for s in args.seeds]
    else:
        exact = R.Reference(w, np.float64)
        refs = [image(w, exact.eps, s, args.sampler, args.steps) for s in args.seeds]
        if args.save:
            np.savez_compressed(args.save, seeds=np.array(args.seeds), images=np.stack(refs))
    emu = Fp16Emulation(w, args.round)
    for s, want in zip(args.seeds, refs):
        got = image(w, emu.eps, s, args.sampler, args.steps)
        diff = int(np.abs(got.astype(int) - want.astype(int)).max())
        print(f"seed {s} rounding {'+'.join(args.round) or 'nothing'}: {psnr_u8(got, want):.2f} dB, "
              f"largest pixel difference {diff}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Train `seed-unet` (epsilon prediction, the spec's T = 100 linear schedule) with PyTorch.

    python -m tools.train --data .data/emoji64.npz --out out/train --minutes 7.5
    python -m tools.train --smoke                     # tiny config, synthetic data, CPU, seconds

Recipe (docs/training.md): batch 128, bf16 autocast
on CUDA, AdamW lr 3e-4, grad-clip 1.0, EMA 0.999, random horizontal flips, images in [-1, 1].
The whole dataset lives on the device as uint8; batches are random indices + flips there, so
there is no loader to tune. `--minutes` is a wall-clock budget for the WHOLE process: training
stops `--reserve-s` seconds early so the export, preview and plot finish inside it.

OUT gets: model.safetensors (EMA weights, written by jetson_unet.model.weights.save_weights), loss.csv
(step, loss, ema_loss, seconds), loss.png (if matplotlib is there), samples.png (DDPM samples
of the EMA model, seeds 0.., drawn with the runtime's own noise stream and step coefficients),
and ckpt.pt (resumable with --resume; ~4x the fp32 model size, disable with --ckpt-every 0).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time

T_START = time.time()  # the --minutes budget counts from here, imports included

import numpy as np
import torch
import torch.nn.functional as F

from jetson_unet.model.config import UNetConfig  # noqa: E402
from jetson_unet.model.schedule import coefficients, make_steps, sample_loop, to_uint8  # noqa: E402
from jetson_unet.model.weights import save_weights  # noqa: E402
from tools.torch_unet import SeedUNet, export_numpy_params, n_params  # noqa: E402

SMOKE_CONFIG = {"image_size": 16, "dim": 8, "time_dim": 32, "dim_mults": [1, 2]}


class TrainError(Exception):
    """Bad inputs; main() prints one line and exits 2."""


def parse_args(argv: list | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a = ap.add_argument
    a("--data", default=".data/emoji64.npz", help="dataset from tools.make_dataset (default: %(default)s)")
    a("--out", default="out/train", help="output folder (default: %(default)s)")
    a("--config", default=None, help="model config: JSON file or inline JSON object (default: UNetConfig())")
    a("--kinds", default=None, help="keep only these dataset kinds, e.g. 'single' or 'single,flag' (default: all)")
    a("--steps", type=int, default=None, help="stop at this total step count (default: no limit)")
    a("--minutes", type=float, default=None, help="wall-clock budget for the whole process (default: none)")
    a("--reserve-s", type=float, default=30.0, help="stop training this long before --minutes (default: %(default)s)")
    a("--batch", type=int, default=128, help="batch size (default: %(default)s)")
    a("--lr", type=float, default=3e-4, help="AdamW learning rate (default: %(default)s)")
    a("--weight-decay", type=float, default=0.0, help="AdamW weight decay (default: %(default)s)")
    a("--grad-clip", type=float, default=1.0, help="max global grad norm (default: %(default)s)")
    a("--ema", type=float, default=0.999, help="EMA decay of the weights (default: %(default)s)")
    a("--seed", type=int, default=0, help="torch seed (default: %(default)s)")
    a("--device", default=None, help="cuda or cpu (default: cuda if available)")
    a("--compile", action="store_true", help="torch.compile the training model (default: off)")
    a("--log-every", type=int, default=100, help="steps between loss rows / prints (default: %(default)s)")
    a("--ckpt-every", type=int, default=2000, help="steps between checkpoints; 0: none at all (default: %(default)s)")
    a("--resume", nargs="?", const="", default=None, help="resume from CKPT (default path: OUT/ckpt.pt)")
    a("--export-dtype", choices=("float16", "float32"), default="float16", help="exported weights dtype (default: %(default)s)")
    a("--preview", type=int, default=16, help="DDPM samples in samples.png; 0: none (default: %(default)s)")
    a("--smoke", action="store_true", help="tiny config, synthetic data, CPU, 4 steps (a quick end-to-end test)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.config = args.config or json.dumps(SMOKE_CONFIG)
        args.device = args.device or "cpu"
        args.steps = 4 if args.steps is None else args.steps
        args.batch, args.log_every, args.preview = min(args.batch, 8), 1, min(args.preview, 4)
    if args.steps is None and args.minutes is None:
        ap.error("give --steps and/or --minutes (or --smoke)")
    return args


def load_config(spec: str | None) -> UNetConfig:
    if spec is None:
        return UNetConfig()
    try:
        text = spec if spec.lstrip().startswith("{") else open(spec).read()
        return UNetConfig.from_dict(json.loads(text))
    except (OSError, ValueError) as e:  # ConfigError is a ValueError, as is bad JSON
        raise TrainError(f"--config {spec}: {e}") from None


def load_images(args: argparse.Namespace, cfg: UNetConfig) -> np.ndarray:
    """(N, H, W, C) uint8 from the .npz; --smoke box-downsamples it (or makes colour blobs)."""
    if args.smoke and not os.path.isfile(args.data):
        rng = np.random.default_rng(args.seed)  # smooth random colour fields, so the loss moves
        small = rng.integers(0, 256, (32, 4, 4, cfg.channels), dtype=np.uint8)
        return small.repeat(cfg.image_size // 4, 1).repeat(cfg.image_size // 4, 2)
    if not os.path.isfile(args.data):
        raise TrainError(f"no dataset at {args.data}: build it with "
                         f"python -m tools.make_dataset --out {args.data}")
    with np.load(args.data, allow_pickle=False) as npz:
        images = npz["images"]
        kinds = npz["kinds"] if "kinds" in npz.files else None
    if args.kinds:
        if kinds is None:
            raise TrainError(f"{args.data} has no 'kinds' array: cannot filter by --kinds")
        images = images[np.isin(kinds, args.kinds.split(","))]
    if args.smoke and images.ndim == 4 and images.shape[1] % cfg.image_size == 0:
        f, n = images.shape[1] // cfg.image_size, min(len(images), 64)
        pooled = images[:n].reshape(n, cfg.image_size, f, cfg.image_size, f, -1).mean(axis=(2, 4))
        images = np.round(pooled).astype(np.uint8)
    want = (cfg.image_size, cfg.image_size, cfg.channels)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:] != want or len(images) == 0:
        raise TrainError(f"{args.data}: images must be uint8 (N>0, {', '.join(map(str, want))}) for "
                         f"this config, got {images.dtype} {images.shape}")
    return images


class Trainer:
    """Model, EMA twin, optimizer and the per-step math; everything on one device."""

    def __init__(self, cfg: UNetConfig, args: argparse.Namespace, device: torch.device) -> None:
        self.cfg, self.args, self.device = cfg, args, device
        self.model = SeedUNet(cfg).to(device)
        self.ema = SeedUNet(cfg).to(device).requires_grad_(False)
        self.ema.load_state_dict(self.model.state_dict())
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=args.weight_decay,
                                     fused=device.type == "cuda")  # one kernel for the whole update
        self.fwd = torch.compile(self.model) if args.compile else self.model
        abar = torch.from_numpy(coefficients(cfg.schedule).abar)  # float64, the runtime's schedule
        self.sqrt_abar = abar.sqrt().float().to(device)
        self.sqrt_1m_abar = (1.0 - abar).sqrt().float().to(device)
        self.amp = device.type == "cuda"  # bf16 autocast; CPU stays fp32 (CPU bf16 is slow)
        self.step = 0
        self.seconds = 0.0  # training seconds over all runs (resumes add up)

    def batch(self, data: torch.Tensor) -> torch.Tensor:
        """Random images from the on-device uint8 set, random horizontal flips, in [-1, 1]."""
        idx = torch.randint(0, data.shape[0], (self.args.batch,), device=self.device)
        x0 = data[idx].float().div_(127.5).sub_(1.0)
        flip = torch.rand(self.args.batch, device=self.device) < 0.5
        return torch.where(flip[:, None, None, None], x0.flip(3), x0)

    def train_step(self, data: torch.Tensor) -> torch.Tensor:
        x0 = self.batch(data)
        t = torch.randint(0, self.cfg.timesteps, (x0.shape[0],), device=self.device)
        noise = torch.randn_like(x0)
        xt = self.sqrt_abar[t, None, None, None] * x0 + self.sqrt_1m_abar[t, None, None, None] * noise
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            pred = self.fwd(xt, t)
        loss = F.mse_loss(pred.float(), noise)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.grad_clip)
        self.opt.step()
        with torch.no_grad():  # ema <- ema + (1 - decay) (w - ema), in place, one fused call
            torch._foreach_lerp_(list(self.ema.parameters()), list(self.model.parameters()),
                                 1.0 - self.args.ema)
        self.step += 1
        return loss.detach()

    def state(self) -> dict:
        s = {"model": self.model.state_dict(), "ema": self.ema.state_dict(), "opt": self.opt.state_dict(),
             "step": self.step, "seconds": self.seconds, "config": self.cfg.to_dict(),
             "torch_rng": torch.get_rng_state()}
        if self.device.type == "cuda":
            s["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        return s

    def save(self, path: str) -> None:
        tmp = path + ".tmp"
        torch.save(self.state(), tmp)
        os.replace(tmp, path)  # a crash mid-write never leaves a truncated checkpoint

    def load(self, path: str) -> None:
        if not os.path.isfile(path):
            raise TrainError(f"--resume: no checkpoint at {path}")
        s = torch.load(path, map_location=self.device, weights_only=False)
        if s["config"] != self.cfg.to_dict():
            raise TrainError(f"--resume: {path} was trained with another config: {s['config']}")
        self.model.load_state_dict(s["model"])
        self.ema.load_state_dict(s["ema"])
        self.opt.load_state_dict(s["opt"])
        self.step, self.seconds = s["step"], s["seconds"]
        torch.set_rng_state(s["torch_rng"])
        if "cuda_rng" in s and self.device.type == "cuda":
            torch.cuda.set_rng_state(s["cuda_rng"], self.device)


class LossLog:
    """loss.csv rows every --log-every steps: mean loss over the interval, a lightly smoothed loss."""

    HEADER = ["step", "loss", "ema_loss", "seconds"]

    def __init__(self, path: str, resume_step: int | None) -> None:
        self.path, self.rows = path, []
        if resume_step is not None and os.path.isfile(path):
            # Keep the rows up to the checkpoint: later ones belong to steps that are redone.
            with open(path) as f:
                self.rows = [(int(r["step"]), float(r["loss"]), float(r["ema_loss"]), float(r["seconds"]))
                             for r in csv.DictReader(f) if int(r["step"]) <= resume_step]
        self.smooth = self.rows[-1][2] if self.rows else None
        with open(path, "w", newline="") as f:
            csv.writer(f).writerows([self.HEADER] + self.rows)

    def add(self, step: int, loss: float, seconds: float) -> float:
        # Each row is already the mean of a whole --log-every interval: smooth lightly.
        self.smooth = loss if self.smooth is None else 0.5 * self.smooth + 0.5 * loss
        self.rows.append((step, loss, self.smooth, seconds))
        with open(self.path, "a", newline="") as f:
            csv.writer(f).writerow([step, f"{loss:.6f}", f"{self.smooth:.6f}", f"{seconds:.1f}"])
        return self.smooth


def train(tr: Trainer, data: torch.Tensor, log: LossLog, ckpt: str) -> str:
    """The loop; returns why it stopped. Loss values are read back only at log points, so the
    GPU queue is never drained more often than every --log-every steps."""
    args = tr.args
    deadline = T_START + args.minutes * 60.0 - args.reserve_s if args.minutes is not None else math.inf
    acc, n_acc = torch.zeros((), device=tr.device), 0
    t_log, step_log, t_run = time.time(), tr.step, time.time()
    seconds0 = tr.seconds
    reason = "steps"
    try:
        while args.steps is None or tr.step < args.steps:
            if time.time() >= deadline:
                reason = "time budget"
                break
            acc += tr.train_step(data)
            n_acc += 1
            if tr.step % args.log_every == 0:
                loss = float(acc) / n_acc  # the one host sync per interval
                acc.zero_(); n_acc = 0
                if not math.isfinite(loss):
                    raise TrainError(f"loss is {loss} at step {tr.step}: lower --lr or check the data")
                now = time.time()
                tr.seconds = seconds0 + now - t_run
                smooth = log.add(tr.step, loss, tr.seconds)
                rate = (tr.step - step_log) / max(now - t_log, 1e-9)
                print(f"step {tr.step:6d}  loss {loss:.4f}  ema {smooth:.4f}  {rate:6.2f} it/s  "
                      f"{now - T_START:6.0f} s", flush=True)
                t_log, step_log = now, tr.step
            if args.ckpt_every and tr.step % args.ckpt_every == 0:
                tr.save(ckpt)
    except KeyboardInterrupt:
        reason = "interrupted"
    tr.seconds = seconds0 + time.time() - t_run
    return reason


def preview(tr: Trainer, out_png: str, n: int) -> None:
    """n DDPM samples of the EMA model through the runtime's sampler (spec noise stream, seed 0):
    the runtime should draw the same pictures from model.safetensors, up to precision."""
    from PIL import Image

    cfg, dev = tr.cfg, tr.device

    @torch.no_grad()
    def eps_fn(x: np.ndarray, t: np.ndarray) -> np.ndarray:
        return tr.ema(torch.from_numpy(x).to(dev), torch.from_numpy(t).to(dev)).float().cpu().numpy()

    shape = (n, cfg.channels, cfg.image_size, cfg.image_size)
    imgs = to_uint8(sample_loop(eps_fn, shape, make_steps(cfg.schedule, "ddpm"), seeds=0))
    cols = int(math.ceil(math.sqrt(n)))
    rows = int(math.ceil(n / cols))
    grid = np.full((rows * cfg.image_size, cols * cfg.image_size, cfg.channels), 255, np.uint8)
    for k, im in enumerate(imgs):
        r, c = divmod(k, cols)
        grid[r * cfg.image_size:(r + 1) * cfg.image_size, c * cfg.image_size:(c + 1) * cfg.image_size] = im
    Image.fromarray(grid.squeeze(-1) if cfg.channels == 1 else grid).save(out_png)


def plot_loss(rows: list, out_png: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    steps = [r[0] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [r[1] for r in rows], lw=0.8, alpha=0.5, label="loss")
    ax.plot(steps, [r[2] for r in rows], lw=1.5, label="smoothed")
    ax.set(xlabel="step", ylabel="MSE (eps)", yscale="log", title="seed-unet training loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return True


def finish(tr: Trainer, log: LossLog, args: argparse.Namespace, n_images: int, reason: str) -> None:
    out = args.out
    if args.ckpt_every:
        tr.save(os.path.join(out, "ckpt.pt"))
    extra = {"trainer": "tools.train", "steps": tr.step, "batch": args.batch, "lr": args.lr,
             "ema": args.ema, "train_seconds": round(tr.seconds, 1), "dataset": os.path.basename(args.data),
             "dataset_images": n_images, "kinds": args.kinds or "all",
             "final_loss": log.rows[-1][1] if log.rows else None, "device": str(tr.device)}
    manifest = save_weights(os.path.join(out, "model.safetensors"), tr.cfg, export_numpy_params(tr.ema),
                            dtype=args.export_dtype, extra=extra)
    print(f"stopped ({reason}) at step {tr.step} after {tr.seconds:.0f} s of training; wrote "
          f"{out}/model.safetensors ({manifest['param_dtype']}, {manifest['content_hash'][:19]}...)", flush=True)
    if args.preview > 0:
        preview(tr, os.path.join(out, "samples.png"), args.preview)
        print(f"wrote {out}/samples.png ({args.preview} DDPM samples, seed 0)")
    if log.rows and plot_loss(log.rows, os.path.join(out, "loss.png")):
        print(f"wrote {out}/loss.png")
    print(f"total {time.time() - T_START:.0f} s")


def main(argv: list | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(args.config)
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        torch.manual_seed(args.seed)
        images = load_images(args, cfg)
        os.makedirs(args.out, exist_ok=True)
        ckpt = os.path.join(args.out, "ckpt.pt")
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed shapes: autotune once
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        tr = Trainer(cfg, args, device)
        if args.resume is not None:
            tr.load(args.resume or ckpt)
        log = LossLog(os.path.join(args.out, "loss.csv"), tr.step if args.resume is not None else None)
        # (N, H, W, C) -> (N, C, H, W) once, on the device: the whole set is a few MB.
        data = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2))).to(device)
        print(f"seed-unet {n_params(tr.model) / 1e6:.2f} M params, {len(images)} images "
              f"{tuple(images.shape[1:])}, device {device}, batch {args.batch}, "
              f"amp {'bf16' if tr.amp else 'off'}, compile {args.compile}, from step {tr.step}", flush=True)
        reason = train(tr, data, log, ckpt)
        finish(tr, log, args, len(images), reason)
    except TrainError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

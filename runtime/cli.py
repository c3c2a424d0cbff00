"""`jetson-sample`: generate images as a PNG grid; `jetson-weights`: make or inspect weights files.

Expected failures print ONE line and exit 2 (usage, bad files) or 1 (a failure mid-run); nothing
half-written is ever left: PNGs are written to a temporary file and renamed.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np

from .errors import Cancelled, ConfigError, RuntimeErrorBase, UsageError, WeightsError
from .pipeline import BACKEND_CHOICES, DEFAULT_GPU_MODE, MODES, PRECISIONS, default_weights_path

PROG = "jetson-sample"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:   # one line, exit 2, no usage dump
        raise UsageError(f"{message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                description="Generate images with a seed-unet diffusion model (GPU through CuPy or pycuda, "
                            "or the NumPy reference on the CPU).")
    p.add_argument("--weights", default=str(default_weights_path()), help="model .npz (the shipped model by default)")
    p.add_argument("--out", default="samples.png", help="PNG grid to write")
    p.add_argument("--save-each", metavar="DIR", default=None, help="also write each image as DIR/NNN.png")
    p.add_argument("--batch", type=int, default=4, help="images to generate")
    p.add_argument("--steps", type=int, default=None, help="sampling steps (DDIM only; default: all T)")
    p.add_argument("--sampler", choices=("ddpm", "ddim"), default="ddpm", help="sampler")
    p.add_argument("--eta", type=float, default=0.0, help="DDIM eta (0: deterministic)")
    p.add_argument("--seed", type=int, default=0, help="seed of the noise stream")
    p.add_argument("--backend", choices=BACKEND_CHOICES, default="auto",
                   help="auto: CuPy when usable, else pycuda, else NumPy with a notice; pycuda runs "
                        "without CUDA graphs (as --no-graphs)")
    p.add_argument("--precision", choices=PRECISIONS, default="auto",
                   help="auto: fp16 on the GPU, fp32 on the CPU")
    p.add_argument("--mode", choices=MODES, default="auto",
                   help=f"GPU sampling: gpu (p_sample kernel, CUDA-graph steps), cpu (p_sample on the CPU, "
                        f"overlapped); auto = {DEFAULT_GPU_MODE}")
    p.add_argument("--no-graphs", action="store_true", help="gpu mode without CUDA graphs (plain launches); always so with --backend pycuda")
    p.add_argument("--trace", metavar="JSON", default=None,
                   help="write a Chrome/Perfetto timeline of the GPU streams and the CPU (GPU backends)")
    p.add_argument("--nrow", type=int, default=0, help="images per grid row (0: square-ish)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def check_output(path: Path, suffix: str = ".png") -> None:
    """Fail before sampling, not after: the file must be creatable."""
    if path.suffix.lower() != suffix:
        raise UsageError(f"--out {path} must end in {suffix}")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"output folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"output folder {parent} is not writable")
    if path.is_dir():
        raise UsageError(f"--out {path} is a folder")


def make_grid(images: np.ndarray, nrow: int = 0, pad: int = 2) -> np.ndarray:
    """(B, H, W, C) uint8 -> one (rows*(H+pad)+pad, cols*(W+pad)+pad, C) white-padded grid."""
    b, h, w, c = images.shape
    cols = nrow or int(math.ceil(math.sqrt(b)))
    rows = int(math.ceil(b / cols))
    grid = np.full((rows * (h + pad) + pad, cols * (w + pad) + pad, c), 255, dtype=np.uint8)
    for i in range(b):
        r, q = divmod(i, cols)
        grid[pad + r * (h + pad):pad + r * (h + pad) + h, pad + q * (w + pad):pad + q * (w + pad) + w] = images[i]
    return grid


def write_png(path: Path, image: np.ndarray) -> None:
    """Atomic: a temporary file in the same folder, then os.replace."""
    from PIL import Image
    mode = "RGB" if image.shape[-1] == 3 else "L"
    img = Image.fromarray(image if mode == "RGB" else image[..., 0], mode)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=str(path.parent or Path(".")))
    try:
        with os.fdopen(fd, "wb") as f:
            img.save(f, format="PNG")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _progress(quiet: bool, total: int):
    if quiet:
        return None, (lambda i, n: None)
    from tqdm import tqdm
    bar = tqdm(total=total, desc="sampling", unit="step", file=sys.stderr, leave=False)
    return bar, (lambda i, n: bar.update(1))


def sample_main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.batch < 1:
        raise UsageError(f"--batch must be >= 1, got {args.batch}")
    out = Path(args.out)
    check_output(out)
    each = Path(args.save_each) if args.save_each else None
    trace = Path(args.trace) if args.trace else None
    if trace is not None:
        check_output(trace, ".json")
    if each is not None and not (each.is_dir() and os.access(each, os.W_OK)):
        raise UsageError(f"--save-each folder {each} does not exist or is not writable")
    if args.weights == str(default_weights_path()) and not Path(args.weights).is_file():
        raise UsageError(f"no shipped model at {args.weights}; pass --weights PATH, or make random weights "
                         "with `jetson-weights random model.npz` (or train one: tools/train.py)")
    from .pipeline import Pipeline
    from .schedule import make_steps
    from .weights import load_weights
    weights = load_weights(args.weights)     # validate everything before any long work
    n_steps = len(make_steps(weights.config.schedule, args.sampler, args.steps, args.eta))
    with Pipeline(weights, backend=args.backend, precision=args.precision, mode=args.mode,
                  graphs=not args.no_graphs) as pipe:
        timeline = None
        if trace is not None and pipe.backend != "numpy":
            from .trace import Timeline
            timeline = Timeline(_backend_of(pipe))
        bar, cb = _progress(args.quiet, n_steps)
        t0 = time.perf_counter()
        try:
            images = pipe.sample(args.batch, args.steps, args.sampler, args.eta, args.seed, cb, timeline)
        finally:
            if bar is not None:
                bar.close()
        dt = time.perf_counter() - t0
        if timeline is not None:
            timeline.write(trace, {"batch": args.batch, "mode": pipe.mode, "precision": pipe.precision})
    write_png(out, make_grid(images, args.nrow))
    if each is not None:
        for i, img in enumerate(images):
            write_png(each / f"{i:03d}.png", img)
    print(f"wrote {out} ({args.batch} images, {n_steps} steps, {pipe.backend} {pipe.precision}, "
          f"{dt:.2f} s, {dt / args.batch:.2f} s/image)", file=sys.stderr)
    return 0


def _backend_of(pipe) -> object:
    from .gpu.backend import get_backend
    return get_backend(pipe.backend)


def weights_main(argv: Optional[Sequence[str]] = None) -> int:
    p = _Parser(prog="jetson-weights", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                description="Make randomly initialized weights for any config, or validate and describe a file.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("random", help="write random weights", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    r.add_argument("out")
    r.add_argument("--config", default=None, help="config JSON file (default: the spec's defaults)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    i = sub.add_parser("info", help="validate a weights file and print its manifest")
    i.add_argument("path")
    args = p.parse_args(argv)
    from .config import UNetConfig
    from .weights import load_weights, random_params, save_weights
    if args.cmd == "random":
        cfg = UNetConfig() if args.config is None else UNetConfig.from_json(_read_text(args.config))
        save_weights(args.out, cfg, random_params(cfg, args.seed), dtype=args.dtype)
        print(f"wrote {args.out} (random, seed {args.seed}, {args.dtype})")
    else:
        w = load_weights(args.path)
        m = w.manifest
        print(f"{args.path}: ok, {m['n_params']:,} parameters, {m['param_dtype']}, {m['content_hash']}")
        print(w.config.to_json())
    return 0


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None


def _run(fn, prog: str, argv: Optional[Sequence[str]]) -> int:
    try:
        return fn(argv)
    except (UsageError, WeightsError, ConfigError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except Cancelled as e:
        print(f"{prog}: cancelled: {e}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; nothing written", file=sys.stderr)
        return 130
    except RuntimeErrorBase as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1


def main(argv: Optional[List[str]] = None) -> int:
    return _run(sample_main, PROG, argv)


def weights_cli(argv: Optional[List[str]] = None) -> int:
    return _run(weights_main, "jetson-weights", argv)


if __name__ == "__main__":
    sys.exit(main())

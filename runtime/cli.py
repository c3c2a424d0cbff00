"""`jetson-sample`: generate images as a PNG grid; `jetson-weights`: make or inspect weights files.

`jetson-sample --prepare` builds the GPU kernels ahead of time into the cubin cache and
`jetson-sample --plan-only` prints the memory plan per batch and precision; neither needs a GPU.

Expected failures print ONE line and exit 2 (usage, bad files) or 1 (a failure mid-run); nothing
half-written is ever left: PNGs are written to a temporary file and renamed.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from jetson_unet import __version__, logs
from jetson_unet.model.schedule import DEFAULT_SAMPLER, DPMPP_STEPS, SAMPLERS, check_seeds, image_seeds
from jetson_unet.files import atomic_open
from jetson_unet.errors import Cancelled, ConfigError, RuntimeErrorBase, UsageError, WeightsError
from jetson_unet.build.aot import COMPILERS
from jetson_unet.pipeline import (BACKEND_CHOICES, DEFAULT_GPU_MODE, DEFAULT_NOISE, GPU_PRECISIONS, MODES,
                                  NOISE_CHOICES, PRECISIONS, default_weights_path)

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
    p.add_argument("--batch", type=int, nargs="+", default=None,
                   help="images to generate (default 4); --plan-only and --prepare take several (default 1 4 16)")
    p.add_argument("--sampler", choices=SAMPLERS, default=DEFAULT_SAMPLER,
                   help="ddpm (all T steps, noisy), ddim or dpmpp-2m (deterministic, fewer steps: docs/samplers.md)")
    p.add_argument("--steps", type=int, default=None,
                   help=f"sampling steps of ddim (default: all T) and dpmpp-2m (default {DPMPP_STEPS}); ddpm runs all T")
    p.add_argument("--eta", type=float, default=0.0, help="DDIM eta (0: deterministic)")
    p.add_argument("--seed", type=int, default=None, help="seed of the first image (default 0); image i draws from seed + i")
    p.add_argument("--seeds", type=int, nargs="+", default=None, metavar="S",
                   help="one seed per image instead (the batch is their number)")
    p.add_argument("--backend", choices=BACKEND_CHOICES, default="auto",
                   help="auto: CuPy when usable, else pycuda, else NumPy with a notice; pycuda runs "
                        "without CUDA graphs (as --no-graphs)")
    p.add_argument("--precision", choices=PRECISIONS, nargs="+", default=None,
                   help="default auto: fp16 on the GPU, fp32 on the CPU; --plan-only takes several (default "
                        "fp16 fp32), --prepare too (default fp16 fp32 bf16)")
    p.add_argument("--mode", choices=MODES, default="auto",
                   help=f"GPU sampling: gpu (p_sample kernel, CUDA-graph steps), cpu (p_sample on the CPU, "
                        f"overlapped); auto = {DEFAULT_GPU_MODE}")
    p.add_argument("--no-graphs", action="store_true", help="gpu mode without CUDA graphs (plain launches); always so with --backend pycuda")
    p.add_argument("--noise", choices=NOISE_CHOICES, default=DEFAULT_NOISE,
                   help="gpu mode: where the seed's noise stream is drawn: host (NumPy, uploaded while the GPU runs) or "
                        "device (the same stream bit for bit, drawn on the GPU; a run it cannot vouch for is redrawn "
                        "on the host); auto = device with CuPy in gpu mode, else host")
    p.add_argument("--trace", metavar="JSON", default=None,
                   help="write a Chrome/Perfetto timeline of the GPU streams and the CPU (GPU backends)")
    p.add_argument("--nrow", type=int, default=0, help="images per grid row (0: square-ish)")
    add_verbosity(p)
    p.add_argument("--cache", metavar="DIR", default=None,
                   help="kernel cache root, cubins in DIR/cubins/v1 (default: $JETSON_UNET_CACHE, else "
                        "~/.cache/jetson-unet)")
    g = p.add_argument_group("Jetson: ahead-of-time kernels and memory budget (no GPU needed)")
    g.add_argument("--prepare", action="store_true",
                   help="compile every kernel module the model needs into the cubin cache, then exit")
    g.add_argument("--plan-only", action="store_true",
                   help="print weights, arena and peak bytes per --batch and --precision and the largest batch "
                        "per --budget, then exit (exit 1 when an explicit --budget is exceeded)")
    g.add_argument("--arch", nargs="+", default=None,
                   help="--prepare targets: 87, sm_87, 72, native (default: native with a GPU here, else 87)")
    g.add_argument("--sms", type=int, nargs="+", default=None,
                   help="SM counts the tiles are chosen for (--prepare: per arch, 87 -> 4 8, 72 -> 6 8; "
                        "--plan-only: one, default 8)")
    g.add_argument("--compiler", choices=COMPILERS, default="auto",
                   help="--prepare: auto = NVRTC through CuPy when importable (for an arch it cannot target, "
                        "e.g. 72 on CUDA 13, the pip package nvidia-cuda-nvrtc-cu11/-cu12 when installed), else "
                        "that pip NVRTC, else nvcc")
    g.add_argument("--nvrtc", metavar="PATH", default=None,
                   help="--prepare: compile every arch with this libnvrtc.so (or a folder holding one), e.g. a "
                        "CUDA 11/12 NVRTC for sm_72 ($JETSON_UNET_NVRTC=PATH does the same)")
    g.add_argument("--budget", nargs="+", default=None,
                   help="--plan-only: 4GB, 8GB (Orin Nano; ~2.5 / ~5 GB usable assumed) or a byte count "
                        "(default 4GB 8GB)")
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
    with atomic_open(path, "wb") as f:
        img.save(f, format="PNG")


def _progress(quiet: bool, total: int):
    if quiet:
        return None, (lambda i, n: None)
    from tqdm import tqdm
    bar = tqdm(total=total, desc="sampling", unit="step", file=sys.stderr, leave=False)
    return bar, (lambda i, n: bar.update(1))


def add_verbosity(p: argparse.ArgumentParser) -> None:
    """--version, and the log level of the package's notices: --quiet (warnings only, no progress
    bar) or -v (debug)."""
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quiet", action="store_true", help="warnings and errors only, no progress bar")
    g.add_argument("-v", "--verbose", action="store_true", help="debug messages too")


def set_verbosity(args: argparse.Namespace) -> None:
    logs.configure(-1 if args.quiet else int(args.verbose))


def sample_main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    set_verbosity(args)
    for b in args.batch or ():
        if b < 1:
            raise UsageError(f"--batch must be >= 1, got {b}")
    if args.prepare and args.plan_only:
        raise UsageError("--prepare and --plan-only are separate steps: run one at a time")
    if args.nvrtc is not None and not args.prepare:
        raise UsageError("--nvrtc goes with --prepare")
    with _cache_env(args.cache):
        if args.prepare:
            return prepare_main(args)
        if args.plan_only:
            return plan_main(args)
        for flag, value in (("--arch", args.arch), ("--sms", args.sms), ("--budget", args.budget)):
            if value is not None:
                raise UsageError(f"{flag} goes with --prepare or --plan-only")
        args.batch = _single(args.batch, None if args.seeds else 4, "--batch")
        args.precision = _single(args.precision, "auto", "--precision")
        if args.seeds and args.seed is not None:
            raise UsageError("--seed and --seeds: give one or the other")
        args.seeds = check_seeds(args.seeds, args.batch or len(args.seeds)) if args.seeds else image_seeds(
            args.seed or 0, args.batch)
        args.batch = len(args.seeds)
        return _sample(args)


def _sample(args: argparse.Namespace) -> int:
    out = Path(args.out)
    check_output(out)
    each = Path(args.save_each) if args.save_each else None
    trace = Path(args.trace) if args.trace else None
    if trace is not None:
        check_output(trace, ".json")
    if each is not None and not (each.is_dir() and os.access(each, os.W_OK)):
        raise UsageError(f"--save-each folder {each} does not exist or is not writable")
    from jetson_unet.pipeline import Pipeline
    from jetson_unet.model.schedule import make_steps
    weights = _load_weights(args.weights)    # validate everything before any long work
    n_steps = len(make_steps(weights.config.schedule, args.sampler, args.steps, args.eta))
    with Pipeline(weights, backend=args.backend, precision=args.precision, mode=args.mode,
                  graphs=not args.no_graphs, noise=args.noise) as pipe:
        timeline = None
        if trace is not None and pipe.backend != "numpy":
            from jetson_unet.trace import Timeline
            timeline = Timeline(_backend_of(pipe))
        bar, cb = _progress(args.quiet, n_steps)
        t0 = time.perf_counter()
        try:
            images = pipe.sample(args.batch, args.steps, args.sampler, args.eta, callback=cb, timeline=timeline,
                                 seeds=args.seeds)
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


def prepare_main(args: argparse.Namespace) -> int:
    """--prepare: one line per module on stdout; exit 1 when a module could not be built."""
    from jetson_unet.build import aot
    from jetson_unet.build.cache import CubinCache
    weights = _load_weights(args.weights)
    precisions = _gpu_precisions(args.precision, ("fp16", "fp32", "bf16"))
    batches = args.batch or [1, 4, 16]
    archs = args.arch
    if archs is None:
        from jetson_unet.backends import gpu_available
        archs = ["native"] if gpu_available("cupy") is None or gpu_available("pycuda") is None else ["87"]
        if archs == ["87"]:
            print("note: no GPU here: preparing for sm_87 (Jetson Orin); --arch names other targets",
                  file=sys.stderr)
    targets = aot.parse_targets(archs, args.sms)
    compiler = aot.pick_compiler(args.compiler, library=args.nvrtc)
    failures = aot.prepare(weights, targets, precisions, batches, compiler, CubinCache(), print)
    if failures:
        print(f"{PROG}: error: {failures} kernel module(s) not built (see above)", file=sys.stderr)
        return 1
    return 0


def plan_main(args: argparse.Namespace) -> int:
    """--plan-only: the memory table; exit 1 when an explicit --budget is exceeded."""
    from jetson_unet.executor import memory
    weights = _load_weights(args.weights)
    precisions = _gpu_precisions(args.precision, ("fp16", "fp32"))
    budgets = [memory.parse_budget(b) for b in (args.budget or ("4GB", "8GB"))]
    sms = _single(args.sms, 8, "--sms")
    mode = DEFAULT_GPU_MODE if args.mode == "auto" else args.mode
    noise = "device" if mode == "gpu" and args.noise in ("auto", "device") else "host"   # auto: as the pipeline on CuPy
    misfits = memory.report(weights, precisions, args.batch or [1, 4, 16], budgets, sms, mode, print,
                            source=Path(args.weights).name, noise=noise)
    if misfits and args.budget:
        more = f" (and {len(misfits) - 1} more)" if len(misfits) > 1 else ""
        print(f"{PROG}: does not fit: {misfits[0]}{more}", file=sys.stderr)
        return 1
    return 0


def _single(values: Optional[Sequence[Any]], default: Any, flag: str) -> Any:
    if not values:
        return default
    if len(values) > 1:
        raise UsageError(f"{flag} takes one value here (several only with --plan-only / --prepare)")
    return values[0]


def _gpu_precisions(values: Optional[Sequence[str]], default: Tuple[str, ...]) -> List[str]:
    values = list(dict.fromkeys(values or default))
    bad = [v for v in values if v not in GPU_PRECISIONS]
    if bad:
        raise UsageError(f"--precision {bad[0]}: GPU kernels come in {', '.join(GPU_PRECISIONS)}")
    return values


def _load_weights(path: str) -> Any:
    if path == str(default_weights_path()) and not Path(path).is_file():
        raise UsageError(f"no shipped model at {path}; pass --weights PATH, or make random weights "
                         "with `jetson-weights random model.npz` (or train one: tools/train.py)")
    from jetson_unet.model.weights import load_weights
    return load_weights(path)


@contextlib.contextmanager
def _cache_env(root: Optional[str]) -> Iterator[None]:
    """--cache DIR is $JETSON_UNET_CACHE for this call (the cubin cache and pycuda's)."""
    old = os.environ.get("JETSON_UNET_CACHE")
    if root is not None:
        os.environ["JETSON_UNET_CACHE"] = root
    try:
        yield
    finally:
        if root is not None:
            if old is None:
                os.environ.pop("JETSON_UNET_CACHE", None)
            else:
                os.environ["JETSON_UNET_CACHE"] = old


def _backend_of(pipe) -> object:
    from jetson_unet.backends import get_backend
    return get_backend(pipe.backend)


def weights_main(argv: Optional[Sequence[str]] = None) -> int:
    p = _Parser(prog="jetson-weights", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                description="Make randomly initialized weights for any config, or validate and describe a file.")
    add_verbosity(p)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("random", help="write random weights", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    r.add_argument("out")
    r.add_argument("--config", default=None, help="config JSON file (default: the spec's defaults)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    i = sub.add_parser("info", help="validate a weights file and print its manifest")
    i.add_argument("path")
    args = p.parse_args(argv)
    set_verbosity(args)
    from jetson_unet.model.config import UNetConfig
    from jetson_unet.model.weights import load_weights, random_params, save_weights
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

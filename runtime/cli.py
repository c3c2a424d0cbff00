"""`jetson-sample`: generate images as a PNG grid; `jetson-weights`: make or inspect weights files.

`jetson-sample --prepare` builds the GPU kernels ahead of time into the cubin cache and
`jetson-sample --plan-only` prints the memory plan per batch and precision; neither needs a GPU.

Expected failures print ONE line and exit 2 (usage, bad files) or 1 (a failure mid-run, a full
disk); every number is checked as it is parsed and every output proven writable before the weights
load, and the outputs of a run (grid, --save-each images, trace) land together or not at all.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from jetson_unet import __version__, logs
from jetson_unet.model.schedule import (DEFAULT_SAMPLER, DPMPP_STEPS, SAMPLERS, SEED_LIMIT, check_seeds,
                                        image_seeds)
from jetson_unet.files import check_writable, output_set, writing
from jetson_unet.errors import Cancelled, ConfigError, RuntimeErrorBase, UsageError, WeightsError
from jetson_unet.build.aot import COMPILERS
from jetson_unet.pipeline import (BACKEND_CHOICES, DEFAULT_GPU_MODE, DEFAULT_NOISE, GPU_PRECISIONS, MODES,
                                  NOISE_CHOICES, PRECISIONS, default_weights_path)

PROG = "jetson-sample"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:   # one line, exit 2, no usage dump
        raise UsageError(f"{message} (see {self.prog} --help)")


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Appends argparse's default only where it is what happens: not when the help text already says
    what the default does (`--seed`: "default 0" for a None that means seed 0), nor for a None or
    False (an absent option); lists as they are typed (`1 16`, not `[1, 16]`)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        absent = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if absent or "default" in text or not action.option_strings:
            return text
        if isinstance(action.default, (list, tuple)):
            return f"{text} (default: {' '.join(map(str, action.default))})"
        return super()._get_help_string(action)


# ---- argparse types: every number refused as it is parsed, one line naming the flag ----------------

def number(flag: str, low: float, kind: type = int, strict: bool = False) -> Callable[[str], Any]:
    """`kind(text)`, finite and >= low (> low when strict), else a UsageError naming `flag`: at parse
    time, before any weights load or sampling starts."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is not None and math.isfinite(value) and (value > low if strict else value >= low):
            return value
        what = "" if kind is int and value is not None else ("an integer " if kind is int else "a finite number ")
        raise UsageError(f"{flag} must be {what}{'>' if strict else '>='} {low:g}, got {text}")
    return parse


def seed_number(flag: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = -1
        if 0 <= value < SEED_LIMIT:
            return value
        raise UsageError(f"{flag}: seeds are integers 0 <= s < 2**63, got {text}")
    return parse


def budget(text: str) -> Any:
    """--budget: 4GB, 8GB or a byte count (jetson_unet.executor.memory.parse_budget), at parse time."""
    from jetson_unet.executor import memory
    try:
        return memory.parse_budget(text)
    except OverflowError:   # 'inf', '1e999'
        raise UsageError(f"--budget {text!r}: give 4GB or 8GB (Orin Nano boards) or a byte count") from None


TRACE_NEEDS_GPU = ("--trace records the GPU's launches and this run is on the NumPy backend: drop --trace "
                   "(or run on a GPU backend)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, formatter_class=_Help,
                description="Generate images with a seed-unet diffusion model (GPU through CuPy or pycuda, "
                            "or the NumPy reference on the CPU).")
    p.add_argument("--weights", default=str(default_weights_path()),
                   help="model .safetensors or .npz (the shipped model by default)")
    p.add_argument("--out", default="samples.png", help="PNG grid to write")
    p.add_argument("--save-each", metavar="DIR", default=None,
                   help="also write each image as DIR/NNN.png (DIR must exist)")
    p.add_argument("--batch", type=number("--batch", 1), nargs="+", default=None,
                   help="images to generate (default 4); --plan-only and --prepare take several (default 1 4 16)")
    p.add_argument("--sampler", choices=SAMPLERS, default=DEFAULT_SAMPLER,
                   help="ddpm (all T steps, noisy), ddim or dpmpp-2m (deterministic, fewer steps: docs/samplers.md)")
    p.add_argument("--steps", type=number("--steps", 1), default=None,
                   help=f"sampling steps of ddim (default: all T) and dpmpp-2m (default {DPMPP_STEPS}); ddpm runs all T")
    p.add_argument("--eta", type=number("--eta", 0, float), default=0.0, help="DDIM eta (0: deterministic)")
    p.add_argument("--seed", type=seed_number("--seed"), default=None,
                   help="seed of the first image (default 0); image i draws from seed + i")
    p.add_argument("--seeds", type=seed_number("--seeds"), nargs="+", default=None, metavar="S",
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
                   help="write a Chrome/Perfetto timeline of the GPU streams and the CPU (a GPU backend only)")
    p.add_argument("--nrow", type=number("--nrow", 0), default=0, help="images per grid row (0: square-ish)")
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
    g.add_argument("--sms", type=number("--sms", 1), nargs="+", default=None,
                   help="SM counts the tiles are chosen for: sampling runs on a slice of that many SMs (a CUDA "
                        "green context, CuPy; one value); --prepare: per arch, 87 -> 4 8, 72 -> 6 8; --plan-only: one, "
                        "default 8")
    g.add_argument("--compiler", choices=COMPILERS, default="auto",
                   help="--prepare: auto = NVRTC through CuPy when importable (for an arch it cannot target, "
                        "e.g. 72 on CUDA 13, the pip package nvidia-cuda-nvrtc-cu11/-cu12 when installed), else "
                        "that pip NVRTC, else nvcc")
    g.add_argument("--nvrtc", metavar="PATH", default=None,
                   help="--prepare: compile every arch with this libnvrtc.so (or a folder holding one), e.g. a "
                        "CUDA 11/12 NVRTC for sm_72 ($JETSON_UNET_NVRTC=PATH does the same)")
    g.add_argument("--budget", type=budget, nargs="+", default=None,
                   help="--plan-only: 4GB, 8GB (Orin Nano; ~2.5 / ~5 GB usable assumed) or a byte count "
                        "(default 4GB 8GB)")
    return p


def check_output(path: Path, flag: str, suffix: str) -> None:
    """Fail before sampling, not after: the file must end in `suffix` and be creatable."""
    if path.suffix.lower() != suffix:
        raise UsageError(f"{flag} {path} must end in {suffix}")
    check_writable(path, flag)


def check_sample_outputs(args: argparse.Namespace) -> None:
    """Every output of a sampling run proven writable (a temporary file made there) before the
    weights load: the grid, --trace, --save-each and an explicit --cache."""
    check_output(Path(args.out), "--out", ".png")
    if args.trace is not None:
        if args.backend == "numpy":
            raise UsageError(TRACE_NEEDS_GPU)
        check_output(Path(args.trace), "--trace", ".json")
    if args.save_each is not None:
        check_writable(args.save_each, "--save-each", folder=True)
    if args.cache is not None:
        check_writable(args.cache, "--cache", folder=True, create=True)


def make_grid(images: np.ndarray, nrow: int = 0, pad: int = 2) -> np.ndarray:
    """(B, H, W, C) uint8 -> one (rows*(H+pad)+pad, cols*(W+pad)+pad, C) white-padded grid."""
    if nrow < 0:
        raise UsageError(f"nrow must be >= 0, got {nrow}")
    b, h, w, c = images.shape
    cols = nrow or int(math.ceil(math.sqrt(b)))
    rows = int(math.ceil(b / cols))
    grid = np.full((rows * (h + pad) + pad, cols * (w + pad) + pad, c), 255, dtype=np.uint8)
    for i in range(b):
        r, q = divmod(i, cols)
        grid[pad + r * (h + pad):pad + r * (h + pad) + h, pad + q * (w + pad):pad + q * (w + pad) + w] = images[i]
    return grid


def encode_png(f: Any, image: np.ndarray) -> None:
    """(H, W, 3 or 1) uint8 as a PNG into the open binary file `f`."""
    from PIL import Image
    mode = "RGB" if image.shape[-1] == 3 else "L"
    Image.fromarray(image if mode == "RGB" else image[..., 0], mode).save(f, format="PNG")


def write_outputs(images: np.ndarray, out: Path, nrow: int = 0, each: Optional[Path] = None,
                  trace: Optional[Path] = None, timeline: Any = None, meta: Optional[dict] = None) -> None:
    """The grid, the images of --save-each and the trace: written to temporary files, renamed only
    when all were written; on a failure (a full disk) none is left (OutputError, exit 1)."""
    with output_set() as staged:
        with staged.open(out) as f:
            encode_png(f, make_grid(images, nrow))
        for i, img in enumerate(images if each is not None else ()):
            with staged.open(each / f"{i:03d}.png") as f:
                encode_png(f, img)
        if timeline is not None:
            timeline.write(staged.path(trace), meta)


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
    args = build_parser().parse_args(argv)   # every number checked here (argparse types above)
    set_verbosity(args)
    if args.prepare and args.plan_only:
        raise UsageError("--prepare and --plan-only are separate steps: run one at a time")
    if args.nvrtc is not None and not args.prepare:
        raise UsageError("--nvrtc goes with --prepare")
    with _cache_env(args.cache):
        if args.prepare:
            return prepare_main(args)
        if args.plan_only:
            return plan_main(args)
        for flag, value in (("--arch", args.arch), ("--budget", args.budget)):
            if value is not None:
                raise UsageError(f"{flag} goes with --prepare or --plan-only")
        args.batch = _single(args.batch, None if args.seeds else 4, "--batch")
        args.sms = _single(args.sms, None, "--sms")
        args.precision = _single(args.precision, "auto", "--precision")
        if args.seeds and args.seed is not None:
            raise UsageError("--seed and --seeds: give one or the other")
        args.seeds = check_seeds(args.seeds, args.batch or len(args.seeds)) if args.seeds else image_seeds(
            args.seed or 0, args.batch)
        args.batch = len(args.seeds)
        return _sample(args)


def _sample(args: argparse.Namespace) -> int:
    check_sample_outputs(args)
    out, trace = Path(args.out), Path(args.trace) if args.trace else None
    from jetson_unet.pipeline import Pipeline
    from jetson_unet.model.schedule import make_steps
    weights = _load_weights(args.weights)    # validate everything before any long work
    n_steps = len(make_steps(weights.config.schedule, args.sampler, args.steps, args.eta))
    with Pipeline(weights, backend=args.backend, precision=args.precision, mode=args.mode,
                  graphs=not args.no_graphs, noise=args.noise, sms=args.sms) as pipe:
        timeline = None
        if trace is not None:
            if pipe.backend == "numpy":   # --backend auto without a GPU
                raise UsageError(TRACE_NEEDS_GPU)
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
        write_outputs(images, out, args.nrow, Path(args.save_each) if args.save_each else None, trace, timeline,
                      {"batch": args.batch, "mode": pipe.mode, "precision": pipe.precision})
    print(f"wrote {out} ({args.batch} images, {n_steps} steps, {pipe.backend} {pipe.precision}, "
          f"{dt:.2f} s, {dt / args.batch:.2f} s/image)", file=sys.stderr)
    return 0


def prepare_main(args: argparse.Namespace) -> int:
    """--prepare: one line per module on stdout; exit 1 when a module could not be built."""
    from jetson_unet.build import aot
    from jetson_unet.build.cache import CubinCache
    cache = CubinCache()   # its folder proven writable before anything compiles
    flag = "--cache" if args.cache else "kernel cache"
    check_writable(args.cache or cache.root, flag, folder=True, create=True)
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
    weights = _load_weights(args.weights)
    failures = aot.prepare(weights, targets, precisions, batches, compiler, cache, print)
    if failures:
        print(f"{PROG}: error: {failures} kernel module(s) not built (see above)", file=sys.stderr)
        return 1
    return 0


def plan_main(args: argparse.Namespace) -> int:
    """--plan-only: the memory table; exit 1 when an explicit --budget is exceeded."""
    from jetson_unet.executor import memory
    weights = _load_weights(args.weights)
    precisions = _gpu_precisions(args.precision, ("fp16", "fp32"))
    budgets = args.budget or [memory.parse_budget(b) for b in ("4GB", "8GB")]   # --budget: parsed by argparse
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
                         "with `jetson-weights random model.safetensors` (or train one: tools/train.py)")
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
    return get_backend(pipe.backend, pipe.sms)


def weights_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="jetson-weights", formatter_class=_Help,
                description="Make randomly initialized weights for any config, validate and describe a file, or "
                            "convert one between .safetensors and .npz.")
    add_verbosity(p)
    sub = p.add_subparsers(dest="cmd", metavar="{random,info,convert}")
    r = sub.add_parser("random", help="write random weights", formatter_class=_Help)
    r.add_argument("out", metavar="OUT", help="the .safetensors or .npz to write (missing folders are made)")
    r.add_argument("--config", default=None, help="config JSON file (default: the spec's defaults)")
    r.add_argument("--seed", type=seed_number("--seed"), default=0, help="seed of the random values")
    r.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="parameter dtype")
    i = sub.add_parser("info", help="validate a weights file and print its manifest")
    i.add_argument("path")
    c = sub.add_parser("convert", help="validate a weights file and write it in the format of DST's extension "
                                       "(.safetensors or .npz), manifest and content hash kept")
    c.add_argument("src", metavar="SRC")
    c.add_argument("dst", metavar="DST", help="the .safetensors or .npz to write (missing folders are made)")
    return p


def weights_main(argv: Optional[Sequence[str]] = None) -> int:
    p = weights_parser()
    args = p.parse_args(argv)
    set_verbosity(args)
    if args.cmd is None:   # as argparse does for a usage error: the help on stderr, exit 2
        p.print_help(sys.stderr)
        return 2
    from jetson_unet.model.config import UNetConfig
    from jetson_unet.model.weights import (convert_weights, load_weights, random_params, save_weights,
                                           weights_format)
    if args.cmd in ("random", "convert"):   # the output's format and location, before any work
        flag, out = ("OUT", args.out) if args.cmd == "random" else ("DST", args.dst)
        if weights_format(out) is None:
            raise UsageError(f"{flag} {out} must end in .safetensors or .npz (the format it is written in)")
        check_writable(out, flag, create=True)
    if args.cmd == "random":
        cfg = UNetConfig() if args.config is None else UNetConfig.from_json(_read_text(args.config))
        with writing(args.out):
            save_weights(args.out, cfg, random_params(cfg, args.seed), dtype=args.dtype)
        print(f"wrote {args.out} (random, seed {args.seed}, {args.dtype})")
    elif args.cmd == "convert":
        with writing(args.dst):
            w = convert_weights(args.src, args.dst)
        print(f"wrote {args.dst} ({weights_format(args.dst)}, from {w.file_format} {args.src}, "
              f"{w.manifest['content_hash']})")
    else:
        w = load_weights(args.path)
        m = w.manifest
        print(f"{args.path}: ok, {w.file_format}, {m['n_params']:,} parameters, {m['param_dtype']}, "
              f"{m['content_hash']}")
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
    except OSError as e:   # the environment failed mid-run (a full disk, an I/O error): one line, no traceback
        where = f"{e.filename}: " if e.filename else ""
        print(f"{prog}: error: {where}{e.strerror or e}", file=sys.stderr)
        return 1


def main(argv: Optional[List[str]] = None) -> int:
    return _run(sample_main, PROG, argv)


def weights_cli(argv: Optional[List[str]] = None) -> int:
    return _run(weights_main, "jetson-weights", argv)


if __name__ == "__main__":
    sys.exit(main())

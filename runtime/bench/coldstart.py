"""A fresh process's way to its first image, phase by phase: the child that `jetson-bench` spawns.

    python -m jetson_unet.bench.coldstart --backend cupy --precision fp16 [--weights W] [--mode gpu] ...

prints ONE JSON line on stdout, seconds by time.perf_counter from this module's first statement
(the interpreter's own start-up before it is not counted; jetson-bench's wall clock of the whole
process is):

    import_s      numpy, the runtime and the GPU backend's module (cupy / pycuda), imported here
    weights_s     Pipeline(...): weights read and validated, backend probed
    load_s        Pipeline.load(batch): kernels_s + upload_s
    kernels_s     its kernel modules: loaded (shipped cubins, else the cubin cache) or compiled
    upload_s      the rest of it: weights packed and uploaded, arena, sampler tables
    first_step_s  from sample() to the callback of step 0 (it fires once step 0 has completed)
    image_s       the rest of the image, to sample()'s return
    total_s       from the first statement to the image; the phases sum to at most this
    ready_s       weights_s + load_s + first_step_s: time to the first step without the imports
                  (issue 8's goal: < 1 s with `--prepare`d cubins on an H100/H200)
    compiles      kernel modules compiled (the loader's compile notices)
    kernels_from  where each module came from: "shipped", "cache" or "compiled"

With --then-batch N the same Pipeline then samples a batch of N, as an application that changes its
batch size: new_batch_load_s (Pipeline.load(N): its engine; new_batch_kernels_s of it for kernels
not already in memory), new_batch_image_s (its image), new_batch_s (both) and new_batch_compiles.

Errors print one line on stderr with jetson-sample's exit codes (2 usage/files, 1 mid-run).
Method and the three cache states: docs/bench.md.
"""
from __future__ import annotations

import time

T0 = time.perf_counter()   # every later import is part of import_s

import json  # noqa: E402
import sys  # noqa: E402
from typing import Any, Dict, List, Optional, Sequence, Tuple  # noqa: E402

from jetson_unet import logs  # noqa: E402

PROG = "python -m jetson_unet.bench.coldstart"
PHASES = ("import_s", "weights_s", "load_s", "first_step_s", "image_s", "total_s", "ready_s")
BACKEND_MODULES = {"cupy": ("cupy", "cupyx"), "pycuda": ("pycuda.driver",)}


def build_parser() -> Any:
    from jetson_unet.cli import _Parser
    from jetson_unet.model.schedule import SAMPLERS
    from jetson_unet.pipeline import BACKEND_CHOICES, MODES, PRECISIONS
    p = _Parser(prog=PROG, description="Time a fresh process to its first step and image; one JSON line.")
    p.add_argument("--weights", default=None, help="weights file (default: the shipped model)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--backend", choices=BACKEND_CHOICES, default="auto")
    p.add_argument("--precision", choices=PRECISIONS, default="auto")
    p.add_argument("--mode", choices=MODES, default="auto")
    p.add_argument("--no-graphs", action="store_true")
    p.add_argument("--sampler", choices=SAMPLERS, default="ddpm")
    p.add_argument("--steps", type=int, default=None, help="ddim and dpmpp-2m")
    p.add_argument("--eta", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sms", type=int, default=None, help="run on a slice of that many SMs")
    p.add_argument("--then-batch", type=int, default=None, metavar="N",
                   help="then sample a batch of N in the same Pipeline (a new batch size in a running one)")
    return p


def import_backend(backend: str) -> None:
    """The GPU backend's Python modules now, so their import is not charged to a later phase.
    A failure is left to Pipeline(), which reports it (or falls back to numpy on auto)."""
    import importlib
    for name in (("cupy", "pycuda") if backend == "auto" else (backend,)):
        try:
            for mod in BACKEND_MODULES.get(name, ()):
                importlib.import_module(mod)
            if name in BACKEND_MODULES:
                importlib.import_module(f"jetson_unet.backends.{name}")
                importlib.import_module("jetson_unet.sampling.gpu")
                return
        except Exception:   # ImportError, or a broken CUDA install raising at import
            continue


def measure(args: Any, notes: List[str]) -> Dict[str, Any]:
    """The phases after the imports; `notes` collects the kernel loader's notices meanwhile."""
    from jetson_unet.pipeline import Pipeline
    # the numpy engine's module, imported lazily otherwise
    from jetson_unet.model.reference import Reference  # noqa: F401
    t_import = time.perf_counter()
    first: List[float] = []   # the time of step 0's callback, then one entry per later step

    def on_step(i: int, n: int) -> None:
        first.append(time.perf_counter())

    with Pipeline(args.weights, backend=args.backend, precision=args.precision, mode=args.mode,
                  graphs=not args.no_graphs, sms=args.sms) as pipe:
        t_weights = time.perf_counter()
        load_s, kernels_s, origins = timed_load(pipe, args.batch)
        t_load = time.perf_counter()
        pipe.sample(args.batch, args.steps, args.sampler, args.eta, args.seed, callback=on_step)
        t_end = time.perf_counter()
        backend, precision, mode = pipe.backend, pipe.precision, pipe.mode
        t_first = first[0] if first else t_end
        rec: Dict[str, Any] = {"import_s": t_import - T0, "weights_s": t_weights - t_import,
                               "load_s": t_load - t_weights, "kernels_s": kernels_s,
                               "upload_s": max(0.0, load_s - kernels_s), "first_step_s": t_first - t_load,
                               "image_s": t_end - t_first, "total_s": t_end - T0}
        rec["ready_s"] = rec["weights_s"] + rec["load_s"] + rec["first_step_s"]   # unrounded: they sum to total_s
        rec.update(compiles=count_compiles(notes), kernels_from=origins, kernel_notices=list(notes),
                   backend=backend, precision=precision, mode=None if backend == "numpy" else mode,
                   batch=args.batch, sampler=args.sampler, steps=len(first))
        if args.then_batch:
            rec.update(new_batch(pipe, args, notes))
    return rec


def timed_load(pipe: Any, batch: int) -> Tuple[float, float, List[str]]:
    """Pipeline.load(batch): (its seconds, those of its kernel modules, where each module came from)."""
    from jetson_unet.build.loader import LOADS
    n, t0 = len(LOADS), time.perf_counter()
    pipe.load(batch)
    load_s, loads = time.perf_counter() - t0, LOADS[n:]
    return load_s, sum((s for _, s in loads), 0.0), [origin for origin, _ in loads]


def count_compiles(notes: Sequence[str]) -> int:
    from jetson_unet.build.loader import compile_notice
    prefix = compile_notice(0).split(" for ")[0]   # "compiling GPU kernels"
    return sum(m.startswith(prefix) for m in notes)


def new_batch(pipe: Any, args: Any, notes: List[str]) -> Dict[str, Any]:
    """--then-batch N: the same Pipeline's first batch of N, its engine built first (Pipeline.load)."""
    n_notes = len(notes)
    load_s, kernels_s, _ = timed_load(pipe, args.then_batch)
    t0 = time.perf_counter()
    pipe.sample(args.then_batch, args.steps, args.sampler, args.eta, args.seed)
    image_s = time.perf_counter() - t0
    return {"new_batch": args.then_batch, "new_batch_load_s": load_s, "new_batch_kernels_s": kernels_s,
            "new_batch_image_s": image_s, "new_batch_s": load_s + image_s,
            "new_batch_compiles": count_compiles(notes[n_notes:])}


def child_main(argv: Optional[Sequence[str]]) -> int:
    args = build_parser().parse_args(argv)
    import_backend(args.backend)
    with logs.captured() as notes:   # the kernel loader's notices, counted in `compiles`
        rec = measure(args, notes)
    print(json.dumps(rec), flush=True)
    return 0


def parse_line(line: Optional[str]) -> Optional[Dict[str, Any]]:
    """The child's JSON line -> its record, or None unless every phase is a number >= 0."""
    try:
        rec = json.loads(line or "")
    except ValueError:
        return None
    if not isinstance(rec, dict):
        return None
    for k in PHASES:
        v = rec.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            return None
    return rec


def main(argv: Optional[List[str]] = None) -> int:
    from jetson_unet.cli import _run
    return _run(child_main, PROG, argv)


if __name__ == "__main__":
    sys.exit(main())

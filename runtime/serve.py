"""`jetson-serve`: one Pipeline behind Triton Inference Server (through PyTriton), as the model
`seed-unet`.

Each row of a request is one image: `seed` (INT64), `steps` (INT32; 0 is the sampler's default) and
`sampler` (BYTES: ddpm, ddim, dpmpp-2m) in, `image` (UINT8, H x W x 3) out. Triton's dynamic batcher
gathers requests; the rows of a batch that share sampler and step count run together, each image
from its own seed, so an image depends on its seed only. On a GPU the server keeps a warm engine for
each of --batch-sizes, times each at start-up, and runs a batch as the engine calls of least summed
time (padded rows): a lone request costs a batch-1 call, 8 requests on an Orin two batch-4 calls, a
full batch one call at --max-batch-size. Every engine is built, warmed and timed before the server
reports ready.

Every request is checked before anything is sampled; a bad one, or a batch the memory refuses, is
answered with a Triton error and the server carries on. SIGTERM or SIGINT stops taking requests,
finishes those in flight, and exits 0. PyTriton is imported here only (the `serve` extra).
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from jetson_unet.cli import _Help, _load_weights, _Parser, _run, add_verbosity, number, set_verbosity
from jetson_unet.errors import BackendUnavailable, RuntimeErrorBase, UsageError
from jetson_unet.model.schedule import check_seeds, make_steps
from jetson_unet.pipeline import BACKEND_CHOICES, PRECISIONS, Pipeline, default_weights_path
from jetson_unet.sampling.engines import WARM_STEPS, Costs

log = logging.getLogger(__name__)
PROG = "jetson-serve"
MODEL = "seed-unet"
INPUTS = ("seed", "steps", "sampler")
Row = Tuple[int, int, str]   # seed, step count, sampler


def port(flag: str):
    """An argparse type: a TCP port, 1..65535."""
    low = number(flag, 1)

    def parse(text: str) -> int:
        value = low(text)
        if value > 65535:
            raise UsageError(f"{flag} must be a port number <= 65535, got {text}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, formatter_class=_Help,
                description=f"Serve the model as `{MODEL}` through Triton Inference Server (HTTP, gRPC, metrics); "
                            "needs the serve extra.")
    p.add_argument("--weights", default=str(default_weights_path()),
                   help="model weights file (the shipped model by default)")
    p.add_argument("--backend", choices=BACKEND_CHOICES, default="auto",
                   help="auto: CuPy when usable, else pycuda, else NumPy with a notice")
    p.add_argument("--precision", choices=PRECISIONS, default="auto", help="auto: fp16 on the GPU, fp32 on the CPU")
    p.add_argument("--sms", type=number("--sms", 1), default=None,
                   help="serve from a slice of N SMs (a CUDA green context, CuPy): a GPU shared with other work")
    p.add_argument("--max-batch-size", type=number("--max-batch-size", 1), default=16,
                   help="most images in one batch (Triton's max_batch_size)")
    p.add_argument("--batch-sizes", type=number("--batch-sizes", 1), nargs="+", default=None, metavar="N",
                   help="the batch sizes a GPU keeps a warm engine for, each timed at start-up; a batch runs "
                        "as the engine calls of least time, padded (default: 1, 4, 16, ... below "
                        "--max-batch-size, and --max-batch-size)")
    p.add_argument("--queue-delay-us", type=number("--queue-delay-us", 0), default=1000,
                   help="how long a request may wait for others to fill its batch, in microseconds")
    p.add_argument("--http-port", type=port("--http-port"), default=8000, help="HTTP/REST (KServe v2) port")
    p.add_argument("--grpc-port", type=port("--grpc-port"), default=8001, help="gRPC port")
    p.add_argument("--metrics-port", type=port("--metrics-port"), default=8002, help="Prometheus metrics port")
    add_verbosity(p)
    return p


# ---- one batch of requests: checked, grouped by (sampler, steps), sampled, split back --------------------

def request_rows(request: Mapping[str, np.ndarray], schedule: Any) -> List[Row]:
    """The rows of one request as (seed, step count, sampler), each checked: a UsageError names the
    first bad value."""
    seeds, steps, samplers = (np.asarray(request[name]).reshape(-1).tolist() for name in INPUTS)
    if not len(seeds) == len(steps) == len(samplers):
        raise UsageError(f"seed, steps and sampler need one value per image, got {len(seeds)}, {len(steps)} "
                         f"and {len(samplers)}")
    check_seeds(seeds, len(seeds))
    bad = [n for n in steps if not 0 <= n <= schedule.timesteps]
    if bad:
        raise UsageError(f"steps must be 0 (the sampler's default) to {schedule.timesteps}, got {bad[0]}")
    names = [s.decode("utf-8", "replace") if isinstance(s, bytes) else str(s) for s in samplers]
    return [(seed, len(make_steps(schedule, name, n or None)), name) for seed, n, name in zip(seeds, steps, names)]


def checked_rows(requests: Sequence[Mapping[str, np.ndarray]], schedule: Any) -> List[List[Row]]:
    """Every request's rows, or one UsageError naming the first bad request: Triton answers a whole
    batch with one error, so its other requests are not run."""
    out = []
    for i, request in enumerate(requests):
        try:
            out.append(request_rows(request, schedule))
        except UsageError as e:
            where = f" (request {i + 1} of {len(requests)} in this batch; none was run)" if len(requests) > 1 else ""
            raise UsageError(f"{e}{where}") from None
    return out


def sample_rows(pipe: Pipeline, rows: List[List[Row]]) -> List[np.ndarray]:
    """One image array per request (rows, H, W, C): one sample() call per (sampler, steps), which a
    GPU runs as its loaded engines' calls of least time."""
    groups: Dict[Tuple[str, int], List[Tuple[int, int]]] = {}
    for r, request in enumerate(rows):
        for k, (_, n, name) in enumerate(request):
            groups.setdefault((name, n), []).append((r, k))
    c = pipe.config
    out = [np.zeros((len(request), c.image_size, c.image_size, c.channels), np.uint8) for request in rows]
    for (name, n), where in groups.items():
        seeds = [rows[r][k][0] for r, k in where]
        images = pipe.sample(seeds=seeds, sampler=name, steps=n)
        for (r, k), image in zip(where, images):
            out[r][k] = image
    return out


class Model:
    """The inference callable: a list of requests in, one {"image": ...} per request out."""

    def __init__(self, pipe: Pipeline) -> None:
        self.pipe = pipe

    def __call__(self, requests: Sequence[Mapping[str, np.ndarray]]) -> List[Dict[str, np.ndarray]]:
        """Raises for the whole batch (PyTriton answers each of its requests with the error)."""
        try:
            rows = checked_rows(requests, self.pipe.config.schedule)
            log.debug("batch of %d request(s), %d image(s)", len(rows), sum(map(len, rows)))
            return [{"image": images} for images in sample_rows(self.pipe, rows)]
        except UsageError as e:
            log.info("refused %d request(s): %s", len(requests), e)
            raise
        except RuntimeErrorBase as e:   # a batch that does not fit, a GPU error: the next batch runs anew
            log.warning("failed %d request(s): %s", len(requests), e)
            raise
        except Exception:
            log.exception("failed %d request(s)", len(requests))
            raise


def batch_sizes(max_batch: int, sizes: Optional[Sequence[int]] = None) -> List[int]:
    """The engines' batch sizes: `sizes` (--batch-sizes, none above max_batch) with max_batch, or by
    default the powers of 4 below max_batch and max_batch (16: 1, 4, 16). On the compute-bound Orin a
    call's time grows with its batch (8-SM slice: 0.71 ms at batch 1, 6.8 at 16), so a lone request on
    the batch-16 engine would cost ~10x its own call; each engine adds its weights and arena."""
    if sizes is None:
        sizes = [4 ** k for k in range(max_batch.bit_length()) if 4 ** k < max_batch]
    big = [n for n in sizes if n > max_batch]
    if big:
        raise UsageError(f"--batch-sizes {big[0]} is larger than --max-batch-size {max_batch}")
    return sorted(set(sizes) | {max_batch})


def warm(pipe: Pipeline, sizes: Sequence[int]) -> Costs:
    """Refuse batch sizes that do not fit, then on a GPU build, run and time each engine
    (Pipeline.load; one engine is run here), so that no engine is built while serving; on numpy
    sample one image. Returns the engines' costs (none on numpy or for one engine)."""
    pipe.load(sizes)
    if len(pipe.loaded) < 2:
        pipe.sample(seeds=[0] * (pipe.loaded or (1,))[0], sampler="ddim", steps=WARM_STEPS)
    return pipe.engine_costs


# ---- the server ------------------------------------------------------------------------------------------

def engines_text(sizes: Sequence[int], costs: Costs) -> str:
    """The engines and their times, where timed, for the start-up line ("" on numpy)."""
    if not sizes:
        return ""
    return ", engines " + ", ".join(f"b{size}" + (f" {1e3 * costs[size][0]:.2f} ms/step" if size in costs else "")
                                    for size in sizes)


def libpython_env(environ: Mapping[str, str]) -> Dict[str, str]:
    """`environ` with this interpreter's libpython folder first on LD_LIBRARY_PATH when it is not a
    system folder: Triton's Python stub, started by the server, must load this interpreter's libpython,
    not a system one of the same version (a pyenv or conda Python)."""
    env = dict(environ)
    libdir = sysconfig.get_config_var("LIBDIR")
    arch = sysconfig.get_config_var("MULTIARCH") or ""
    system = {"/lib", "/lib64", "/usr/lib", "/usr/lib64", f"/lib/{arch}", f"/usr/lib/{arch}"}
    if not libdir or not sysconfig.get_config_var("Py_ENABLE_SHARED") or os.path.normpath(libdir) in system:
        return env
    paths = [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    if libdir not in paths:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([libdir] + paths)
    return env


def _pytriton():
    try:
        import pytriton.triton  # noqa: F401  (the serve extra)
    except ImportError as e:
        raise BackendUnavailable(f"PyTriton is not installed: pip install 'jetson-unet-runtime[serve]' ({e})") from None
    from pytriton import model_config, triton
    return model_config, triton


def stub_numpy(environ: Mapping[str, str]) -> Optional[str]:
    """The NumPy version Triton's Python stub will import: this interpreter's environment's, without
    PYTHONPATH (the stub reads the environment and ignores PYTHONPATH); None if it has none."""
    env = {k: v for k, v in environ.items() if k != "PYTHONPATH"}
    try:
        r = subprocess.run([sys.executable, "-c", "import numpy; print(numpy.__version__)"], env=env,
                           capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def check_stub_numpy(environ: Mapping[str, str]) -> None:
    """PyTriton 0.7's stub is built for NumPy 1: with NumPy 2 it dies on the first request's BYTES
    input (H100, 2026-11-27), so say so before anything loads."""
    version = stub_numpy(environ)
    if version is None:
        raise BackendUnavailable(f"Triton's Python stub cannot import NumPy in this interpreter's environment "
                                 f"({sys.executable})")
    if int(version.split(".")[0]) >= 2:
        raise BackendUnavailable(f"PyTriton's Python stub needs NumPy < 2 in this interpreter's environment, "
                                 f"found {version}: pip install 'numpy<2' (where CuPy needs NumPy 2: "
                                 f"docs/serving.md)")


def check_ports(args: argparse.Namespace) -> None:
    """Each port distinct and free on every address (as Triton binds them), before the weights load."""
    flags = {"--http-port": args.http_port, "--grpc-port": args.grpc_port, "--metrics-port": args.metrics_port}
    if len(set(flags.values())) < len(flags):
        raise UsageError(f"give {', '.join(flags)} three different ports, got {', '.join(map(str, flags.values()))}")
    for flag, value in flags.items():
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", value))
            except OSError as e:
                raise UsageError(f"{flag} {value}: {e.strerror} (another server on it? pick a free port)") from None


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def binding(mc: Any, pipe: Pipeline, args: argparse.Namespace) -> Dict[str, Any]:
    """Triton.bind's arguments: the model's name, tensors, batching and callable."""
    c = pipe.config
    batcher = mc.DynamicBatcher(max_queue_delay_microseconds=args.queue_delay_us)
    return {"model_name": MODEL, "infer_func": Model(pipe),
            "inputs": [mc.Tensor(name=name, dtype=dtype, shape=(1,))
                       for name, dtype in zip(INPUTS, (np.int64, np.int32, np.bytes_))],
            "outputs": [mc.Tensor(name="image", dtype=np.uint8, shape=(c.image_size, c.image_size, c.channels))],
            "config": mc.ModelConfig(max_batch_size=args.max_batch_size, batcher=batcher)}


def serve(pipe: Pipeline, args: argparse.Namespace, costs: Costs) -> int:
    """Start Triton with the model bound, answer until SIGTERM / SIGINT, then drain and stop."""
    mc, tr = _pytriton()
    config = tr.TritonConfig(http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port,
                             log_file=None if args.verbose else os.devnull)   # -v: Triton's own log on stdout
    if not args.verbose:   # Model logs why a batch failed in one line; PyTriton would add a traceback
        logging.getLogger("pytriton").setLevel(logging.ERROR)
    os.environ.update(libpython_env(os.environ))   # the Triton process inherits this process's environment
    stop = _stop_on_signals()
    # the model bound before Triton starts, so that Triton reports ready only once it is loaded
    policy = tr.TritonLifecyclePolicy(launch_triton_on_startup=False, local_model_store=True)
    with tr.Triton(config=config, triton_lifecycle_policy=policy) as triton:
        triton.bind(**binding(mc, pipe, args))
        triton.run()
        log.info("serving %s (%s %s, max batch %d%s): http :%d, grpc :%d, metrics :%d", MODEL, pipe.backend,
                 pipe.precision, args.max_batch_size,
                 engines_text(pipe.loaded, costs),
                 args.http_port, args.grpc_port, args.metrics_port)
        while triton.is_alive() and not stop.wait(0.5):
            pass
        if not stop.is_set():
            raise BackendUnavailable("Triton Inference Server stopped on its own (-v shows its messages)")
        log.info("stopping: finishing the requests in flight")
    return 0


def serve_main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)   # every number checked here
    set_verbosity(args)
    sizes = batch_sizes(args.max_batch_size, args.batch_sizes)
    _pytriton()   # all three before the weights load
    check_stub_numpy(os.environ)
    check_ports(args)
    with Pipeline(_load_weights(args.weights), backend=args.backend, precision=args.precision,
                  sms=args.sms) as pipe:
        return serve(pipe, args, warm(pipe, sizes))


def main(argv: Optional[List[str]] = None) -> int:
    return _run(serve_main, PROG, argv)


if __name__ == "__main__":
    sys.exit(main())

"""`jetson-bench`: warm-up plus N measured sampling runs over a grid of configurations, with power.

    jetson-bench --batch 1 4 --precision fp16 fp32 --mode gpu cpu --runs 3 --out bench-out
    jetson-bench compare bench-out/bench.json other/bench.json     # side by side, B/A ratios
    python -m jetson_unet.bench.runner ...                                     # the same, no console script

For every configuration (precision x mode x sampler x steps x batch) the sampler is built once
(setup: kernel build and weight upload, timed), run --warmup times unmeasured and --runs times
measured. Per run: wall time, latency per image, images/s, the per-step breakdown from CUDA events
(GPU backends), power, energy, temperatures and clocks over the run's telemetry window. Then fresh
processes are timed phase by phase to their first step and image (`python -m jetson_unet.bench.coldstart`,
batch 1, --cold): on the GPU with empty kernel caches, with the caches that run filled, and with
fresh caches filled by `jetson-sample --prepare` (ahead-of-time cubins). Outputs in --out: bench.json
(everything), bench.csv (one row per configuration, medians over the runs), power.png and
latency.png when matplotlib is importable. Method and fields: docs/bench.md.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from jetson_unet import logs
from jetson_unet.bench import coldstart, report
from jetson_unet.cli import _Help, _Parser, _run, add_verbosity, number, seed_number, set_verbosity
from jetson_unet.errors import BackendUnavailable, RuntimeErrorBase, UsageError
from jetson_unet.files import check_writable
from jetson_unet.pipeline import BACKEND_CHOICES, NUMPY_PRECISIONS, PRECISIONS, default_weights_path
from jetson_unet.model.reference import Reference
from jetson_unet.model.schedule import SAMPLERS, make_steps, sample_loop, to_uint8
from jetson_unet.bench.telemetry import KINDS, open_telemetry
from jetson_unet.trace import Timeline

PROG = "jetson-bench"
GPU_MODES = ("gpu", "cpu")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchConfig:
    backend: str        # "cupy" | "numpy"
    precision: str
    mode: str           # "gpu" | "cpu" on the GPU; "-" on numpy
    sampler: str
    steps: int          # the number of steps actually run
    batch: int
    graphs: bool
    noise: str = "host"   # gpu mode: where the noise stream is drawn (jetson_unet.ops.noise)

    @property
    def label(self) -> str:
        mode = "" if self.mode == "-" else " " + self.mode
        if self.mode == "gpu" and not self.graphs:
            mode += "-nograph"
        if self.noise == "device":
            mode += "-devnoise"
        return f"{self.backend} {self.precision}{mode} {self.sampler}{self.steps} b{self.batch}"

    @property
    def steps_arg(self) -> Optional[int]:
        """What make_steps takes: DDPM always runs all T steps."""
        return None if self.sampler == "ddpm" else self.steps


# ---- arguments -------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, formatter_class=_Help,
                description="Benchmark sampling over a grid of configurations: latency, per-step GPU/CPU "
                            "breakdown, memory, power and energy per image, cold start. "
                            f"`{PROG} compare A.json B.json` prints two results side by side.")
    p.add_argument("--weights", default=str(default_weights_path()), help="weights file (the shipped model by default)")
    p.add_argument("--batch", type=number("--batch", 1), nargs="+", default=[1], help="batch sizes")
    p.add_argument("--steps", type=number("--steps", 1), nargs="+", default=None,
                   help="step counts of ddim and dpmpp-2m (default: theirs; DDPM always runs T)")
    p.add_argument("--sampler", nargs="+", choices=SAMPLERS, default=["ddpm"], help="samplers")
    p.add_argument("--eta", type=number("--eta", 0, float), default=0.0, help="DDIM eta")
    p.add_argument("--precision", nargs="+", choices=PRECISIONS, default=["auto"],
                   help="auto: fp16 on the GPU, fp32 on numpy")
    p.add_argument("--mode", nargs="+", choices=GPU_MODES, default=["gpu"], help="GPU sampling modes")
    p.add_argument("--no-graphs", action="store_true", help="gpu mode with plain launches instead of a CUDA graph")
    p.add_argument("--noise", choices=("auto", "host", "device"), default="auto",
                   help="gpu mode: draw the noise stream on the host or the GPU; auto = as jetson-sample "
                        "(device with CuPy, else host)")
    p.add_argument("--backend", choices=BACKEND_CHOICES, default="auto", help="auto: CuPy when usable, else numpy")
    p.add_argument("--sms", type=number("--sms", 1), default=None,
                   help="run every stream on a slice of N SMs (a CUDA green context, CuPy), with tiles for N SMs: "
                        "an Orin Nano's regime (8 SMs) on a large GPU")
    p.add_argument("--runs", type=number("--runs", 1), default=3, help="measured runs per configuration")
    p.add_argument("--warmup", type=number("--warmup", 0), default=1, help="unmeasured runs per configuration")
    p.add_argument("--seed", type=seed_number("--seed"), default=0, help="noise seed (the same for every run)")
    p.add_argument("--telemetry", choices=KINDS, default="auto", help="power/thermal source")
    p.add_argument("--interval", type=number("--interval", 0, float, strict=True), default=0.1,
                   help="telemetry sampling interval, s")
    p.add_argument("--min-run-s", type=number("--min-run-s", 0, float), default=None,
                   help="a measured run samples again, back to back, until it has lasted this long, so that its "
                        "power and energy rest on enough telemetry samples (default: 20 sampling intervals when "
                        "telemetry is on, else one pass)")
    p.add_argument("--no-timeline", action="store_true", help="no CUDA events per step (no GPU/CPU breakdown)")
    p.add_argument("--cold", choices=("first", "each", "none"), default="first",
                   help="fresh processes timed phase by phase to their first step and image (GPU: empty, "
                        "warm and --prepare'd kernel caches): for the first configuration, for each distinct "
                        "(precision, mode, sampler, steps), or not at all")
    p.add_argument("--cold-timeout", type=number("--cold-timeout", 0, float, strict=True), default=1800.0,
                   help="limit per cold-start process (and --prepare), s")
    p.add_argument("--out", default="bench-out",
                   help="output folder (created when the run is over; its parent must exist)")
    add_verbosity(p)
    return p


def check_args(args: argparse.Namespace) -> Path:
    """Every usage error before any long work (the numbers: as they are parsed); returns the output
    folder, proven writable but not created yet (report.write_outputs makes it)."""
    if not Path(args.weights).is_file():
        raise UsageError(f"no weights file at {args.weights} (pass --weights PATH)")
    out = Path(args.out)
    parent = out.parent if str(out.parent) else Path(".")
    if not out.exists() and not parent.is_dir():
        raise UsageError(f"--out {out}: folder {parent} does not exist")
    check_writable(out, "--out", folder=True, create=True)
    return out


def _unique(values: Sequence[Any]) -> List[Any]:
    return list(dict.fromkeys(values))


def resolve_backend(name: str, sms: Optional[int] = None) -> Tuple[str, Any]:
    """(GPU backend name, its backend) or ("numpy", None); auto tries CuPy, else numpy with a notice.
    sms: the backend runs on a slice of that many SMs (never numpy)."""
    if name == "numpy":
        if sms is not None:
            raise UsageError("--sms needs a GPU backend (cupy), not numpy")
        return "numpy", None
    gpu_name = "cupy" if name == "auto" else name
    try:
        from jetson_unet.backends import get_backend
        from jetson_unet.sampling import gpu  # noqa: F401  (imported now, not inside the timed setup)
        return gpu_name, get_backend(gpu_name, sms)
    except (BackendUnavailable, ImportError) as e:
        if name != "auto" or sms is not None:
            raise BackendUnavailable(str(e)) from None
        log.debug("GPU backend not usable: %s", e)
        log.warning("no usable GPU: using the NumPy reference backend (-v says why)")
        return "numpy", None


def check_slice(gpu: Any) -> Dict[str, Any]:
    """The slice's facts, after a probe kernel on one of its streams showed how many SMs run its work
    (a RuntimeErrorBase when more than the slice's)."""
    from jetson_unet.backends.greenctx import PROBE_BLOCKS, confinement
    used, s = confinement(gpu), gpu.slice
    if used > s.sm_count:
        raise RuntimeErrorBase(f"--sms {s.requested}: the probe kernel ran on {used} SMs, not within the "
                               f"slice's {s.sm_count}")
    log.info("SM slice: %s; a probe kernel of %d blocks ran on %d SMs", s.describe(), PROBE_BLOCKS, used)
    return {"sms_asked": s.requested, "sms": s.sm_count, "device_sms": s.device_sms, "probe_blocks": PROBE_BLOCKS,
            "probe_sms_used": used}


def resolve_precisions(wanted: Sequence[str], backend: str) -> List[str]:
    out = []
    for p in _unique(wanted):
        p = ("fp32" if backend == "numpy" else "fp16") if p == "auto" else p
        if backend == "numpy" and p not in NUMPY_PRECISIONS:
            raise UsageError(f"the numpy backend computes in fp32 or fp64, not {p}")
        if backend != "numpy" and p == "fp64":
            raise UsageError("the GPU backend computes in fp32, fp16 or bf16, not fp64")
        out.append(p)
    return _unique(out)


def sampler_eta(sampler: str, args: argparse.Namespace) -> float:
    """--eta is DDIM's: the other samplers of a grid run without it."""
    return args.eta if sampler == "ddim" else 0.0


def build_grid(args: argparse.Namespace, backend: str, schedule: Any) -> List[BenchConfig]:
    T = schedule.timesteps
    samplers = _unique(args.sampler)
    if args.steps and samplers == ["ddpm"] and any(n != T for n in args.steps):
        raise UsageError(f"DDPM runs all {T} steps (got --steps {' '.join(map(str, args.steps))}); "
                         "add --sampler ddim or dpmpp-2m for fewer steps")
    modes = ["-"] if backend == "numpy" else _unique(args.mode)
    grid = []
    for precision in resolve_precisions(args.precision, backend):
        for mode in modes:
            for sampler in samplers:
                counts = [T] if sampler == "ddpm" else _unique(args.steps or [len(make_steps(schedule, sampler))])
                for n in counts:
                    make_steps(schedule, sampler, None if sampler == "ddpm" else n, sampler_eta(sampler, args))   # validates
                    graphs = mode == "gpu" and not args.no_graphs and backend != "pycuda"   # gpu mode only; pycuda: none
                    noise = "host"
                    if mode == "gpu":
                        noise = ("device" if backend == "cupy" else "host") if args.noise == "auto" else args.noise
                    for b in _unique(args.batch):
                        grid.append(BenchConfig(backend, precision, mode, sampler, n, b, graphs, noise))
    return grid


# ---- engines: the two paths of jetson_unet.pipeline.Pipeline, with the sampler kept for reports ----------

class NumpyEngine:
    backend = None

    def __init__(self, weights: Any, cfg: BenchConfig) -> None:
        c = weights.config
        self.ref = Reference(weights, NUMPY_PRECISIONS[cfg.precision])
        self.shape = (cfg.batch, c.channels, c.image_size, c.image_size)

    def run(self, steps: list, seed: int, timeline: Any = None) -> Any:
        return to_uint8(sample_loop(self.ref.eps, self.shape, steps, seed))

    def wait_ready(self) -> None:
        pass

    def report(self) -> Dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


class GpuEngine:
    def __init__(self, weights: Any, cfg: BenchConfig, backend: Any, stream: Any = None) -> None:
        from jetson_unet.sampling.gpu import GpuSampler
        self.backend = backend
        self.sampler = GpuSampler(weights, cfg.precision, cfg.batch, cfg.mode, cfg.graphs, backend=backend,
                                  noise=cfg.noise, stream=stream)

    def run(self, steps: list, seed: int, timeline: Any = None) -> Any:
        return self.sampler.images(steps, seed, None, timeline)

    def wait_ready(self) -> None:
        """The executors return with the weight upload still in flight (early start): wait for it."""
        self.sampler.wait_weights()

    def report(self) -> Dict[str, Any]:
        exs = self.sampler.executors
        reps = [ex.arena_report() for ex in exs]
        out = {"executors": len(exs), "launches_per_unet": exs[0].launches_per_call}
        for k in ("arena_bytes", "weights_bytes", "sum_bytes", "peak_live_bytes"):
            out[k] = sum(int(r[k]) for r in reps)
        out["arena_text"] = [r["text"] for r in reps]
        return out

    def close(self) -> None:
        self.sampler.close()


def _free_bytes(gpu: Any) -> Optional[int]:
    return None if gpu is None else int(gpu.mem_info()[0])


# ---- one configuration ------------------------------------------------------------------------------

def min_run_s(args: argparse.Namespace, tel: Any) -> float:
    """How long a measured run lasts at least: --min-run-s, else 20 telemetry intervals when a power
    source is on (one-image runs of 40 ms read 130 W and 325 W on an H100 where 1 s runs read
    250-276 W), else 0."""
    if args.min_run_s is not None:
        return float(args.min_run_s)
    return 20.0 * args.interval if tel.source != "none" else 0.0


def measure_run(eng: Any, steps: list, cfg: BenchConfig, i: int, args: argparse.Namespace, tel: Any) -> dict:
    """One measured run: the sampling, repeated back to back (same seed) until it has lasted
    min_run_s; per image = over every image sampled."""
    tl = Timeline(eng.backend) if eng.backend is not None and not args.no_timeline else None
    least = min_run_s(args, tel)
    t0 = tel.mark(f"{cfg.label} | run {i}")
    passes = 0
    while True:
        eng.run(steps, args.seed, tl)
        passes += 1
        if time.perf_counter() - t0 >= least:
            break
    t1 = tel.mark(f"{cfg.label} | run {i} end")
    wall, images = t1 - t0, passes * cfg.batch
    rec = {"run": i, "t0": t0, "t1": t1, "wall_s": wall, "passes": passes, "images": images,
           "s_per_image": wall / images, "images_per_s": images / wall if wall > 0 else None}
    if tl is not None:
        rec.update(report.breakdown(tl.events(), passes * len(steps), wall))
    return rec


def bench_config(cfg: BenchConfig, weights: Any, gpu: Any, args: argparse.Namespace, tel: Any,
                 stream: Any = None) -> dict:
    steps = make_steps(weights.config.schedule, cfg.sampler, cfg.steps_arg, sampler_eta(cfg.sampler, args))
    rec: Dict[str, Any] = {"label": cfg.label, "config": asdict(cfg)}
    free0 = _free_bytes(gpu)
    t_setup = tel.mark(f"{cfg.label} | setup")
    eng = GpuEngine(weights, cfg, gpu, stream) if gpu is not None else NumpyEngine(weights, cfg)
    t_built = time.perf_counter()
    eng.wait_ready()
    t_warm = tel.mark(f"{cfg.label} | warmup")
    frees = [_free_bytes(gpu)]
    try:
        for _ in range(args.warmup):
            eng.run(steps, args.seed)
        frees.append(_free_bytes(gpu))
        rec["runs"] = [measure_run(eng, steps, cfg, i, args, tel) for i in range(args.runs)]
        frees.append(_free_bytes(gpu))
        rec["engine"] = eng.report()
    finally:
        eng.close()
    rec["setup_s"], rec["construct_s"] = t_warm - t_setup, t_built - t_setup
    rec["phases"] = {"setup": [t_setup, t_warm], "warmup": [t_warm, rec["runs"][0]["t0"]],
                     "runs": [rec["runs"][0]["t0"], rec["runs"][-1]["t1"]]}
    if free0 is not None:
        low = min(f for f in frees if f is not None)
        rec["memory"] = {"free_before_bytes": free0, "free_after_setup_bytes": frees[0],
                         "free_min_bytes": low, "device_mem_bytes": free0 - low,
                         "total_bytes": int(gpu.mem_info()[1])}
    return rec


# ---- cold start: fresh processes to their first step and image (jetson_unet.bench.coldstart) --------------------

NULL_FIGURES = dict.fromkeys(coldstart.PHASES + ("compiles",))   # a failed process's figures


def _child_env(cache_dir: Optional[str]) -> Dict[str, str]:
    env = dict(os.environ)
    if cache_dir is not None:   # CuPy's kernel cache, the cubin cache of both backends, and
        env["CUPY_CACHE_DIR"] = os.path.join(cache_dir, "cupy")
        env["JETSON_UNET_CACHE"] = os.path.join(cache_dir, "jetson-unet")
        env["CUDA_CACHE_PATH"] = os.path.join(cache_dir, "cuda")   # the driver's, where NVRTC 12.9+ keeps builds
    return env


def time_child(cmd: List[str], env: Dict[str, str], timeout: float) -> Dict[str, Any]:
    """`cmd` run to exit: `s` (spawn to exit), `rc`, `error` (one line; None when it exited 0) and
    `out` (its last non-empty stdout line)."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"s": None, "rc": None, "error": f"no exit within {timeout:g} s", "out": None}
    except OSError as e:
        return {"s": None, "rc": None, "error": f"cannot start {cmd[0]}: {e.strerror}", "out": None}
    dt = time.perf_counter() - t0
    errs = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    outs = [ln for ln in p.stdout.strip().splitlines() if ln.strip()]
    return {"s": dt, "rc": p.returncode, "out": outs[-1] if outs else None,
            "error": (errs[-1][:300] if errs else f"exit code {p.returncode}") if p.returncode else None}


def run_child(cmd: List[str], env: Dict[str, str], timeout: float) -> Dict[str, Any]:
    """One jetson_unet.bench.coldstart process: its wall time `s` and its phases (every one None when it
    failed: non-zero exit, timeout, or no valid JSON line)."""
    r = time_child(cmd, env, timeout)
    out = r.pop("out", None)
    rec = coldstart.parse_line(out) if r["error"] is None else None
    if r["error"] is None and rec is None:
        r["error"] = f"no phase times in its output ({(out or 'nothing')[:120]!r})"
    r.update(rec if rec is not None else NULL_FIGURES)
    return r


def aot_child(cmd: List[str], prepare: List[str], env: Dict[str, str], timeout: float) -> Dict[str, Any]:
    """`--prepare` into the fresh caches of `env` (timed: prepare_s), then the child on them."""
    p = time_child(prepare, env, timeout)
    if p["error"] is None:
        r = run_child(cmd, env, timeout)
    else:
        r = dict(NULL_FIGURES, s=None, rc=None, error=f"--prepare failed: {p['error']}")
    r.update(prepare_s=p["s"] if p["error"] is None else None, prepare_rc=p["rc"])
    return r


def cold_commands(cfg: BenchConfig, args: argparse.Namespace) -> Tuple[List[str], List[str]]:
    """The child (`python -m jetson_unet.bench.coldstart`, batch 1) and the --prepare of its kernels."""
    cmd = [sys.executable, "-m", "jetson_unet.bench.coldstart", "--weights", str(args.weights), "--batch", "1",
           "--backend", cfg.backend, "--precision", cfg.precision, "--sampler", cfg.sampler,
           "--eta", repr(sampler_eta(cfg.sampler, args)), "--seed", str(args.seed)]
    if cfg.sampler != "ddpm":
        cmd += ["--steps", str(cfg.steps)]
    if cfg.backend != "numpy":
        cmd += ["--mode", cfg.mode] + ([] if cfg.graphs else ["--no-graphs"])
    prepare = [sys.executable, "-m", "jetson_unet.cli", "--prepare", "--weights", str(args.weights),
               "--precision", cfg.precision, "--batch", "1", "--arch", "native"]
    if args.sms is not None:
        cmd += ["--sms", str(args.sms)]
        prepare += ["--sms", str(args.sms)]
    return cmd, prepare


def cold_start(cfg: BenchConfig, args: argparse.Namespace) -> Dict[str, Any]:
    """Fresh processes to their first step and image, each with caches of its own: on a GPU `cold`
    (empty kernel caches), `warm` (the caches cold filled) and, on CuPy, `aot` (fresh caches filled
    first by `jetson-sample --prepare`); on numpy `cold` only (there is no kernel cache). A failed
    process is a notice and None figures, never an error."""
    cmd, prepare = cold_commands(cfg, args)
    gpu = cfg.backend != "numpy"
    tmp = tempfile.mkdtemp(prefix="jetson-bench-")
    try:
        env = _child_env(os.path.join(tmp, "cache") if gpu else None)
        rec: Dict[str, Any] = {"cmd": cmd, "cold": run_child(cmd, env, args.cold_timeout)}
        if gpu:
            rec["warm"] = run_child(cmd, env, args.cold_timeout)
        if gpu:   # --prepare's cubins serve either backend
            rec["prepare_cmd"] = prepare
            rec["aot"] = aot_child(cmd, prepare, _child_env(os.path.join(tmp, "aot")), args.cold_timeout)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for k in report.COLD_RUNS:
        if k in rec and rec[k]["error"]:
            log.warning("cold start (%s) of %s failed: %s", k, cfg.label, rec[k]["error"])
    return rec


def cold_key(cfg: BenchConfig) -> Tuple[Any, ...]:
    return (cfg.backend, cfg.precision, cfg.mode, cfg.sampler, cfg.steps, cfg.graphs)


# ---- the run ------------------------------------------------------------------------------------------

def run_grid(grid: List[BenchConfig], weights: Any, gpu: Any, args: argparse.Namespace, tel: Any
             ) -> Tuple[List[dict], List[dict]]:
    """Every configuration, then the cold starts (--cold), each shared by the batch sizes."""
    configs, colds = [], {}   # type: List[dict], Dict[Tuple[Any, ...], dict]
    stream = gpu.stream() if gpu is not None else None   # one compute stream for all, as a Pipeline keeps
    for i, cfg in enumerate(grid):
        rec = bench_config(cfg, weights, gpu, args, tel, stream)
        configs.append(rec)
        med = report.median_of(rec["runs"], "s_per_image")
        print(f"[{i + 1}/{len(grid)}] {cfg.label}: {med:.4f} s/image, setup {rec['setup_s']:.2f} s",
              file=sys.stderr, flush=True)
    for cfg, rec in zip(grid, configs):
        if args.cold == "none" or (args.cold == "first" and colds and cold_key(cfg) not in colds):
            continue
        c = colds.get(cold_key(cfg))
        if c is None:
            a = tel.mark(f"{cfg.label} | cold start")
            c = colds[cold_key(cfg)] = dict(label=cfg.label, **cold_start(cfg, args))
            c["window"] = [a, tel.mark(f"{cfg.label} | cold start end")]
        rec.update(report.cold_fields(c))
    return configs, list(colds.values())


def bench_main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    set_verbosity(args)
    out = check_args(args)
    from jetson_unet.model.weights import load_weights
    weights = load_weights(args.weights)
    with logs.captured(level=logging.WARNING) as notices:
        backend, gpu = resolve_backend(args.backend, args.sms)
        grid = build_grid(args, backend, weights.config.schedule)
        sm_slice = check_slice(gpu) if args.sms is not None else None
        tel = open_telemetry(args.telemetry, args.interval)
        origin = time.perf_counter()
        tel.start()
        try:
            configs, colds = run_grid(grid, weights, gpu, args, tel)
        finally:
            tel.stop()
        doc = report.assemble(args, weights, gpu, tel, origin, configs, colds, notices)
        doc["slice"] = sm_slice
        paths = report.write_outputs(doc, out)
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
    report.print_table(doc)
    return 0


def compare_main(argv: Sequence[str]) -> int:
    p = _Parser(prog=f"{PROG} compare", description="Print two jetson-bench JSON results side by side (B/A).")
    p.add_argument("a", help="bench.json of run A")
    p.add_argument("b", help="bench.json of run B")
    args = p.parse_args(argv)
    print(report.compare_text(report.load_result(args.a), report.load_result(args.b), args.a, args.b))
    return 0


def _dispatch(argv: Optional[Sequence[str]]) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "compare":
        return compare_main(argv[1:])
    return bench_main(argv)


def main(argv: Optional[List[str]] = None) -> int:
    return _run(_dispatch, PROG, argv)


if __name__ == "__main__":
    sys.exit(main())

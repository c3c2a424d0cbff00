"""What `jetson-bench` writes and reads: the machine description, the JSON document, the CSV of
medians, the plots (optional matplotlib) and the side-by-side comparison of two results.

Times in the JSON are seconds since the benchmark started (perf_counter based), so telemetry
samples, phase marks and run windows share one axis. Field list: docs/bench.md.
"""
from __future__ import annotations

import csv
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from jetson_unet import __version__
from jetson_unet.bench import sysfs
from jetson_unet.bench.telemetry import interval_stats
from jetson_unet.errors import UsageError
from jetson_unet.files import output_set

log = logging.getLogger(__name__)

SCHEMA = "jetson-bench/1"
RUN_FIELDS = ("wall_s", "images", "s_per_image", "images_per_s", "gpu_ms_per_step", "gpu_kernel_ms_per_step",
              "cpu_ms_per_step", "gpu_busy_fraction", "mean_power_w", "peak_power_w", "energy_j",
              "energy_j_per_image", "max_temp_c", "max_gpu_mhz", "mean_gpu_util")
CSV_FIELDS = ("label", "backend", "precision", "mode", "sampler", "steps", "batch", "graphs", "runs",
              "images", "s_per_image", "images_per_s", "wall_s", "gpu_ms_per_step", "gpu_kernel_ms_per_step",
              "cpu_ms_per_step", "gpu_busy_fraction", "setup_s", "cold_start_s", "warm_start_s", "aot_start_s",
              "prepare_s", "cold_ready_s", "warm_ready_s", "aot_ready_s", "launches_per_unet", "arena_bytes",
              "weights_bytes", "device_mem_bytes", "mean_power_w", "peak_power_w", "energy_j_per_image",
              "max_temp_c", "max_gpu_mhz", "mean_gpu_util", "telemetry")
COLD_RUNS = ("cold", "warm", "aot")   # the cold-start processes (jetson_unet.bench.runner.cold_start)
COMPARE_KEY = ("precision", "mode", "sampler", "steps", "batch")
COMPARE_METRICS = (("s_per_image", "s/image", "{:.4f}"), ("images_per_s", "images/s", "{:.2f}"),
                   ("gpu_ms_per_step", "GPU ms/step", "{:.3f}"), ("cpu_ms_per_step", "CPU ms/step", "{:.3f}"),
                   ("gpu_busy_fraction", "GPU busy", "{:.2f}"), ("setup_s", "setup s", "{:.2f}"),
                   ("cold_start_s", "cold start s", "{:.2f}"), ("warm_start_s", "warm start s", "{:.2f}"),
                   ("aot_start_s", "aot start s", "{:.2f}"), ("cold_ready_s", "cold ready s", "{:.3f}"),
                   ("warm_ready_s", "warm ready s", "{:.3f}"), ("aot_ready_s", "aot ready s", "{:.3f}"),
                   ("mean_power_w", "power W", "{:.2f}"), ("energy_j_per_image", "J/image", "{:.3f}"),
                   ("device_mem_bytes", "device MB", "{:.1f}"))


def median_of(rows: List[Dict[str, Any]], key: str) -> Optional[float]:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return float(statistics.median(vals)) if vals else None


def union_us(spans: List[Tuple[float, float]]) -> float:
    """Length of the union of [a, b) intervals (two half-batch streams may overlap)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def breakdown(events: List[Dict[str, Any]], n_steps: int, wall_s: float) -> Dict[str, float]:
    """Per-step GPU time (union of the U-Net/step spans), CPU p_sample time, GPU busy fraction."""
    spans = [e for e in events if e.get("ph") == "X"]
    gpu = [(e["ts"], e["ts"] + e["dur"]) for e in spans if e["name"].startswith(("step", "unet"))]
    cpu = [e["dur"] for e in spans if e["name"].startswith("p_sample")]
    busy_us = union_us(gpu)
    return {"gpu_ms_per_step": busy_us / 1e3 / n_steps,
            "gpu_kernel_ms_per_step": sum(b - a for a, b in gpu) / 1e3 / n_steps,
            "cpu_ms_per_step": sum(cpu) / 1e3 / n_steps,
            "gpu_busy_fraction": min(1.0, busy_us / 1e6 / wall_s) if wall_s > 0 else None}


# ---- the machine and the model ---------------------------------------------------------------------

def _quiet(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:   # a fact this machine cannot give stays null in the report
        return None


def _read_text(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace").replace("\x00", "").strip() or None
    except OSError:
        return None


def _command(cmd: List[str]) -> Optional[str]:
    if shutil.which(cmd[0]) is None:
        return None
    p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, timeout=10)
    return p.stdout.strip() or None


def jetson_info() -> Dict[str, Any]:
    """Board facts where present; `nvpmodel -q` only queries the power mode, never sets it. Plus
    `power_mode`, `jetson_clocks` and `gpu_clock_mhz` (jetson_unet.bench.sysfs.board_state)."""
    release = _read_text("/etc/nv_tegra_release")
    query = _quiet(lambda: _command(["nvpmodel", "-q"]))
    return {"device_tree_model": _read_text("/proc/device-tree/model"),
            "nv_tegra_release": release.splitlines()[0] if release else None,
            "nvpmodel": query, **sysfs.board_state("/", query)}


def gpu_info(gpu: Any) -> Dict[str, Any]:
    props = _quiet(lambda: gpu.rt.getDeviceProperties(gpu.device.id)) or {}
    drv = _quiet(gpu.rt.driverGetVersion) if hasattr(gpu, "rt") else None
    rtv = _quiet(gpu.rt.runtimeGetVersion) if hasattr(gpu, "rt") else None
    return {"name": _quiet(gpu.device_name), "arch": _quiet(gpu.arch),
            "sm_count": props.get("multiProcessorCount"), "clock_khz": props.get("clockRate"),
            "memory_clock_khz": props.get("memoryClockRate"), "memory_bus_bits": props.get("memoryBusWidth"),
            "l2_bytes": props.get("l2CacheSize"), "integrated": props.get("integrated"),
            "total_mem_bytes": _quiet(lambda: gpu.mem_info()[1]),
            "driver_cuda_version": _cuda_version(drv), "cuda_runtime_version": _cuda_version(rtv),
            "nvrtc_version": _quiet(lambda: ".".join(map(str, gpu.cp.cuda.nvrtc.getVersion()))),
            "cupy": _quiet(lambda: gpu.cp.__version__), "cupy_cache_dir": os.environ.get("CUPY_CACHE_DIR"),
            "cupy_tf32": os.environ.get("CUPY_TF32")}


def _cuda_version(v: Optional[int]) -> Optional[str]:
    return None if not isinstance(v, int) else f"{v // 1000}.{v % 1000 // 10}"


def _git_commit() -> Optional[str]:
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    head = _quiet(lambda: _command(["git", "-C", str(root), "rev-parse", "HEAD"]))
    dirty = _quiet(lambda: _command(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"]))
    return None if head is None else head + ("-dirty" if dirty else "")


def system_info(gpu: Any) -> Dict[str, Any]:
    import numpy
    return {"python": platform.python_version(), "python_implementation": platform.python_implementation(),
            "platform": platform.platform(), "machine": platform.machine(), "cpu_count": os.cpu_count(),
            "numpy": numpy.__version__, "scipy": _quiet(lambda: __import__("scipy").__version__),
            "runtime": __version__, "git_commit": _git_commit(), "jetson": jetson_info(),
            "gpu": gpu_info(gpu) if gpu is not None else None}


def model_info(weights: Any) -> Dict[str, Any]:
    m = weights.manifest
    return {"path": str(weights.path), "content_hash": m.get("content_hash"), "param_dtype": m.get("param_dtype"),
            "n_params": m.get("n_params"), "config": weights.config.to_dict()}


# ---- the document -------------------------------------------------------------------------------------

def power_fields(s: Dict[str, Any], images: int) -> Dict[str, Any]:
    """One run's telemetry window (jetson_unet.bench.telemetry.summarize) and the images it sampled
    -> the run's power fields."""
    temps, e = s.get("max_temps_c") or {}, s.get("energy_j")
    return {"mean_power_w": s["mean_power_w"], "peak_power_w": s["peak_power_w"], "energy_j": e,
            "energy_j_per_image": e / images if e is not None else None, "energy_method": s["energy_method"],
            "power_rail": s["power_rail"], "temps_c": temps, "max_temp_c": max(temps.values()) if temps else None,
            "max_gpu_mhz": s["max_gpu_mhz"], "mean_gpu_util": s["mean_gpu_util"], "telemetry_samples": s["n"]}


def summarize_config(rec: Dict[str, Any], telemetry: str) -> Dict[str, Any]:
    """The CSV row: the configuration, medians over its runs, one-off figures."""
    c, eng, mem = rec["config"], rec.get("engine") or {}, rec.get("memory") or {}
    row: Dict[str, Any] = {"label": rec["label"], "runs": len(rec["runs"]), "telemetry": telemetry}
    row.update({k: c[k] for k in ("backend", "precision", "mode", "sampler", "steps", "batch", "graphs")})
    row.update({k: median_of(rec["runs"], k) for k in RUN_FIELDS})
    row.update({k: rec.get(k) for k in cold_fields({})})
    row.update(setup_s=rec["setup_s"], launches_per_unet=eng.get("launches_per_unet"),
               arena_bytes=eng.get("arena_bytes"), weights_bytes=eng.get("weights_bytes"),
               device_mem_bytes=mem.get("device_mem_bytes"))
    return row


def cold_fields(c: Dict[str, Any]) -> Dict[str, Any]:
    """A cold-start record -> its configurations' figures: per process (cold, warm, aot) the wall
    time from spawn to exit (`<run>_start_s`) and the time to the first step without the imports
    (`<run>_ready_s` = weights_s + load_s + first_step_s); `prepare_s`, the aot run's --prepare."""
    out: Dict[str, Any] = {}
    for k in COLD_RUNS:
        r = c.get(k) or {}
        out[f"{k}_start_s"], out[f"{k}_ready_s"] = r.get("s"), r.get("ready_s")
    out["prepare_s"] = (c.get("aot") or {}).get("prepare_s")
    return out


def _shift(x: Any, origin: float) -> Any:
    return None if x is None else round(x - origin, 6)


def rebase(configs: List[dict], colds: List[dict], origin: float) -> None:
    """perf_counter times -> seconds since the benchmark started."""
    for rec in configs:
        for r in rec["runs"]:
            r["t0"], r["t1"] = _shift(r["t0"], origin), _shift(r["t1"], origin)
        rec["phases"] = {k: [_shift(a, origin), _shift(b, origin)] for k, (a, b) in rec["phases"].items()}
    for c in colds:
        c["window"] = [_shift(t, origin) for t in c["window"]]


def telemetry_doc(tel: Any, origin: float) -> Dict[str, Any]:
    samples = []
    for s in tel.samples:
        d = asdict(s)
        d["t"] = _shift(s.t, origin)
        samples.append(d)
    return {"source": tel.source, "interval_s": tel.interval_s, "interval_achieved": interval_stats(tel.samples),
            "facts": tel.facts, "samples": samples, "marks": [[label, _shift(t, origin)] for label, t in tel.marks]}


def assemble(args: Any, weights: Any, gpu: Any, tel: Any, origin: float, configs: List[dict],
             colds: List[dict], notices: List[str]) -> Dict[str, Any]:
    for rec in configs:
        for r in rec["runs"]:
            r.update(power_fields(tel.summary(r["t0"], r["t1"]), r.get("images", rec["config"]["batch"])))
        rec["summary"] = summarize_config(rec, tel.source)
    rebase(configs, colds, origin)
    return {"schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv,
            "args": {k: v for k, v in vars(args).items()}, "system": system_info(gpu),
            "model": model_info(weights), "telemetry": telemetry_doc(tel, origin), "configs": configs,
            "cold_starts": colds, "notices": notices, "plots": []}


# ---- files --------------------------------------------------------------------------------------------

def write_csv(rows: List[Dict[str, Any]], f: Any) -> None:
    """One row per configuration (CSV_FIELDS) into the open text file `f`."""
    w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
    w.writeheader()
    for row in rows:
        w.writerow({k: "" if row.get(k) is None else row[k] for k in CSV_FIELDS})


def write_outputs(doc: Dict[str, Any], out: Path) -> List[Path]:
    """bench.json, bench.csv and the plots into `out` (made here, after the run: a failed run leaves
    no empty folder): they land together or not at all, and a folder made here that could not be
    filled is removed again."""
    made = not out.exists()
    out.mkdir(exist_ok=True)
    try:
        with output_set() as staged:
            plots = write_plots(doc, out, staged)
            doc["plots"] = [p.name for p in plots]
            js, cs = out / "bench.json", out / "bench.csv"
            with staged.open(js, "w") as f:
                json.dump(doc, f, indent=1, default=str)
            with staged.open(cs, "w", newline="") as f:
                write_csv([rec["summary"] for rec in doc["configs"]], f)
    except BaseException:
        if made:   # empty again: its temporaries are gone
            try:
                out.rmdir()
            except OSError:
                pass
        raise
    return [js, cs] + plots


def load_result(path: str) -> Dict[str, Any]:
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise UsageError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("jetson-bench/") \
            or not isinstance(doc.get("configs"), list):
        raise UsageError(f"{path} is not a jetson-bench result (no schema/configs)")
    return doc


# ---- plots (the `plot` extra) ------------------------------------------------------------------------

def write_plots(doc: Dict[str, Any], out: Path, staged: Any = None) -> List[Path]:
    """power.png (power over time, phases shaded) and latency.png (GPU / CPU / other per image);
    with `staged` (jetson_unet.files.Staged) into its temporaries, renamed when it commits."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("plots skipped: matplotlib is not installed (pip install '.[plot]')")
        return []
    where = staged.path if staged is not None else (lambda p: p)
    files = []
    samples = [s for s in doc["telemetry"]["samples"] if s.get("power_w") is not None]
    if samples:
        _plot_power(plt, doc, samples, where(out / "power.png"))
        files.append(out / "power.png")
    else:
        log.warning("power plot skipped: telemetry (%s) recorded no power", doc["telemetry"]["source"])
    _plot_latency(plt, doc, where(out / "latency.png"))
    return files + [out / "latency.png"]


def _plot_power(plt: Any, doc: Dict[str, Any], samples: List[dict], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(11, 4.5))
    ax.plot([s["t"] for s in samples], [s["power_w"] for s in samples], lw=1, color="k", label="power")
    colors = [c for i, c in enumerate(plt.get_cmap("tab10").colors) if i != 7]   # no grey: grey is setup
    for i, rec in enumerate(doc["configs"]):
        ph = rec["phases"]
        ax.axvspan(*ph["setup"], color="0.88", lw=0, label="setup" if i == 0 else None)
        ax.axvspan(*ph["warmup"], color="0.95", lw=0, label="warm-up" if i == 0 else None)
        for j, r in enumerate(rec["runs"]):
            ax.axvspan(r["t0"], r["t1"], color=colors[i % len(colors)], alpha=0.3, lw=0,
                       label=rec["label"] if j == 0 else None)
    for i, c in enumerate(doc["cold_starts"]):
        ax.axvspan(*c["window"], color="tab:purple", alpha=0.12, lw=0, label="cold start" if i == 0 else None)
    rail = samples[-1].get("power_rail") or ""
    ax.set(xlabel="time since start (s)", ylabel=f"power (W) {rail}",
           title=f"Power during the benchmark: {describe(doc)}")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")   # path: a .tmp name when staged
    plt.close(fig)
    return path


def latency_parts(row: Dict[str, Any]) -> Tuple[float, float, float]:
    """(GPU, CPU, other) ms per image; other = wall - GPU busy - CPU p_sample, clipped at 0 (in the
    cpu mode's ping-pong the CPU overlaps the GPU, so the parts may exceed the wall)."""
    total = 1e3 * (row.get("s_per_image") or 0.0)
    per = row["steps"] / row["batch"]
    gpu = (row.get("gpu_ms_per_step") or 0.0) * per
    cpu = (row.get("cpu_ms_per_step") or 0.0) * per
    return gpu, cpu, max(0.0, total - gpu - cpu)


def _plot_latency(plt: Any, doc: Dict[str, Any], path: Path) -> Path:
    rows = sorted((rec["summary"] for rec in doc["configs"]), key=lambda r: (r["batch"], r["label"]))
    parts = [latency_parts(r) for r in rows]
    xs = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows) + 2), 4.5))
    bottom = [0.0] * len(rows)
    for k, name in enumerate(("GPU (events)", "CPU p_sample", "other")):
        vals = [p[k] for p in parts]
        ax.bar(xs, vals, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(xs)
    ax.set_xticklabels([r["label"].replace(f" b{r['batch']}", f"\nbatch {r['batch']}") for r in rows],
                       fontsize=7, rotation=30, ha="right")
    ax.set(ylabel="ms per image (median)", title=f"Latency per image by batch size: {describe(doc)}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")   # path: a .tmp name when staged
    plt.close(fig)
    return path


# ---- text ---------------------------------------------------------------------------------------------

def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else spec.format(v)


def describe(doc: Dict[str, Any]) -> str:
    s = doc.get("system") or {}
    gpu, jet = s.get("gpu") or {}, s.get("jetson") or {}
    where = gpu.get("name") or f"CPU ({s.get('machine')}, {s.get('cpu_count')} cores)"
    board = f", {jet['device_tree_model']}" if jet.get("device_tree_model") else ""
    return f"{where}{board}{_power_state(jet)}, telemetry {(doc.get('telemetry') or {}).get('source')}"


def _power_state(jet: Dict[str, Any]) -> str:
    """", nvpmodel 15W, jetson_clocks off" from the board facts; "" where there are none."""
    mode, jc = (jet.get("power_mode") or {}).get("name"), jet.get("jetson_clocks")
    parts = ([f"nvpmodel {mode}"] if mode else []) + ([] if jc is None else [f"jetson_clocks {'on' if jc else 'off'}"])
    return "".join(", " + p for p in parts)


def print_table(doc: Dict[str, Any]) -> None:
    print(f"{describe(doc)}; medians of {doc['args'].get('runs')} runs")
    print(f"{'configuration':<32} {'s/image':>9} {'img/s':>8} {'GPU ms/st':>9} {'CPU ms/st':>9} {'busy':>5} "
          f"{'setup s':>7} {'cold s':>7} {'warm s':>7} {'ready c/w/aot s':>17} {'W':>6} {'J/img':>7}")
    for rec in doc["configs"]:
        r = rec["summary"]
        print(f"{r['label']:<32} {_fmt(r['s_per_image'], '{:.4f}'):>9} {_fmt(r['images_per_s'], '{:.2f}'):>8} "
              f"{_fmt(r['gpu_ms_per_step'], '{:.3f}'):>9} {_fmt(r['cpu_ms_per_step'], '{:.3f}'):>9} "
              f"{_fmt(r['gpu_busy_fraction'], '{:.2f}'):>5} {_fmt(r['setup_s'], '{:.2f}'):>7} "
              f"{_fmt(r['cold_start_s'], '{:.2f}'):>7} {_fmt(r['warm_start_s'], '{:.2f}'):>7} "
              f"{'/'.join(_fmt(r[k + '_ready_s'], '{:.3f}') for k in COLD_RUNS):>17} "
              f"{_fmt(r['mean_power_w'], '{:.2f}'):>6} {_fmt(r['energy_j_per_image'], '{:.3f}'):>7}")


def _key(row: Dict[str, Any]) -> Tuple[Any, ...]:
    return tuple(row.get(k) for k in COMPARE_KEY)


def compare_text(a: Dict[str, Any], b: Dict[str, Any], name_a: str, name_b: str) -> str:
    """Configurations matched on precision, mode, sampler, steps, batch; a B/A column per metric."""
    rows_a = {_key(r["summary"]): r["summary"] for r in a["configs"]}
    rows_b = {_key(r["summary"]): r["summary"] for r in b["configs"]}
    out = [f"A: {name_a}: {describe(a)}", f"B: {name_b}: {describe(b)}",
           f"{'configuration':<28} {'metric':<13} {'A':>12} {'B':>12} {'B/A':>7}"]
    for k, ra in rows_a.items():
        rb = rows_b.get(k)
        if rb is None:
            continue
        label = " ".join(str(v) for v in k[:2]) + f" {k[2]}{k[3]} b{k[4]}"
        for field, name, spec in COMPARE_METRICS:
            va, vb = ra.get(field), rb.get(field)
            if va is None and vb is None:
                continue
            if field == "device_mem_bytes":
                va, vb = (None if v is None else v / 2 ** 20 for v in (va, vb))
            ratio = f"{vb / va:.2f}" if va and vb is not None else "-"
            out.append(f"{label:<28} {name:<13} {_fmt(va, spec):>12} {_fmt(vb, spec):>12} {ratio:>7}")
            label = ""
    only_a = [rows_a[k]["label"] for k in rows_a if k not in rows_b]
    only_b = [rows_b[k]["label"] for k in rows_b if k not in rows_a]
    if only_a:
        out.append("only in A: " + ", ".join(only_a))
    if only_b:
        out.append("only in B: " + ", ".join(only_b))
    if len(out) == 3:
        out.append("no configuration in common")
    return "\n".join(out)

#!/usr/bin/env python3
"""Roofline floor of seed-unet: FLOPs and minimum bytes of every op of the plan (jetson_unet.model.cost)
against a machine's memory bandwidth and arithmetic rates, summed op by op (each op is bound by
the slower of its two terms), for one U-Net call and for one sampled image (100 steps by default).

    python -m tools.lab.roofline                         # Orin Nano floors; + this GPU when CuPy works
    python -m tools.lab.roofline --batch 4 --json $OUT/roofline.json
    python -m tools.lab.roofline --no-gpu                # floors only, no measurement

Machines: (a) this GPU, its rates measured on the spot with CUDA events: a device-to-device copy
of a large buffer (bytes read + written per second), a large fp16 `cupy.matmul` (cuBLAS, tensor
cores, fp32 accumulation) and an fp32 one (FFMA; CUPY_TF32 must be unset); (b) the Orin Nano 8GB
(8 SMs, 1024 CUDA cores; 68 GB/s at 625 MHz, 102 GB/s in the 1020 MHz "Super" mode) and 4GB (4 SMs,
512 CUDA cores, 34 GB/s at both clocks), from datasheet figures: fp32 FFMA = 2 x cores x clock, fp16
tensor cores assumed at 1024 to 2048 dense FLOP/clock/SM (8GB: 5.1-10.2 TFLOP/s at 625 MHz; the top
matches 40 sparse INT8 TOPS / 4), both scaled with the GPU clock. GEMM convs and gates use the
tensor rate at fp16/bf16; depthwise, the image convs and everything at fp32 use the FFMA rate. On a
GPU it then times every op alone (`GpuExecutor.launch_op` between events, L2 flushed before each
launch, and hot back to back) and the whole call (graph replay, tools.bench_unet), prints the
per-op roofline (FLOPs, minimum bytes, achieved TFLOP/s and GB/s, share of the call) per op class,
per level and for the `--top` slowest ops, and predicts each Orin Nano's time per image as its
floor times this GPU's measured/floor efficiency, as a range over the assumptions. Method:
docs/bench.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from jetson_unet.bench.timing import RandomWeights, per_op_times, timed
from jetson_unet.model.config import UNetConfig
from jetson_unet.model.cost import plan_costs
from jetson_unet.model.plan import Plan, build_plan
from jetson_unet.ops.specs import kernel_kind
from jetson_unet.paths import models_dir
from tools.bench_unet import bench_ours


@dataclass(frozen=True)
class Board:
    """A Jetson board's GPU from its datasheet: SMs, CUDA cores, and memory bandwidth (B/s) at each
    GPU clock (MHz) it runs."""
    name: str
    sms: int
    cores: int
    bw: Dict[int, float]


NANO_8GB = Board("Orin Nano 8GB", 8, 1024, {625: 68e9, 1020: 102e9})   # 1020: the "Super" mode (JetPack 6.1+)
NANO_4GB = Board("Orin Nano 4GB", 4, 512, {625: 34e9, 1020: 34e9})     # 64-bit LPDDR5 at both clocks
BOARDS = (NANO_8GB, NANO_4GB)
ORIN_TC_PER_SM_CLK = (1024, 2048)             # fp16 dense FLOP/clock/SM, fp32 accumulate: assumed range
SEED_REPORT_S = 2.5                           # the seed report: Orin Nano, 64x64, 100 steps
TC_KINDS = ("gemm", "gate")                   # kernels with mma.sync at fp16/bf16
ELEM_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class Machine:
    name: str
    bw: float       # B/s, device memory (read + write)
    tc: float       # FLOP/s, fp16/bf16 tensor-core matmul, fp32 accumulate
    ffma: float     # FLOP/s, fp32 on the CUDA cores


@dataclass(frozen=True)
class OpFloor:
    name: str
    op_class: str   # jetson_unet.model.cost: conv3x3, conv1x1, conv7x7, dwconv7x7, gate
    kind: str       # the kernel family (jetson_unet.ops.specs.kernel_kind)
    flops: float
    bytes: float
    compute_s: float
    memory_s: float

    @property
    def floor_s(self) -> float:
        return max(self.compute_s, self.memory_s)


def orin(mhz: float, tc_per_sm_clk: float, bw: Optional[float] = None, board: Board = NANO_8GB) -> Machine:
    """A board (the Orin Nano 8GB by default) at a GPU clock; bandwidth from the datasheet pairing
    unless given."""
    if bw is None:
        if mhz not in board.bw:
            raise ValueError(f"no datasheet bandwidth for {mhz} MHz (known: {sorted(board.bw)}); pass bw")
        bw = board.bw[mhz]
    hz = mhz * 1e6
    return Machine(f"{board.name} @{mhz:g} MHz, TC {tc_per_sm_clk:g} FLOP/clk/SM", bw,
                   board.sms * tc_per_sm_clk * hz, 2.0 * board.cores * hz)


def op_floors(plan: Plan, m: Machine, precision: str = "fp16", batch: int = 1) -> List[OpFloor]:
    """Every non-cat op: FLOPs at the rate of its kernel family, minimum bytes at the bandwidth."""
    eb = ELEM_BYTES[precision]
    ops = {op.out: op for op in plan.ops}
    out = []
    for c in plan_costs(plan):
        kind = kernel_kind(ops[c.name], plan)
        rate = m.tc if precision != "fp32" and kind in TC_KINDS else m.ffma
        flops, nbytes = batch * c.flops, (batch * c.act_elems + c.weight_elems) * eb
        out.append(OpFloor(c.name, c.op_class, kind, flops, nbytes, flops / rate, nbytes / m.bw))
    return out


def psample_floor_s(plan: Plan, m: Machine, batch: int = 1) -> float:
    """One p_sample step: x, eps and z read, x written, fp32."""
    c = plan.config
    return 16.0 * batch * c.channels * c.image_size ** 2 / m.bw


def call_floor_s(plan: Plan, m: Machine, precision: str = "fp16", batch: int = 1) -> float:
    return sum(o.floor_s for o in op_floors(plan, m, precision, batch))


def image_floor_s(plan: Plan, m: Machine, precision: str = "fp16", batch: int = 1, steps: int = 100) -> float:
    """Seconds per image of a `steps`-step sampling at this batch."""
    return steps * (call_floor_s(plan, m, precision, batch) + psample_floor_s(plan, m, batch)) / batch


# ---- measurement on this GPU ------------------------------------------------------------------------

def memset(backend: Any, ptr: int, byte: int, nbytes: int, stream: Any) -> None:
    """cudaMemsetAsync through CuPy's runtime binding (the backend offers no memset)."""
    backend.rt.memsetAsync(int(ptr), int(byte), int(nbytes), stream.ptr)


def d2d(backend: Any, dst: int, src: int, nbytes: int, stream: Any) -> None:
    """A device-to-device cudaMemcpyAsync through CuPy's runtime binding."""
    backend.rt.memcpyAsync(int(dst), int(src), int(nbytes), backend.rt.memcpyDeviceToDevice, stream.ptr)


def matmul_rate(backend: Any, stream: Any, n: int, dtype: Any) -> float:
    """FLOP/s of an n x n x n cuBLAS matmul (fp16: tensor cores, fp32 accumulate; fp32: SGEMM)."""
    ms = _matmul_ms(backend, stream, n, dtype)
    backend.cp.get_default_memory_pool().free_all_blocks()     # the operands are gone: give them back
    return 2.0 * n ** 3 / (ms * 1e-3)


def _matmul_ms(backend: Any, stream: Any, n: int, dtype: Any) -> float:
    cp = backend.cp
    rng = np.random.default_rng(0)
    with stream:   # host-side casts and plain copies: no CuPy elementwise kernel to compile
        a = cp.asarray(rng.standard_normal((n, n), dtype=np.float32).astype(dtype))
        b = cp.asarray(rng.standard_normal((n, n), dtype=np.float32).astype(dtype))
        return timed(backend, stream, lambda: cp.matmul(a, b), 2, 5, 3)   # the pool reuses the output block


def measure_machine(backend: Any) -> Machine:
    """Copy bandwidth (D2D memcpy) and matmul rates of this GPU, timed with events."""
    if os.environ.get("CUPY_TF32", "0") != "0":
        print("note: CUPY_TF32 is set: the fp32 matmul rate is a TF32 rate, not FFMA", file=sys.stderr)
    s = backend.stream()
    free = backend.mem_info()[0]
    nbytes = int(min(1 << 30, free // 8)) // 256 * 256
    src, dst = backend.alloc(nbytes), backend.alloc(nbytes)
    memset(backend, src.ptr, 1, nbytes, s)
    ms = timed(backend, s, lambda: d2d(backend, dst.ptr, src.ptr, nbytes, s), 2, 10, 3)
    src.free()
    dst.free()
    n = 8192 if free > 16 * 8192 ** 2 * 4 else 4096
    return Machine(f"{backend.device_name()} (measured)", 2.0 * nbytes / (ms * 1e-3),
                   matmul_rate(backend, s, n, np.float16), matmul_rate(backend, s, n, np.float32))


def l2_bytes(backend: Any) -> int:
    try:
        return int(backend.rt.getDeviceProperties(backend.device.id)["l2CacheSize"])
    except Exception:   # unknown: assume a large L2 (H100/H200 have 50-60 MB)
        return 64 << 20


def measure_ops(weights: Any, backend: Any, precision: str, batch: int, repeats: int) -> Dict[str, Dict[str, float]]:
    """Per op: `cold_ms`, the median of single launches with L2 flushed by a memset before each (the
    memset also gives the host a head start, so the events time the kernel, not CuPy's launch), and
    `hot_ms`, from replays of a CUDA graph of `repeats` back-to-back launches (per_op_times:
    the op's data stays in L2 where it fits)."""
    from jetson_unet.executor.executor import GpuExecutor
    c = weights.config
    x = np.random.default_rng(0).standard_normal((batch, c.channels, c.image_size, c.image_size))
    flush_bytes = max(4 * l2_bytes(backend), 64 << 20)
    flush = backend.alloc(flush_bytes)
    out = {}
    with GpuExecutor(weights, precision, batch=batch, backend=backend) as ex:
        ex.eps(x.astype(np.float32), 50)    # weights landed, every tensor holds real values; t = 50
        s, e0, e1 = ex.stream, backend.event(), backend.event()
        for L in ex.launches:
            cold = []
            for _ in range(repeats):
                memset(backend, flush.ptr, 0, flush_bytes, s)
                e0.record(s)
                ex.launch_op(L.name, s)
                e1.record(s)
                e1.synchronize()
                cold.append(e0.elapsed_ms(e1))
            out[L.name] = {"cold_ms": statistics.median(cold)}
        for name, _symbol, _grid, us in per_op_times(ex, backend, reps=repeats):
            out[name]["hot_ms"] = us * 1e-3
    flush.free()
    return out


# ---- efficiency and prediction ----------------------------------------------------------------------

def class_efficiency(plan: Plan, this: Machine, precision: str, batch: int,
                     ops_ms: Dict[str, Dict[str, float]]) -> Dict[str, Dict[str, float]]:
    """measured / floor on this GPU per op class, for the cold and the hot per-op times."""
    floors = op_floors(plan, this, precision, batch)
    return {k: {r.op_class: r.time_s / r.floor_s
                for r in class_rows(roofline_rows(floors, {n: v[f"{k}_ms"] * 1e-3 for n, v in ops_ms.items()}))}
            for k in ("cold", "hot")}


@dataclass(frozen=True)
class CallModel:
    """t(call) = k x floor(call) + n_ops x fixed_s, fitted on this GPU from CUDA-graph replays of the
    whole call at two batch sizes: k is how far the kernels stay from the roofline once they have
    work (clipped at 1), fixed_s the per-launch cost that does not shrink with the work (latency,
    ramp-up and tail, the gap between graph nodes)."""
    k: float
    fixed_s: float
    n_ops: int
    e_call: float       # measured / floor of the whole call at the smaller batch


def fit_call_model(plan: Plan, this: Machine, precision: str, small: Tuple[int, float],
                   big: Tuple[int, float]) -> CallModel:
    """`small` and `big`: (batch, measured seconds per call)."""
    f1, fb = (call_floor_s(plan, this, precision, b) for b, _ in (small, big))
    t1, tb = small[1], big[1]
    k = max(1.0, (tb - t1) / (fb - f1)) if fb > f1 else 1.0
    n = len(plan_costs(plan))
    return CallModel(k, max(0.0, (t1 - k * f1) / n), n, t1 / f1)


def predict_orin(plan: Plan, precision: str = "fp16", batch: int = 1, steps: int = 100, k: float = 1.0,
                 fixed_s: float = 0.0, this_mhz: Optional[float] = None,
                 board: Board = NANO_8GB) -> Dict[str, Tuple[float, float]]:
    """Seconds per image on a board (the Orin Nano 8GB by default) per clock: min..max over the
    tensor-rate assumptions and, when `this_mhz` is known, over the fixed cost kept in seconds or
    scaled by this_mhz / Orin MHz (the same cycles). Defaults: the floor itself."""
    n, out = len(plan_costs(plan)), {}
    for mhz in board.bw:
        fixed = [fixed_s] + ([fixed_s * this_mhz / mhz] if this_mhz else [])
        vals = []
        for tc in ORIN_TC_PER_SM_CLK:
            m = orin(mhz, tc, board=board)
            call, ps = call_floor_s(plan, m, precision, batch), psample_floor_s(plan, m, batch)
            vals += [steps * (k * call + n * f + ps) / batch for f in fixed]
        out[f"{mhz} MHz"] = (min(vals), max(vals))
    return out


def gpu_mhz(backend: Any) -> Optional[float]:
    try:
        return float(backend.rt.getDeviceProperties(backend.device.id)["clockRate"]) / 1e3
    except Exception:   # CUDA 13 dropped clockRate from the device properties
        return None


# ---- report ---------------------------------------------------------------------------------------------

def print_floors(plan: Plan, machines: List[Machine], precision: str, batch: int, steps: int) -> None:
    costs = plan_costs(plan)
    print(f"plan: {len(costs)} ops, {batch * sum(c.flops for c in costs) / 1e9:.2f} GFLOP and "
          f"{op_floor_bytes(plan, precision, batch) / 1e6:.1f} MB minimum traffic per call "
          f"(batch {batch}, {precision})")
    print(f"{'machine':<52} {'GB/s':>6} {'TC TF/s':>8} {'FFMA TF/s':>9} {'call us':>8} {'mem-bound':>9} "
          f"{f'{steps}-step ms/img':>15}")
    for m in machines:
        floors = op_floors(plan, m, precision, batch)
        mem = sum(o.memory_s >= o.compute_s for o in floors)
        print(f"{m.name:<52} {m.bw / 1e9:>6.0f} {m.tc / 1e12:>8.1f} {m.ffma / 1e12:>9.2f} "
              f"{1e6 * sum(o.floor_s for o in floors):>8.1f} {f'{mem}/{len(floors)}':>9} "
              f"{1e3 * image_floor_s(plan, m, precision, batch, steps):>15.1f}")


def op_floor_bytes(plan: Plan, precision: str, batch: int) -> float:
    return sum((batch * c.act_elems + c.weight_elems) * ELEM_BYTES[precision] for c in plan_costs(plan))


@dataclass(frozen=True)
class RooflineRow:
    """An op, or an op class (its ops summed), against its floor on this GPU at a measured time."""
    name: str
    op_class: str
    ops: int
    flops: float
    bytes: float      # minimum bytes (jetson_unet.model.cost): achieved GB/s is an effective rate
    floor_s: float
    time_s: float

    @property
    def tflops(self) -> float:
        return self.flops / self.time_s / 1e12

    @property
    def gbs(self) -> float:
        return self.bytes / self.time_s / 1e9


def roofline_rows(floors: List[OpFloor], times: Dict[str, float]) -> List[RooflineRow]:
    """One row per op: its FLOPs, minimum bytes and floor on this GPU, and `times[name]` seconds."""
    return [RooflineRow(o.name, o.op_class, 1, o.flops, o.bytes, o.floor_s, times[o.name]) for o in floors]


def grouped_rows(rows: List[RooflineRow], group: Callable[[RooflineRow], str]) -> List[RooflineRow]:
    """The rows summed per group(row), in the order the groups first appear; a group's op class is
    its rows' where they share one, else empty."""
    out: Dict[str, RooflineRow] = {}
    for r in rows:
        g = group(r)
        c = out.get(g)
        out[g] = (RooflineRow(g, r.op_class, 1, r.flops, r.bytes, r.floor_s, r.time_s) if c is None
                  else RooflineRow(g, c.op_class if c.op_class == r.op_class else "", c.ops + 1, c.flops + r.flops,
                                   c.bytes + r.bytes, c.floor_s + r.floor_s, c.time_s + r.time_s))
    return list(out.values())


def class_rows(rows: List[RooflineRow]) -> List[RooflineRow]:
    """The rows summed per op class, the slowest class first."""
    return sorted(grouped_rows(rows, lambda r: r.op_class), key=lambda r: -r.time_s)


def level_rows(plan: Plan, rows: List[RooflineRow]) -> List[RooflineRow]:
    """The rows summed per level, the size of the op's output map (a down or up conv counts with the
    level it writes), the largest first."""
    size = {r.name: plan.tensors[r.name].size for r in rows}
    return sorted(grouped_rows(rows, lambda r: f"{size[r.name]}x{size[r.name]}"),
                  key=lambda r: -int(r.name.split("x")[0]))


def row_json(r: RooflineRow, total_s: float) -> Dict[str, Any]:
    return dict(asdict(r), tflops=r.tflops, gbs=r.gbs, share=r.time_s / total_s)


def print_rows(title: str, rows: List[RooflineRow], total_s: float) -> None:
    print(title)
    print(f"{'':<26} {'ops':>4} {'GFLOP':>7} {'MB':>7} {'floor us':>9} {'us':>8} {'/floor':>7} "
          f"{'TFLOP/s':>8} {'GB/s':>7} {'share':>6}")
    for r in rows:
        print(f"{r.name:<26} {r.ops:>4} {r.flops / 1e9:>7.3f} {r.bytes / 1e6:>7.2f} {1e6 * r.floor_s:>9.1f} "
              f"{1e6 * r.time_s:>8.1f} {r.time_s / r.floor_s:>7.2f} {r.tflops:>8.2f} {r.gbs:>7.0f} "
              f"{100 * r.time_s / total_s:>5.1f}%")


def print_measured(plan: Plan, this: Machine, precision: str, batch: int, ops_ms: Dict[str, Dict[str, float]],
                   model: CallModel, calls: Dict[int, float], top: int) -> None:
    floors = op_floors(plan, this, precision, batch)
    hot = roofline_rows(floors, {n: v["hot_ms"] * 1e-3 for n, v in ops_ms.items()})
    cold = roofline_rows(floors, {n: v["cold_ms"] * 1e-3 for n, v in ops_ms.items()})
    total = sum(r.time_s for r in hot)
    everything = grouped_rows(hot, lambda r: "sum")
    print_rows(f"\nthis GPU, each op alone, hot ({precision}, batch {batch}): per op class; share = of the ops' sum",
               class_rows(hot) + everything, total)
    print_rows("per level (the size of the op's output map)", level_rows(plan, hot), total)
    cold_s = sum(r.time_s for r in cold)
    print("cold (L2 flushed before each launch), per class: " + ", ".join(
        f"{r.name} {1e6 * r.time_s:.1f} us ({r.time_s / r.floor_s:.2f} x floor)" for r in class_rows(cold))
        + f"; sum {1e6 * cold_s:.1f} us")
    if top:
        print_rows(f"the {top} slowest ops, hot", sorted(hot, key=lambda r: -r.time_s)[:top], total)
    for b, t in calls.items():
        f = call_floor_s(plan, this, precision, b)
        print(f"whole call, batch {b} (CUDA-graph replay): {1e6 * t:.1f} us = {t / f:.2f} x its floor {1e6 * f:.1f} us")
    print(f"fit: call = {model.k:.2f} x floor + {model.n_ops} x {1e6 * model.fixed_s:.2f} us")


Predictions = Dict[str, List[Tuple[str, Dict[str, Tuple[float, float]]]]]   # board -> (what, clock -> range)


def predictions(plan: Plan, precision: str, batch: int, steps: int, meas: Optional[Dict[str, Any]]) -> Predictions:
    """Per board: the floor and, with a measurement, the fit's prediction and the pessimistic bound."""
    out: Predictions = {}
    for bd in BOARDS:
        lines = [("floor", predict_orin(plan, precision, batch, steps, board=bd))]
        if meas is not None:
            m = meas["model"]
            lines.append(("predicted: k x floor + fixed cost per launch",
                          predict_orin(plan, precision, batch, steps, m.k, m.fixed_s, meas["mhz"], board=bd)))
            lines.append(("pessimistic: floor x this GPU's call/floor",
                          predict_orin(plan, precision, batch, steps, m.e_call, board=bd)))
        out[bd.name] = lines
    return out


def print_prediction(steps: int, batch: int, preds: Predictions) -> None:
    for board, lines in preds.items():
        print(f"\n{board}, s per image ({steps} steps, batch {batch}); seed report (8GB): {SEED_REPORT_S} s")
        for what, pred in lines:
            ranges = "   ".join(f"@{clock}: {lo:.3f}-{hi:.3f}" for clock, (lo, hi) in pred.items())
            print(f"  {what:<44} {ranges}")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", default=None, help="weights file (default: the shipped model, else random)")
    ap.add_argument("--precision", choices=tuple(ELEM_BYTES), default="fp16", help="(default: fp16)")
    ap.add_argument("--batch", type=int, default=1, help="batch size (default: 1)")
    ap.add_argument("--steps", type=int, default=None, help="steps per image (default: the model's T)")
    ap.add_argument("--repeats", type=int, default=50, help="launches per op and timing (default: 50)")
    ap.add_argument("--fit-batch", type=int, default=32,
                    help="second batch of the whole-call fit, where the kernels have work (default: 32)")
    ap.add_argument("--no-gpu", action="store_true", help="floors only: measure nothing")
    ap.add_argument("--sms", type=int, default=None, help="measure on a slice of N SMs (a CUDA green context)")
    ap.add_argument("--top", type=int, default=10, help="also list the N slowest ops (default: 10; 0: none)")
    ap.add_argument("--json", default="", help="also write every figure to this JSON file")
    return ap


def load_model(path: Optional[str]) -> Any:
    from jetson_unet.model.weights import load_weights
    path = path or str(models_dir() / "seed-unet-emoji64.safetensors")
    return load_weights(path) if os.path.isfile(path) else RandomWeights(UNetConfig())


def measure(weights: Any, plan: Plan, backend: Any, args: argparse.Namespace) -> Dict[str, Any]:
    """This GPU: rates, per-op times, whole-call replays at --batch and --fit-batch, the call model."""
    this = measure_machine(backend)
    ops_ms = measure_ops(weights, backend, args.precision, args.batch, args.repeats)
    timing = SimpleNamespace(warmup=20, iters=200, repeats=5, per_op=0)
    calls = {b: 1e-3 * bench_ours(weights, args.precision, b, timing, backend)["graph_ms"]
             for b in (args.batch, args.fit_batch)}
    model = fit_call_model(plan, this, args.precision, (args.batch, calls[args.batch]),
                           (args.fit_batch, calls[args.fit_batch]))
    return {"this": this, "ops_ms": ops_ms, "calls_s": calls, "model": model, "mhz": gpu_mhz(backend),
            "class_efficiency": class_efficiency(plan, this, args.precision, args.batch, ops_ms)}


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if min(args.batch, args.repeats, args.steps or 1) < 1 or args.fit_batch <= args.batch or args.top < 0:
        raise SystemExit("roofline: --batch, --repeats, --steps must be >= 1, --top >= 0 and --fit-batch > --batch")
    weights = load_model(args.weights)
    plan = build_plan(weights.config)
    steps = args.steps or weights.config.timesteps
    machines = [orin(mhz, tc, board=bd) for bd in BOARDS for mhz in bd.bw for tc in ORIN_TC_PER_SM_CLK]
    backend, meas = None, None
    if not args.no_gpu:
        from jetson_unet.backends import get_backend, gpu_available
        reason = gpu_available("cupy")
        if reason is None:
            backend = get_backend("cupy", args.sms)
        else:
            print(f"note: no GPU measurement ({reason})", file=sys.stderr)
    if backend is not None:
        meas = measure(weights, plan, backend, args)
        machines.insert(0, meas["this"])
    print_floors(plan, machines, args.precision, args.batch, steps)
    if meas is not None:
        print_measured(plan, meas["this"], args.precision, args.batch, meas["ops_ms"], meas["model"],
                       meas["calls_s"], args.top)
    preds = predictions(plan, args.precision, args.batch, steps, meas)
    print_prediction(steps, args.batch, preds)
    if args.json:
        write_json(args.json, plan, machines, args, steps, meas, preds)
    return 0


def write_json(path: str, plan: Plan, machines: List[Machine], args: argparse.Namespace, steps: int,
               meas: Optional[Dict[str, Any]], preds: Predictions) -> None:
    doc: Dict[str, Any] = {"precision": args.precision, "batch": args.batch, "steps": steps,
                           "seed_report_s": SEED_REPORT_S, "machines": [asdict(m) for m in machines],
                           "assumptions": {"boards": [asdict(b) for b in BOARDS],
                                           "orin_tc_flop_per_clk_sm": ORIN_TC_PER_SM_CLK},
                           "floors": {m.name: [dict(asdict(o), floor_s=o.floor_s)
                                               for o in op_floors(plan, m, args.precision, args.batch)]
                                      for m in machines},
                           "orin_s_per_image": {bd: {what: pred for what, pred in lines} for bd, lines in preds.items()}}
    if meas is not None:
        hot = roofline_rows(op_floors(plan, meas["this"], args.precision, args.batch),
                            {n: v["hot_ms"] * 1e-3 for n, v in meas["ops_ms"].items()})
        total = sum(r.time_s for r in hot)
        doc.update({k: v for k, v in meas.items() if k not in ("this", "model")},
                   this_gpu=asdict(meas["this"]), call_model=asdict(meas["model"]),
                   roofline_hot={"ops": [row_json(r, total) for r in hot],
                                 "classes": [row_json(r, total) for r in class_rows(hot)],
                                 "levels": [row_json(r, total) for r in level_rows(plan, hot)]})
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())

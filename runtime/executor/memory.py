"""How many bytes a GPU sampler takes, computed WITHOUT a GPU by the functions the executor itself
allocates with: the weights allocation's layout, the arena (jetson_unet.model.arena.plan_arena over the
plan's tensors plus the executor's extra regions), and the sampler's tables.

    est = estimate(weights, "fp16", batch=16, sms=8)        # a MemoryEstimate
    print(est.summary())                                    # the executor's refusal says the same

Device: the weights allocation (packed parameters, time-bias table, timestep-row table), the arena,
and in gpu mode the step tables and the noise rows of all T steps (GpuSampler._prepare_gpu), plus
with device noise its generator's scratch (jetson_unet.ops.noise, a few MB).
Pinned host: the weights' staging copy (kept while the early-start upload may still read it, i.e.
for the executor's life), x / eps / t of each executor, and in gpu mode the noise rows again. On a
Jetson the CPU and the GPU share one DRAM, so a budget there is met by device + pinned (`peak`).
Bytes are what is requested from CUDA; the driver's rounding, the CUDA context, CuPy and the Python
process come on top.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from jetson_unet.model.arena import (ALIGN, ArenaPlan, ExtraRegion, activation_elem_bytes, aligned,
                                     plan_arena, regions, view_layout)
from jetson_unet.errors import ArenaError, UsageError
from jetson_unet.model.plan import CAT, TIME_PROJ, Plan, build_plan
from jetson_unet.ops.noise import STATE_DTYPE, draw_rows, draw_slots, scratch_sizes
from jetson_unet.ops.common import ELEM_BYTES, Ctx, OpSpec
from jetson_unet.ops.specs import op_spec

MODES = ("gpu", "cpu")
BlobKey = Tuple[str, str]


# ---- the executor's layout ---------------------------------------------------------------------------------
def stats_layout(plan: Plan, specs: Sequence[OpSpec]) -> Tuple[Dict[str, int], Dict[str, Tuple[int, int]]]:
    """Each normalized conv reads GroupNorm partials written by the producer of its input:
    (partials per sample, (first op, last op)) per producer."""
    index = {op.out: i for i, op in enumerate(plan.ops)}
    by_out = {s.op.out: s for s in specs}
    parts: Dict[str, int] = {}
    life: Dict[str, Tuple[int, int]] = {}
    for s in specs:
        if not s.op.norm:
            continue
        prod = by_out.get(s.op.x)
        if prod is None or not prod.stats_parts:
            raise ArenaError(f"{s.op.out}: its input {s.op.x!r} is not written by a kernel that "
                             "emits GroupNorm statistics (a depthwise or GEMM conv)")
        parts[s.op.x] = prod.stats_parts
        life[s.op.x] = (index[s.op.x], index[s.op.out])
    return parts, life


def arena_extras(plan: Plan, specs: Sequence[OpSpec], stats: Tuple[Dict[str, int], Dict[str, Tuple[int, int]]],
                 batch: int, spec_batch: int) -> List[ExtraRegion]:
    """Arena regions beside the plan's tensors (specs built for `spec_batch`, scaled to `batch`).
    The image gets its own region alive across the whole call: the plan's `x` dies after init_conv,
    but a sampler (and a graph replay) reads x again after the call."""
    parts, life = stats
    n_ops, index = len(plan.ops), {op.out: i for i, op in enumerate(plan.ops)}
    c = plan.config
    ex = [("stats:" + n, 16 * batch * parts[n], f, l) for n, (f, l) in life.items()]
    ex += [("ws:" + s.op.out, s.ws_bytes * batch // spec_batch, index[s.op.out], index[s.op.out])
           for s in specs if s.ws_bytes]
    ex.append(("t_idx", 4 * batch, -1, n_ops))
    ex.append(("image", 4 * batch * c.channels * c.image_size ** 2, -1, n_ops))
    return ex


def executor_arena(plan: Plan, specs: Sequence[OpSpec], precision: str, batch: int, spec_batch: int,
                   stats: Optional[Tuple[Dict[str, int], Dict[str, Tuple[int, int]]]] = None) -> ArenaPlan:
    """The executor's arena: exact when batch == spec_batch, scaled split-K workspaces otherwise."""
    stats = stats if stats is not None else stats_layout(plan, specs)
    elem = activation_elem_bytes(plan, ELEM_BYTES[precision])
    return plan_arena(plan, batch, elem, arena_extras(plan, specs, stats, batch, spec_batch), align=ALIGN)


def time_columns(plan: Plan) -> Tuple[List[str], Dict[str, int], int]:
    """The time-bias table's columns: (TIME_PROJ outputs, column of each, row stride)."""
    names = [op.out for op in plan.time_ops if op.kind == TIME_PROJ]
    cols, off = {}, 0
    for n in names:
        cols[n] = off
        off += plan.tensors[n].channels
    return names, cols, off


@dataclass(frozen=True)
class WeightsLayout:
    offsets: Dict[BlobKey, int]     # ("", "tbias"), ("", "trows"), then (op, blob) in plan order
    op_end: List[int]               # where op i's weights end: one upload + event each
    nbytes: int                     # the weights allocation and its pinned staging buffer


def weights_layout(plan: Plan, specs: Sequence[OpSpec], batch: int) -> WeightsLayout:
    """Upload order = use order: the fp32 time-bias table [T, stride] (read from the first block on),
    the int32 timestep rows [T, B], then each op's blobs in plan order, each ALIGN-aligned."""
    T = plan.config.timesteps
    stride = time_columns(plan)[2]
    items: List[Tuple[BlobKey, int]] = [(("", "tbias"), 4 * T * (stride if stride else 1)),
                                        (("", "trows"), 4 * T * batch)]
    for s in specs:
        items.extend(((s.op.out, k), int(v.nbytes)) for k, v in s.blobs.items())
    offsets: Dict[BlobKey, int] = {}
    total, ends = 0, {}
    for k, n in items:
        offsets[k] = total
        total += aligned(n)
        ends[k[0]] = total
    op_end = [ends.get(s.op.out, 0) for s in specs]
    for i in range(1, len(op_end)):   # an op without blobs ends where the previous did
        op_end[i] = max(op_end[i], op_end[i - 1])
    return WeightsLayout(offsets, op_end, max(total, ALIGN))


def largest_batch(need: Callable[[int], int], budget: int, hi: Optional[int] = None, cap: int = 1 << 14) -> int:
    """The largest batch b >= 1 with need(b) <= budget (need grows with b), 0 when none.
    Searches [1, hi]; with hi None, doubles from 64 until need exceeds the budget (up to cap)."""
    if hi is None:
        hi = 64
        while hi < cap and need(hi) <= budget:
            hi *= 2
        hi = min(hi, cap)
    fits, lo = 0, 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if need(mid) <= budget:
            fits, lo = mid, mid + 1
        else:
            hi = mid - 1
    return fits


# ---- the whole sampler -----------------------------------------------------------------------------------
# written on the device by the step advance (kernels/io.cu init_conv), never staged from the host
DEVICE_ONLY_TABLES = ("cur", "hist")
STEP_COEFS = 6   # per step: c_x, c_eps, sigma, c_h, d_x, d_eps (jetson_unet.model.schedule.Step)


def sampler_tables(config: Any, batch: int) -> Dict[str, int]:
    """gpu mode's device tables (GpuSampler._prepare_gpu): step coefficients, noise row per step,
    t per step, the step counter, the current step's coefficients (kernels/io.cu: two float4), the
    noise of every step for the whole batch (fp32, image by image: [B][T][C*H*W]), the history a
    multistep sampler carries from step to step (fp32 NHWC, as the image) and the uint8 images
    (kernels/io.cu image_u8)."""
    T, n = config.timesteps, batch * config.channels * config.image_size ** 2
    return {"coef": 4 * STEP_COEFS * T, "noise_row": 4 * T, "t_of_step": 4 * T, "counter": 4, "cur": 32,
            "noise": 4 * n * T, "hist": 4 * n, "image": n}


@dataclass(frozen=True)
class MemoryEstimate:
    precision: str
    batch: int
    mode: str               # "gpu" | "cpu" (a sampler), "executor" (one GpuExecutor alone)
    weights_bytes: int      # device: one weights allocation per executor
    arena_bytes: int        # device: activations, statistics, workspaces (sum over executors)
    sampler_bytes: int      # device: gpu mode's step tables and noise rows
    pinned_bytes: int       # host, page-locked

    @property
    def device_bytes(self) -> int:
        return self.weights_bytes + self.arena_bytes + self.sampler_bytes

    @property
    def peak_bytes(self) -> int:
        """What a Jetson's shared DRAM must hold: device + pinned host."""
        return self.device_bytes + self.pinned_bytes

    def summary(self) -> str:
        """One line: the report's terms, also the executor's refusal."""
        what = f"{self.mode} mode" if self.mode in MODES else self.mode
        parts = [f"weights {mb(self.weights_bytes)}", f"arena {mb(self.arena_bytes)}"]
        if self.mode == "gpu":
            parts.append(f"sampler tables {mb(self.sampler_bytes)}")
        return (f"batch {self.batch} {self.precision} ({what}): {' + '.join(parts)} = {mb(self.device_bytes)} "
                f"on the device, + {mb(self.pinned_bytes)} pinned host = {mb(self.peak_bytes)} peak")


def mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def executor_pinned(config: Any, batch: int, weights_bytes: int) -> int:
    """The executor's page-locked buffers: the weights' staging copy, x, eps (fp32 NHWC), t."""
    return weights_bytes + 2 * 4 * batch * config.channels * config.image_size ** 2 + 4 * batch


def executor_specs(weights: Any, precision: str, batch: int, sms: int) -> Tuple[Plan, List[OpSpec]]:
    """The op specs GpuExecutor builds for this batch on a GPU with `sms` SMs."""
    plan = build_plan(weights.config)
    ctx = Ctx(plan, weights.params, precision, batch, sms, view_layout(plan))
    return plan, [op_spec(op, ctx) for op in plan.ops if op.kind != CAT]


def halves(batch: int, mode: str) -> List[int]:
    """The executor batch sizes of a sampler: one executor in gpu mode, two half-batch ones in cpu mode."""
    return [batch] if mode == "gpu" or batch < 2 else [batch - batch // 2, batch // 2]


def executor_estimate(config: Any, plan: Plan, specs: Sequence[OpSpec], precision: str, batch: int,
                      arena_bytes: Optional[int] = None) -> MemoryEstimate:
    """One GpuExecutor's bytes from its specs (arena_bytes: its planned arena, when already made)."""
    wl = weights_layout(plan, specs, batch)
    a = executor_arena(plan, specs, precision, batch, batch).nbytes if arena_bytes is None else arena_bytes
    return MemoryEstimate(precision, batch, "executor", wl.nbytes, a, 0, executor_pinned(config, batch, wl.nbytes))


def sampler_estimate(config: Any, parts: Sequence[MemoryEstimate], batch: int, mode: str,
                     noise: str = "device") -> MemoryEstimate:
    """A GpuSampler's bytes: its executors' (`parts`, one per half) plus what the sampler adds. gpu mode
    pins the noise rows on the host (host noise, and device noise's redraw of a flagged run); device
    noise adds its generator's scratch on the device. cpu mode pins x and eps per run instead."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    c = config
    w = sum(e.weights_bytes for e in parts)
    a = sum(e.arena_bytes for e in parts)
    pinned = sum(e.pinned_bytes for e in parts)
    if mode == "gpu":
        tables = sampler_tables(c, batch)
        sampler = sum(aligned(v) for v in tables.values())
        pinned += sum(v for k, v in tables.items() if k not in DEVICE_ONLY_TABLES)   # the rest have pinned mirrors
        if noise == "device":   # one generator per image, drawing together (a scratch slot each)
            n = c.channels * c.image_size ** 2
            rows = draw_rows(n, c.timesteps, batch)
            sampler += regions(scratch_sizes(n, rows, batch, draw_slots(n, rows, batch)))[1]
            pinned += 2 * batch * STATE_DTYPE.itemsize   # the states, staged up by seed() and down by flags()
    else:
        sampler = 0
        pinned += 2 * 4 * batch * c.channels * c.image_size ** 2
    return MemoryEstimate(parts[0].precision, batch, mode, w, a, sampler, pinned)


def estimate(weights: Any, precision: str, batch: int, sms: int = 8, mode: str = "gpu",
             noise: str = "device") -> MemoryEstimate:
    """Bytes of a GpuSampler(weights, precision, batch, mode, noise=noise) on a GPU with `sms` SMs
    (the built-in tiles)."""
    per_batch: Dict[int, MemoryEstimate] = {}   # an even cpu-mode batch has two equal halves: one spec build
    for b in halves(batch, mode):
        if b not in per_batch:
            plan, specs = executor_specs(weights, precision, b, sms)
            per_batch[b] = executor_estimate(weights.config, plan, specs, precision, b)
    return sampler_estimate(weights.config, [per_batch[b] for b in halves(batch, mode)], batch, mode, noise)


def check_fits(est: MemoryEstimate, free: int, integrated: bool, need_at: Callable[[int], MemoryEstimate]) -> None:
    """Refuse (ArenaError) what does not fit `free` (cudaMemGetInfo), before anything is built. On an
    integrated GPU (a Jetson) the CPU and GPU share one DRAM, so the pinned host buffers come out of
    the same free memory: the peak must fit there, the device bytes alone on a discrete GPU. The
    message is the --plan-only line, the bytes and the largest batch that fits (need_at(b): the
    estimate at batch b, searched only on a refusal)."""
    def need(e: MemoryEstimate) -> int:
        return e.peak_bytes if integrated else e.device_bytes
    if need(est) <= free:
        return
    fits = largest_batch(lambda b: need(need_at(b)), free, hi=est.batch - 1)
    where = "device + pinned host, in the memory the CPU and GPU share" if integrated else "on the device"
    raise ArenaError(f"{est.summary()}: the GPU has {free} bytes free for the {need(est)} needed ({where}); the "
                     f"largest batch that fits is {fits} (`jetson-sample --plan-only` prints the whole plan)")


# ---- the report (`jetson-sample --plan-only`) ---------------------------------------------------------------
@dataclass(frozen=True)
class Budget:
    key: str        # as given: "4GB", "8GB", or a byte count
    label: str
    nbytes: int
    note: str


# Usable by one application, per the platform notes (~5 GB of the 8 GB board; half that of the 4 GB):
# the rest goes to the OS, the desktop and the carve-outs.
BOARD_BUDGETS = {"4GB": Budget("4GB", "Orin Nano 4GB", 2_500_000_000, "~2.5 GB usable assumed"),
                 "8GB": Budget("8GB", "Orin Nano 8GB", 5_000_000_000, "~5 GB usable assumed")}


def parse_budget(text: str) -> Budget:
    """'4GB' / '8GB' (the Orin Nano boards, usable share assumed) or a byte count ('2500000000', '2.5e9')."""
    if text.strip().upper() in BOARD_BUDGETS:
        return BOARD_BUDGETS[text.strip().upper()]
    try:
        n = int(float(text))
    except (ValueError, OverflowError):   # 'abc', 'nan'; 'inf' and '1e999'
        n = 0
    if n <= 0:
        raise UsageError(f"--budget {text!r}: give 4GB or 8GB (Orin Nano boards) or a byte count such as 3000000000")
    return Budget(text, f"{n / 1e9:.2f} GB", n, "as given")


def report(weights: Any, precisions: Sequence[str], batches: Sequence[int], budgets: Sequence[Budget],
           sms: int, mode: str, out: Callable[[str], None], source: str = "", noise: str = "device") -> List[str]:
    """Print the table and the largest batch per budget; returns '(batch, precision) on budget' misfits."""
    memo: Dict[Tuple[str, int], MemoryEstimate] = {}

    def est(p: str, b: int) -> MemoryEstimate:
        if (p, b) not in memo:
            memo[(p, b)] = estimate(weights, p, b, sms, mode, noise)
        return memo[(p, b)]

    c = weights.config
    out(f"memory plan: {source or c.arch} ({c.image_size}x{c.image_size}, T={c.timesteps}), {mode} mode, "
        f"tiles for {sms} SMs; MB = 1e6 bytes as requested from CUDA")
    scratch = " (with the device noise generator's scratch)" if mode == "gpu" and noise == "device" else ""
    out(f"device = weights + arena + sampler tables{scratch}; pinned = page-locked host buffers; a Jetson's CPU and GPU "
        "share one DRAM, so what it must hold is peak = device + pinned")
    cols = ("precision", "batch", "weights", "arena", "sampler", "device", "pinned", "peak", "fits")
    out("{:<9} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}  {}".format(*cols))
    misfits = []
    for p in precisions:
        for b in batches:
            e = est(p, b)
            fits = [g.key for g in budgets if e.peak_bytes <= g.nbytes]
            misfits += [f"batch {b} {p} on {g.label} (peak {mb(e.peak_bytes)} > {mb(g.nbytes)})"
                        for g in budgets if g.key not in fits]
            out("{:<9} {:>6} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f}  {}".format(
                p, b, *(x / 1e6 for x in (e.weights_bytes, e.arena_bytes, e.sampler_bytes, e.device_bytes,
                                          e.pinned_bytes, e.peak_bytes)), " ".join(fits) or "-"))
    out("largest batch with peak <= budget:")
    for g in budgets:
        best = [f"{p} {largest_batch(lambda b, p=p: est(p, b).peak_bytes, g.nbytes)}" for p in precisions]
        out(f"  {g.label} ({g.nbytes / 1e9:.2f} GB, {g.note}): {', '.join(best)}")
    out("not counted: the CUDA context, CuPy and the Python process (measure them on the board)")
    return misfits

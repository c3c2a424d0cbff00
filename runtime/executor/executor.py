"""GPU executor of the plan: one launch per non-cat op, over two device allocations.

    ex = GpuExecutor(weights, precision="fp16", batch=4)     # compiles, allocates, uploads once
    eps = ex.eps(x_nchw_float32, t)                          # convenience: upload, run, download
    ex.run(stream, ex.t_row_ptr(t))                          # enqueue only (pipelines, CUDA graphs)

Memory: the weights allocation holds every op's packed parameters, the fp32 time-bias table
[T, sum of block widths] (computed once per load on the host, float64 reference, since the plan's
time ops depend on t only) and a [T, B] int32 table of timestep rows, so a sampling step only
points its kernels at row t. The arena (jetson_unet.model.arena) holds the NHWC activations (the image x and
eps in fp32, the rest in the precision's dtype), the GroupNorm partial statistics between a
producer and its normalized consumer, and the per-sample timestep indices `t_idx`.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from jetson_unet.model.arena import ArenaPlan, activation_elem_bytes, view_layout
from jetson_unet.errors import UsageError
from jetson_unet.model.plan import CAT, build_plan
from jetson_unet.model.reference import Reference
from jetson_unet.executor import memory
from jetson_unet.backends import get_backend
from jetson_unet.backends.base import Backend
from jetson_unet.build.loader import KernelSet
from jetson_unet.ops.common import (ELEM_BYTES, SMEM_LIMIT, OpSpec, Resolver, from_device, storage_dtype,
                                    to_device)
from jetson_unet.ops.conv_pipe import PIPE_SCRATCH
from jetson_unet.ops.specs import module_keys, op_spec
from jetson_unet.ops.policy import KernelPolicy, run_context

log = logging.getLogger(__name__)
PRECISIONS = ("fp32", "fp16", "bf16")
ALIGN = memory.ALIGN
_T_MARK = object()   # stands for the t_idx pointer in argument tuples until launch
_STEP_MARK = object()   # final_conv's sampler-step arguments (5 from here; null by default)
_ADV_MARK = object()    # init_conv's step-advance arguments (7 from here; null by default)


@dataclass(frozen=True)
class StepTables:
    """Device pointers of gpu mode's step tables (memory.sampler_tables), for GpuExecutor.run(step=):
    init_conv's extra CTA advances the step (counter, t_idx, cur from the per-step tables) and
    final_conv takes it on the image buffer (kernels/io.cu)."""
    noise: int
    cur: int
    counter: int
    t_of_step: int
    coef: int
    noise_row: int
    n_steps: int
    hist: int        # the multistep history (fp32, as the image)
    noise_rows: int  # rows of noise per image in `noise` ([B][noise_rows][C*H*W])


@dataclass
class Launch:
    name: str
    fn: Any
    grid: Tuple[int, int, int]
    block: Tuple[int, int, int]
    args: Tuple[Any, ...]
    smem: int
    t_pos: Optional[int]
    step_pos: Optional[int] = None   # where the sampler step's arguments go (final_conv, init_conv)
    step_mark: Any = None            # _STEP_MARK or _ADV_MARK: which of them

    def args_for(self, t_ptr: int, step: Optional[Dict[Any, Tuple[Any, ...]]] = None) -> Tuple[Any, ...]:
        """The arguments with the timesteps at t_ptr and, where this kernel takes them, the sampler
        step's (GpuExecutor.step_args; none: null pointers, eps only)."""
        if self.t_pos is None and self.step_pos is None:
            return self.args
        a = list(self.args)
        if self.t_pos is not None:
            a[self.t_pos] = np.uint64(t_ptr)
        if self.step_pos is not None:
            vals = (step or NO_STEP)[self.step_mark]
            a[self.step_pos:self.step_pos + len(vals)] = vals
        return tuple(a)


NO_STEP = {_STEP_MARK: (np.uint64(0),) * 4 + (np.int32(0),), _ADV_MARK: (np.uint64(0),) * 6 + (np.int32(0),)}


class _Addr(Resolver):
    def __init__(self, ex: "GpuExecutor") -> None:
        self.ex, self.t_idx, self.step, self.advance = ex, _T_MARK, _STEP_MARK, _ADV_MARK
        self.norm_eps = ex.config.norm_eps

    def tensor(self, name: str) -> Tuple[int, int]:
        if name == self.ex.plan.input:   # the persistent image buffer (see memory.arena_extras)
            return self.ex.x_ptr, self.ex.config.channels
        reg = self.ex.arena.regions[name]
        return self.ex.arena_ptr + reg.offset, reg.ld

    def workspace(self, op: str) -> int:
        return self.ex.arena_ptr + self.ex.arena.regions["ws:" + op].offset

    def blob(self, op: str, key: str) -> int:
        return self.ex.weights_ptr + self.ex.blob_offsets[(op, key)]

    def tbias(self, name: str) -> Tuple[int, int]:
        return self.ex.weights_ptr + self.ex.tb_offset + 4 * self.ex.tb_cols[name], self.ex.tb_stride

    def stats_out(self, op: str) -> int:
        reg = self.ex.arena.regions.get("stats:" + op)
        return self.ex.arena_ptr + reg.offset if reg else 0

    def stats_in(self, op: Any) -> Tuple[int, int]:
        return self.ex.arena_ptr + self.ex.arena.regions["stats:" + op.x].offset, self.ex.stats_parts[op.x]


class GpuExecutor:
    def __init__(self, weights: Any, precision: str = "fp16", batch: int = 1, backend: Optional[Backend] = None,
                 early_start: bool = True, policy: KernelPolicy = KernelPolicy(), extra_keys: Sequence[Any] = (),
                 fits: Optional[Callable[[memory.MemoryEstimate], None]] = None, shards: int = 1,
                 memo: Optional[Dict[Any, Any]] = None) -> None:
        """policy: which tiles (jetson_unet.ops.policy). extra_keys: more instantiations in the same
        module (the tuner's candidates). fits: checks this executor's memory estimate instead of the
        executor's own check (a GpuSampler adds its tables to it); either runs before any compile,
        pinning or upload. shards: the kernels in that many modules, compiled side by side (the
        tuner's; build.loader.KernelSet). memo: shared by executors of the same weights, which then pack
        each op's weights once (ops.common.memoized; the tuner's rounds)."""
        if precision not in PRECISIONS:
            raise UsageError(f"GPU precision must be one of {PRECISIONS}, got {precision!r}")
        if batch < 1:
            raise UsageError(f"batch must be >= 1, got {batch}")
        self.backend = backend or get_backend("cupy")
        self.precision, self.batch, self.config = precision, int(batch), weights.config
        self.plan = build_plan(self.config)
        self._bufs: List[Any] = []
        ctx, self.tiles_from, self.tile_batch, self.tile_sms, tuned = run_context(
            weights, self.plan, precision, self.batch, self.backend.device_name(), policy.device_sms(self.backend),
            policy, memo)
        self.specs: List[OpSpec] = [op_spec(op, ctx) for op in self.plan.ops if op.kind != CAT]
        # Sizes first (jetson_unet.executor.memory, shared with `jetson-sample --plan-only`): a batch that
        # does not fit is refused before any compile, pinned staging or upload.
        self.stats_parts, self._stats_life = memory.stats_layout(self.plan, self.specs)
        self._wlayout = memory.weights_layout(self.plan, self.specs, self.batch)
        self.arena: ArenaPlan = memory.executor_arena(self.plan, self.specs, precision, self.batch, self.batch,
                                                      (self.stats_parts, self._stats_life))
        (fits or self._check_memory)(self.memory_estimate())
        keys = set(module_keys(ctx, tuned)) | set(extra_keys)
        self.kernels = KernelSet(self.backend, sorted(keys, key=lambda k: k.symbol), shards=shards)
        # the halo conv's and a deep cp.async ring's dynamic smem go past the 48 KB of static + dynamic
        # that need no opt-in (static: at most PIPE_SCRATCH beside them)
        big: Dict[str, int] = {}
        for s in self.specs:
            if s.smem + PIPE_SCRATCH > SMEM_LIMIT:
                big[s.symbol] = max(big.get(s.symbol, 0), s.smem)
        for symbol, nbytes in big.items():
            self.kernels[symbol].set_max_dynamic_shared(nbytes)
        host_w = self._pack_weights(weights)
        self.stream = self.backend.stream()
        self._alloc_and_upload(host_w, early_start)
        addr = _Addr(self)
        self.launches = [self._launch(s, addr) for s in self.specs]
        c = self.config
        self._host_x = self.backend.pinned((self.batch, c.image_size, c.image_size, c.channels), np.float32)
        self._host_eps = self.backend.pinned((self.batch, c.image_size, c.image_size, c.channels), np.float32)
        self._host_t = self.backend.pinned((self.batch,), np.int32)

    # ---- construction steps ---------------------------------------------------------------------
    def _elem_bytes(self) -> Dict[str, int]:
        return activation_elem_bytes(self.plan, ELEM_BYTES[self.precision])

    def _pack_weights(self, weights: Any) -> np.ndarray:
        """One pinned host buffer laid out by memory.weights_layout: the time-bias table, the
        timestep-row table, every op's blobs."""
        T = self.config.timesteps
        env = Reference(weights, np.float64).time_env(np.arange(T))
        names, self.tb_cols, self.tb_stride = memory.time_columns(self.plan)
        table = np.concatenate([env[n] for n in names], axis=1).astype(np.float32) if names else np.zeros((T, 1), np.float32)
        rows = np.repeat(np.arange(T, dtype=np.int32)[:, None], self.batch, axis=1)
        items: List[Tuple[Tuple[str, str], np.ndarray]] = [(("", "tbias"), table),
                                                           (("", "trows"), np.ascontiguousarray(rows))]
        for s in self.specs:
            items.extend(((s.op.out, k), np.ascontiguousarray(v)) for k, v in s.blobs.items())
        lay = self._wlayout
        self.blob_offsets, self._op_end = lay.offsets, list(lay.op_end)
        host = self.backend.pinned((lay.nbytes,), np.uint8)   # pinned: the upload is async
        host[...] = 0
        for k, v in items:
            o = self.blob_offsets[k]
            host[o:o + v.nbytes] = v.reshape(-1).view(np.uint8)
        self.tb_offset = self.blob_offsets[("", "tbias")]
        self.trows_offset = self.blob_offsets[("", "trows")]
        return host

    def memory_estimate(self) -> memory.MemoryEstimate:
        """This executor's own bytes, in the report's terms (no sampler tables)."""
        return memory.executor_estimate(self.config, self.plan, self.specs, self.precision, self.batch,
                                        self.arena.nbytes)

    def _check_memory(self, est: memory.MemoryEstimate) -> None:
        """Refuse before allocating: say the bytes needed and the largest batch that fits."""
        stats = (self.stats_parts, self._stats_life)

        def at(b: int) -> memory.MemoryEstimate:   # the arena grows with the batch; the weights do not
            return dataclasses.replace(est, batch=b, arena_bytes=memory.executor_arena(
                self.plan, self.specs, self.precision, b, self.batch, stats).nbytes,
                pinned_bytes=memory.executor_pinned(self.config, b, est.weights_bytes))
        memory.check_fits(est, self.backend.mem_info()[0], self.backend.integrated(), at)

    def _alloc_and_upload(self, host_w: np.ndarray, early_start: bool) -> None:
        """Blocking: one copy, then wait. Early start: one copy per op, in plan order, on a copy
        stream with an event each; the first `run` makes each kernel wait for its own op's event
        only, so the first step starts while later weights are still landing."""
        self._wbuf = self.backend.alloc(host_w.nbytes)
        self._bufs.append(self._wbuf)
        self._abuf = self.backend.alloc(self.arena.nbytes)
        self._bufs.append(self._abuf)
        self.weights_ptr, self.arena_ptr = self._wbuf.ptr, self._abuf.ptr
        self.upload_start = self.backend.event()
        self._pending: List[Any] = []
        self._host_w: Optional[np.ndarray] = None
        if not early_start:
            self.upload_start.record(self.stream)
            self.backend.h2d(self.weights_ptr, host_w, self.stream)
            self.stream.synchronize()
            return
        self._copy = self.backend.stream()
        self._host_w = host_w                  # must outlive the copies
        self.upload_start.record(self._copy)
        start = 0
        for end in self._op_end:
            if end > start:
                self.backend.h2d(self.weights_ptr + start, host_w[start:end], self._copy)
            ev = self.backend.event(timing=False)
            ev.record(self._copy)
            self._pending.append(ev)
            start = end
        if start < host_w.nbytes:
            self.backend.h2d(self.weights_ptr + start, host_w[start:], self._copy)
            self._pending[-1].record(self._copy)

    def wait_weights(self, stream: Any) -> None:
        """Make `stream` wait for the whole weight upload (before a CUDA-graph capture)."""
        if self._pending:
            self.backend.wait(stream, self._pending[-1])
            self._pending = []

    def drop_staging(self) -> bool:
        """Free the weights' page-locked staging copy once the early-start upload has landed (waits
        for it). True when there was one to free."""
        if self._host_w is None:
            return False
        self._copy.synchronize()
        self._host_w = None
        return True

    def _launch(self, spec: OpSpec, addr: _Addr) -> Launch:
        args = spec.make_args(addr)
        t_pos = next((i for i, a in enumerate(args) if a is _T_MARK), None)
        step_pos = next((i for i, a in enumerate(args) if a is _STEP_MARK or a is _ADV_MARK), None)
        launch = Launch(spec.op.out, self.kernels[spec.symbol], spec.grid, spec.block, args, spec.smem, t_pos,
                        step_pos, None if step_pos is None else args[step_pos])
        launch.args = launch.args_for(self.t_idx_ptr)
        return launch

    # ---- device pointers --------------------------------------------------------------------------
    @property
    def x_ptr(self) -> int:
        return self.arena_ptr + self.arena.regions["image"].offset

    @property
    def eps_ptr(self) -> int:
        return self.arena_ptr + self.arena.regions[self.plan.output].offset

    @property
    def t_idx_ptr(self) -> int:
        return self.arena_ptr + self.arena.regions["t_idx"].offset

    def t_row_ptr(self, t: int) -> int:
        """A device int32[B] holding t for every sample (constant table row: graph-friendly)."""
        if not 0 <= int(t) < self.config.timesteps:
            raise UsageError(f"timestep {t} outside [0, {self.config.timesteps})")
        return self.weights_ptr + self.trows_offset + 4 * self.batch * int(t)

    @property
    def launches_per_call(self) -> int:
        return len(self.launches)

    # ---- running ------------------------------------------------------------------------------------
    def step_args(self, tables: StepTables) -> Dict[Any, Tuple[Any, ...]]:
        """The sampler step's kernel arguments (Launch.args_for): final_conv's, then init_conv's."""
        P = np.uint64
        return {_STEP_MARK: (P(self.x_ptr), P(tables.noise), P(tables.cur), P(tables.hist), np.int32(tables.noise_rows)),
                _ADV_MARK: (P(tables.counter), P(self.t_idx_ptr), P(tables.cur), P(tables.t_of_step), P(tables.coef),
                            P(tables.noise_row), np.int32(tables.n_steps))}

    def run(self, stream: Any, t_idx_ptr: Optional[int] = None, step: Optional[StepTables] = None) -> None:
        """Enqueue one U-Net call: reads the device image buffer (x_ptr), writes eps (eps_ptr).
        step: gpu mode's step tables; init_conv then also advances the sampler's step (the counter,
        t_idx and the step's coefficients) and final_conv takes that step on the image buffer in
        place (kernels/io.cu), so the timesteps are t_idx's."""
        tp = self.t_idx_ptr if t_idx_ptr is None else int(t_idx_ptr)
        same = tp == self.t_idx_ptr
        if step is not None and not same:
            raise ValueError("a sampler step reads its timesteps from t_idx, which it advances")
        sargs = None if step is None else self.step_args(step)
        pending, self._pending = self._pending, []
        for i, L in enumerate(self.launches):
            if pending:                       # early start: wait for this op's weights only
                self.backend.wait(stream, pending[i])
            args = L.args if same and (sargs is None or L.step_pos is None) else L.args_for(tp, sargs)
            L.fn.launch(L.grid, L.block, args, L.smem, stream)

    def launch_op(self, name: str, stream: Any = None) -> None:
        """Run the one kernel that computes tensor `name` (per-op tests and debugging)."""
        L = next(L for L in self.launches if L.name == name)
        self.wait_weights(stream or self.stream)
        L.fn.launch(L.grid, L.block, L.args, L.smem, stream or self.stream)

    def eps(self, x: np.ndarray, t: Any) -> np.ndarray:
        """x (B, C, H, W) float32, t (B,) or scalar integer timesteps -> eps (B, C, H, W) float32."""
        self._check_open()
        c = self.config
        x = np.asarray(x, dtype=np.float32)
        shape = (self.batch, c.channels, c.image_size, c.image_size)
        if x.shape != shape:
            raise UsageError(f"x must be {shape} for this executor, got {x.shape}")
        t = np.broadcast_to(np.asarray(t, dtype=np.int64), (self.batch,))
        if t.min() < 0 or t.max() >= c.timesteps:
            raise UsageError(f"timesteps must lie in [0, {c.timesteps}), got {t.tolist()}")
        self._host_x[...] = x.transpose(0, 2, 3, 1)
        self._host_t[...] = t
        self.backend.h2d(self.x_ptr, self._host_x, self.stream)
        self.backend.h2d(self.t_idx_ptr, self._host_t, self.stream)
        self.run(self.stream)
        self.backend.d2h(self._host_eps, self.eps_ptr, self.stream)
        self.stream.synchronize()
        return np.ascontiguousarray(self._host_eps.transpose(0, 3, 1, 2))

    # ---- tensors by name (tests, debugging): whole-root read-modify-write, synchronous -------------
    def _root(self, name: str) -> Tuple[int, np.ndarray, Any]:
        if name == self.plan.input:
            c = self.config
            return self.arena.regions["image"].offset, np.empty(
                (self.batch, c.image_size, c.image_size, c.channels), np.float32), np.float32
        reg = self.arena.regions[name]
        root = self.arena.regions[reg.root]
        dt = np.float32 if self._elem_bytes()[reg.root] == 4 else storage_dtype(self.precision)
        t = self.plan.tensors[reg.root]
        host = np.empty((self.batch, t.size, t.size, t.channels), dtype=dt)
        return root.offset, host, dt

    def download_tensor(self, name: str) -> np.ndarray:
        """(B, C, H, W) float32 of tensor `name` (a view's channels cut out of its root)."""
        off, host, dt = self._root(name)
        self.backend.d2h(host, self.arena_ptr + off, self.stream)
        self.stream.synchronize()
        ld, c0 = view_layout(self.plan)[name]
        ch = self.plan.tensors[name].channels
        vals = host[..., c0:c0 + ch]
        vals = vals.astype(np.float32) if dt == np.float32 else from_device(vals, self.precision)
        return np.ascontiguousarray(vals.transpose(0, 3, 1, 2))

    def upload_tensor(self, name: str, value: np.ndarray) -> None:
        """Write (B, C, H, W) values into tensor `name`, rounded to its device dtype."""
        off, host, dt = self._root(name)
        self.backend.d2h(host, self.arena_ptr + off, self.stream)
        self.stream.synchronize()
        ld, c0 = view_layout(self.plan)[name]
        v = np.asarray(value, dtype=np.float32).transpose(0, 2, 3, 1)
        host[..., c0:c0 + v.shape[-1]] = v if dt == np.float32 else to_device(v, self.precision)
        self.backend.h2d(self.arena_ptr + off, host, self.stream)
        self.stream.synchronize()

    def set_timesteps(self, t: Any) -> None:
        self._host_t[...] = np.broadcast_to(np.asarray(t, dtype=np.int64), (self.batch,))
        self.backend.h2d(self.t_idx_ptr, self._host_t, self.stream)
        self.stream.synchronize()

    # ---- reports, lifetime ----------------------------------------------------------------------------
    def arena_report(self) -> Dict[str, Any]:
        a = self.arena
        return {"arena_bytes": a.nbytes, "sum_bytes": a.sum_bytes, "peak_live_bytes": a.peak_live_bytes,
                "weights_bytes": self._wbuf.nbytes if self._bufs else 0, "text": a.report()}

    def _check_open(self) -> None:
        if not self._bufs:
            raise UsageError("this GpuExecutor is closed")

    def close(self) -> None:
        """Free both allocations; safe to call twice."""
        if self._bufs and getattr(self, "_copy", None) is not None:
            self._copy.synchronize()          # no weight copy may still target the buffer
        self._host_w, self._pending = None, []
        for b in self._bufs:
            b.free()
        self._bufs = []

    def __enter__(self) -> "GpuExecutor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

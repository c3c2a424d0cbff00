"""The sampling loop on the GPU, overlapped with streams and events. Two modes:

cpu (the seed design): each step runs the U-Net on a compute stream, copies eps to pinned memory on
    the copy stream, runs `schedule.p_sample` on the CPU in NumPy (the reference's code and noise
    stream, so images match the reference for a seed) and uploads x for the next step. For batch
    >= 2 the batch is split into two halves in ping-pong: the GPU runs one half's U-Net while the
    CPU samples the other. The next step's time-dependent work costs nothing per step: the time
    biases of all T timesteps are computed once per load (see executor.py).
gpu (beyond the seeds): p_sample runs on the GPU, in the U-Net's last kernel (final_conv), and its
    first (init_conv) advances the step in an extra CTA; one CUDA graph holds a whole step (the
    U-Net) and is replayed for every step, because the kernels read the step number from device
    memory. Images
    equal the cpu mode's up to fp32 rounding. The noise (the same seeded stream) is either drawn
    on the CPU and uploaded in chunks on the copy stream while earlier steps run (noise="host"), or
    drawn on the GPU by jetson_unet.ops.noise (on a side stream beside the steps, each draw a CUDA
    graph; without graphs, between the steps), x_T straight into the executor's input and each row
    ahead of the step that reads it (noise="device"; a run whose device draws raised a flag is
    redrawn on the host, so the images are always the spec's stream).
Streams: on an H100 a process in which a few plain (non-graph) kernel launches went to a second
    stream runs every later kernel launch ~0.2 us slower for good, graphs included (a batch-1 U-Net
    call 400 -> 427 us); graph launches on other streams do not do that. So in gpu mode plain
    launches go to the compute stream only: the side stream's draws are graphs, and a Pipeline
    keeps one compute stream for all its samplers. (cpu mode's ping-pong
    launches its second half-batch on a second stream, and pays for it.)
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, List, Optional, Sequence

import numpy as np

from jetson_unet.errors import NoiseUnsupported, RuntimeErrorBase, UsageError
from jetson_unet.model.schedule import NoiseStream, Seeds, Step, as_seeds, p_sample, to_uint8
from jetson_unet.trace import Timeline
from jetson_unet.executor import memory
from jetson_unet.backends.base import Backend
from jetson_unet.executor.executor import GpuExecutor, StepTables
from jetson_unet.ops.common import I, P
from jetson_unet.ops.policy import KernelPolicy
from jetson_unet.sampling.feeds import DeviceFeed, HostFeed, nchw_to_nhwc
from jetson_unet.ops.noise import FLAG_AMBIGUOUS, NOISE_SOURCES, DeviceNoise, draw_rows

log = logging.getLogger(__name__)
MODES = ("gpu", "cpu")
Callback = Callable[[int, int], None]


class GpuRunError(RuntimeErrorBase):
    """A CUDA error while sampling (surfaced at the next synchronization point)."""


DEVICE_ERROR_PACKAGES = ("cupy", "cupy_backends", "cupyx", "pycuda", "cuda")   # whose exceptions are CUDA's


def device_error(e: BaseException, doing: str) -> Optional[GpuRunError]:
    """A CUDA error raised by the backend's library (CuPy, pycuda), or an out-of-memory, as one
    GpuRunError line; None for anything else (a bug keeps its traceback)."""
    package = (type(e).__module__ or "").split(".")[0]
    if isinstance(e, RuntimeErrorBase) or not (isinstance(e, MemoryError) or package in DEVICE_ERROR_PACKAGES):
        return None
    text = " ".join(str(e).split()) or "(no message)"
    oom = isinstance(e, MemoryError) or "out of memory" in text.lower()
    return GpuRunError(f"{'out of memory' if oom else 'CUDA error'} while {doing} on the GPU: "
                       f"{type(e).__name__}: {text[:300]}")


@contextmanager
def nvtx(backend: Backend, name: str) -> Iterator[None]:
    """An NVTX range (Nsight Systems on a Jetson shows the phases)."""
    backend.nvtx_push(name)
    try:
        yield
    finally:
        backend.nvtx_pop()


class GpuSampler:
    """Owns the executors (one, or two half-batch ones in cpu ping-pong) and their streams."""

    def __init__(self, weights: Any, precision: str, batch: int, mode: str = "gpu", graphs: bool = True,
                 backend: Optional[Backend] = None, noise: str = "host", stream: Any = None,
                 policy: KernelPolicy = KernelPolicy()) -> None:
        """stream: the compute stream, given by a caller that keeps one across samplers (Pipeline,
        jetson-bench): plain launches on more than one stream slow a process's later launches.
        policy: how the executors pick their kernels (jetson_unet.ops.policy)."""
        if mode not in MODES:
            raise UsageError(f"unknown GPU sampling mode {mode!r} (choose from {', '.join(MODES)})")
        if noise not in NOISE_SOURCES:
            raise UsageError(f"unknown noise source {noise!r} (choose from {', '.join(NOISE_SOURCES)})")
        if noise == "device" and mode != "gpu":
            raise UsageError("device noise goes with gpu mode (cpu mode samples on the host)")
        from jetson_unet.backends import get_backend
        self.backend = backend or get_backend("cupy")
        self.mode, self.batch, self.precision = mode, int(batch), precision
        self.graphs = bool(graphs) and self.backend.supports_graphs   # pycuda: none
        # Memory: the whole sampler must fit before anything is compiled, pinned or uploaded (on a
        # Jetson its pinned buffers too: jetson_unet.executor.memory.check_fits). gpu mode checks its one
        # executor's own estimate plus the sampler's tables; cpu mode estimates both halves first.
        sms, free = policy.device_sms(self.backend), self.backend.mem_info()[0]
        integrated = self.backend.integrated()

        def at(b: int) -> memory.MemoryEstimate:
            return memory.estimate(weights, precision, b, sms, mode, noise)

        def fits(e: memory.MemoryEstimate) -> None:
            memory.check_fits(memory.sampler_estimate(weights.config, [e], batch, mode, noise), free, integrated, at)
        halves = memory.halves(batch, mode)
        if len(halves) > 1:
            memory.check_fits(at(batch), free, integrated, at)
        self.executors = [GpuExecutor(weights, precision, b, self.backend, policy=policy,
                                      fits=fits if len(halves) == 1 else None) for b in halves]
        self.config = weights.config
        self.compute = [stream or self.backend.stream()] + [self.backend.stream() for _ in halves[1:]]
        self.copy = self.backend.stream()
        self.noise = noise
        self.side = None   # device noise draws: beside the steps as graphs, else between them
        if noise == "device":   # (H100, side vs between, s/image: b1 0.0414 / 0.0420, b16 0.00684 / 0.00768)
            self.side = self.backend.stream() if self.graphs else self.compute[0]
        self._dnoise: Optional[DeviceNoise] = None
        self._host_noise: Optional[np.ndarray] = None
        self._graph: Any = None
        self._tables: Any = None
        self.last_stats: dict = {}

    # ---- shared ------------------------------------------------------------------------------------
    @property
    def image_elems(self) -> int:
        c = self.config
        return c.channels * c.image_size * c.image_size

    def _sync(self, event: Any, step: int) -> None:
        try:
            event.synchronize()
        except Exception as e:   # a CUDA error from any earlier launch surfaces here
            raise GpuRunError(f"GPU error at step {step}: {type(e).__name__}: {e}") from None

    @property
    def streams(self) -> List[Any]:
        return self.compute + [self.copy] + ([self.side] if self.side is not None and self.side not in self.compute
                                             else [])

    def close(self) -> None:
        for s in self.streams:
            try:
                s.synchronize()
            except Exception:
                pass
        for ex in self.executors:
            ex.close()
        if self._tables is not None:
            self._tables.free()
            self._tables = None
        if self._dnoise is not None:
            self._dnoise.close()
            self._dnoise = None
        self.executors, self._graph = [], None

    def wait_weights(self) -> None:
        """Block until every executor's early-start weight upload has landed; free its staging."""
        for ex in self.executors:
            ex.wait_weights(ex.stream)
            ex.stream.synchronize()
        self._drop_staging()

    def _drop_staging(self) -> None:
        """The weights' page-locked staging copies, once uploaded, back to the OS: on a Jetson the
        board's DRAM (35 MB an engine in fp16)."""
        if any([ex.drop_staging() for ex in self.executors]):
            self.backend.trim_pinned()

    def prepare(self) -> None:
        """What the first run() would otherwise do before its first step: gpu mode's device tables
        and pinned noise rows (device noise: its generator and the check of this NumPy's stream),
        and the end of the weight upload. The step graph is still captured
        by the first run (after its first step, see _capture)."""
        if not self.executors:
            raise UsageError("this GpuSampler is closed")
        if self.mode == "gpu" and self._tables is None:
            self._prepare_gpu()
        self.wait_weights()

    def run(self, steps: Sequence[Step], seeds: Seeds, callback: Optional[Callback] = None,
            timeline: Optional[Timeline] = None) -> np.ndarray:
        """x_0 as float32 (B, C, H, W); image i from the noise stream of seeds[i] (one seed s: s + i)."""
        return self._sample(steps, seeds, callback, timeline, images=False)

    def images(self, steps: Sequence[Step], seeds: Seeds, callback: Optional[Callback] = None,
               timeline: Optional[Timeline] = None) -> np.ndarray:
        """The images of run() as the spec's uint8 (B, H, W, C) (model.schedule.to_uint8's bytes): in gpu
        mode made on the GPU (kernels/io.cu image_u8), a quarter of the bytes to copy and no host pass."""
        return self._sample(steps, seeds, callback, timeline, images=True)

    def _sample(self, steps: Sequence[Step], seeds: Seeds, callback: Optional[Callback], timeline: Optional[Timeline],
                images: bool) -> np.ndarray:
        seeds = as_seeds(seeds, self.batch)
        if not self.executors:
            raise UsageError("this GpuSampler is closed")
        tl = timeline or Timeline(self.backend, enabled=False)
        tl.start(self.compute[0])
        try:
            with nvtx(self.backend, f"sampling {self.mode} b{self.batch} {len(steps)} steps"):
                if self.mode == "cpu":
                    x0 = self._run_cpu(list(steps), seeds, callback, tl)
                    out = to_uint8(x0) if images else x0
                else:
                    out = self._run_gpu(list(steps), seeds, callback, tl, images=images)
            self._drop_staging()   # the upload landed before the first step could end
            return out
        except BaseException:
            for s in self.streams:   # leave no work in flight on buffers we may free
                try:
                    s.synchronize()
                except Exception:
                    pass
            raise

    # ---- cpu mode -------------------------------------------------------------------------------------
    def _run_cpu(self, steps: List[Step], seeds: List[int], cb: Optional[Callback], tl: Timeline) -> np.ndarray:
        be, exs = self.backend, self.executors
        c = self.config
        noise = NoiseStream(seeds, (self.batch, c.channels, c.image_size, c.image_size))
        xs = np.array_split(noise.draw(), len(exs))
        hs: List[Optional[np.ndarray]] = [None] * len(exs)   # the multistep history of each half
        cut = np.cumsum([ex.batch for ex in exs])[:-1]
        pin_x = [be.pinned((ex.batch, c.image_size, c.image_size, c.channels), np.float32) for ex in exs]
        pin_e = [be.pinned(p.shape, np.float32) for p in pin_x]
        ev_up = [be.event(timing=False) for _ in exs]
        ev_eps = [be.event(timing=False) for _ in exs]
        ev_down = [be.event(timing=False) for _ in exs]
        spans: List[Any] = []

        def launch(h: int, s: int) -> None:   # upload x_h, U-Net step s, download eps_h
            ex = exs[h]
            pin_x[h][...] = nchw_to_nhwc(xs[h])
            be.h2d(ex.x_ptr, pin_x[h], self.copy)
            ev_up[h].record(self.copy)
            be.wait(self.compute[h], ev_up[h])
            e0, e1 = tl.gpu_span(f"compute {h}", f"unet {s}", self.compute[h])
            ex.run(self.compute[h], ex.t_row_ptr(steps[s].t))
            if e1 is not None:
                e1.record(self.compute[h])
                spans.append((e0, e1))
            ev_eps[h].record(self.compute[h])
            be.wait(self.copy, ev_eps[h])
            be.d2h(pin_e[h], ex.eps_ptr, self.copy)
            ev_down[h].record(self.copy)

        for h in range(len(exs)):
            launch(h, 0)
        for s, st in enumerate(steps):
            z = noise.draw() if st.sigma > 0 else None   # drawn while the GPU runs step s
            zs = np.split(z, cut) if z is not None else [None] * len(exs)
            for h in range(len(exs)):
                self._sync(ev_down[h], s)
                t0 = time.perf_counter()
                with nvtx(be, f"p_sample {s}.{h}"):
                    xs[h], hs[h] = p_sample(xs[h], pin_e[h].transpose(0, 3, 1, 2), st, zs[h], hs[h])
                tl.cpu_span(f"p_sample {s}.{h}", t0, time.perf_counter())
                if s + 1 < len(steps):
                    launch(h, s + 1)
            if cb is not None:
                cb(s, len(steps))
        self.last_stats = {"unet_ms": [e0.elapsed_ms(e1) for e0, e1 in spans]} if spans else {}
        return np.concatenate(xs, axis=0)

    # ---- gpu mode -------------------------------------------------------------------------------------
    def _prepare_gpu(self) -> None:
        """Device tables + the step graph; once per sampler (any sampler / step count <= T)."""
        ex, be, T = self.executors[0], self.backend, self.config.timesteps
        n = self.batch * self.image_elems
        offs, total = memory.regions(memory.sampler_tables(self.config, self.batch))   # as the memory report
        self._tables = be.alloc(total)
        o = self._off = {k: self._tables.ptr + off for k, off in offs.items()}
        # n_steps = T, not a run's step count: the graph serves every run
        self._step = StepTables(o["noise"], o["cur"], o["counter"], o["t_of_step"], o["coef"], o["noise_row"], T,
                                o["hist"], T)
        if self.noise == "device":   # one generator per image (the spec's streams), drawing together
            n_img = self.image_elems
            try:
                self._dnoise = DeviceNoise(be, n_img, ex.kernels.module, rows=draw_rows(n_img, T, self.batch),
                                           graphs=self.graphs, images=self.batch)
            except NoiseUnsupported as e:
                log.info("%s; drawing the noise on the host", e)
                self.noise = "host"
            else:
                if not self._dnoise.exact:
                    log.warning("this NumPy's log1pf is neither glibc's nor correctly rounded: device noise "
                                "values beyond |z| = 3.65 (~1e-5 of them) may differ from NumPy's by 1 ulp")
        if self.noise == "host":   # device noise needs them only to redraw a flagged run (HostFeed)
            self._host_noise = be.pinned((self.batch, T, self.image_elems), np.float32)
        self._host_tab = {"coef": be.pinned((T, memory.STEP_COEFS), np.float32), "noise_row": be.pinned((T,), np.int32),
                          "t_of_step": be.pinned((T,), np.int32), "counter": be.pinned((1,), np.int32)}
        c = self.config
        self._host_image = be.pinned((self.batch, c.image_size, c.image_size, c.channels), np.uint8)
        self._image_u8 = ex.kernels.module.get("image_u8")
        self._tables_for: Optional[list] = None   # the steps whose tables are on the device
        self._done = [be.event(timing=False) for _ in range(2)]

    def _capture(self, stream: Any) -> None:
        """The step graph, captured after the first step was enqueued with plain launches: those
        wait per op for the early-start weight upload, which a graph must not capture."""
        ex = self.executors[0]
        ex.wait_weights(stream)
        self.backend.capture_begin(stream)
        ex.run(stream, step=self._step)
        self._graph = self.backend.capture_end(stream)

    def _run_gpu(self, steps: List[Step], seeds: List[int], cb: Optional[Callback], tl: Timeline,
                 noise: Optional[str] = None, images: bool = False) -> np.ndarray:
        if self._tables is None:
            self._prepare_gpu()
        be, ex, s0 = self.backend, self.executors[0], self.compute[0]
        source = noise or self.noise
        tab = self._host_tab
        rows = np.cumsum([st.sigma > 0 for st in steps]) - 1
        key = [(st.t, st.c_x, st.c_eps, st.sigma, st.c_h, st.d_x, st.d_eps) for st in steps]
        if key != self._tables_for:   # the last run's step tables stay valid on the device for the same steps
            tab["coef"][:len(steps)] = [k[1:] for k in key]
            tab["noise_row"][:len(steps)] = [r if st.sigma > 0 else -1 for r, st in zip(rows, steps)]
            tab["t_of_step"][:len(steps)] = [st.t for st in steps]
            for k in ("coef", "noise_row", "t_of_step"):
                be.h2d(self._off[k], tab[k], s0)
            self._tables_for = key
        tab["counter"][0] = -1   # each step's init_conv moves it on and sets t_idx (kernels/io.cu)
        be.h2d(self._off["counter"], tab["counter"], s0)
        done = self._done   # step s records done[s % 2]; the host waits for step s - 1 after enqueuing s
        n_rows = int(rows[-1]) + 1 if len(rows) else 0
        feed = (DeviceFeed if source == "device" else HostFeed)(self, seeds, n_rows, s0)   # x_T goes in first
        try:
            for s, st in enumerate(steps):
                feed.before_step(int(rows[s]) + 1 if st.sigma > 0 else 0, s0)
                if self.graphs and self._graph is None and s >= 1:
                    self._capture(s0)
                e0, e1 = tl.gpu_span("compute 0", f"step {s}", s0)
                with nvtx(be, f"step {s}"):
                    if self._graph is not None:
                        self._graph.launch(s0)
                    else:   # one step: the U-Net, whose first and last kernels advance and take it
                        ex.run(s0, step=self._step)
                if e1 is not None:
                    e1.record(s0)
                done[s % 2].record(s0)
                feed.after_step(int(rows[s]) + 1 if st.sigma > 0 else 0)
                if s >= 1:    # keep at most two steps queued: progress and cancel within one step
                    self._sync(done[(s - 1) % 2], s - 1)
                    if cb is not None:
                        cb(s - 1, len(steps))
        finally:
            feed.halt()
        self._sync(done[(len(steps) - 1) % 2], len(steps) - 1)
        if source == "device":
            flags = self._dnoise.flags(self.side)
            if flags:   # this seed's stream is not certain past the flagged draw: all of it again, on the host
                why = "a libm-dependent comparison too close to call" if flags & FLAG_AMBIGUOUS else "a draw ran short"
                log.warning("device noise flagged %s; sampling seeds %s again with host noise", why, seeds)
                return self._run_gpu(steps, seeds, cb, tl, noise="host", images=images)
        if cb is not None:
            cb(len(steps) - 1, len(steps))
        return self._download(s0, images)

    def _download(self, s0: Any, images: bool) -> np.ndarray:
        """A gpu-mode run's result, after its steps on s0: the uint8 images (kernels/io.cu image_u8,
        (B, H, W, C)) or x_0 as (B, C, H, W) float32. One copy each: the pinned buffers are reused."""
        be, ex = self.backend, self.executors[0]
        if images:
            n = self._host_image.size
            self._image_u8.launch((-(-n // 256), 1, 1), (256, 1, 1), (P(ex.x_ptr), P(self._off["image"]), I(n)), 0, s0)
            be.d2h(self._host_image, self._off["image"], s0)
            s0.synchronize()
            return np.array(self._host_image)
        be.d2h(ex._host_x, ex.x_ptr, s0)
        s0.synchronize()
        return np.array(ex._host_x.transpose(0, 3, 1, 2), order="C")

    def _upload_rows(self, first: int, last: int, s0: Any) -> None:
        """Noise rows [first, last) of every image to the device on the copy stream; s0 waits for them."""
        n, T = self.image_elems, self.config.timesteps
        for i in range(self.batch):   # [B][T][C*H*W]: one contiguous piece per image
            self.backend.h2d(self._off["noise"] + 4 * n * (i * T + first), self._host_noise[i, first:last], self.copy)
        ev = self.backend.event(timing=False)
        ev.record(self.copy)
        self.backend.wait(s0, ev)

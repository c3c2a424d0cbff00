"""What an application embeds: load a model once, sample many times.

    from jetson_unet import Pipeline
    with Pipeline(backend="auto") as pipe:             # the shipped model (or a path, or loaded Weights)
        pipe.load(batch=[1, 4])                        # optional: pay the GPU start-up now (at boot)
        images = pipe.sample(batch=4, seed=1)          # (4, 64, 64, 3) uint8
        three = pipe.sample(batch=3, seed=9)           # on the batch-4 engine, one row padded
        many = pipe.sample(batch=9, seed=9)            # the loaded engines' calls of least time

`sample` calls on one Pipeline from several threads are serialized by a lock (each call runs to
completion in turn; results never mix). A callback `cb(step, n_steps)` sees progress and may raise
`jetson_unet.errors.Cancelled` to stop within one step.

Every argument is checked here, at the API's edge, before any work: a wrong type or range raises
jetson_unet.errors.UsageError with one line naming the parameter (the CLIs' exit code 2). On the
NumPy backend a batch that does not fit the host's available memory is refused (ArenaError, with the
largest batch that fits), as the GPU path refuses one that does not fit the device. A CUDA error or
an out-of-memory while sampling on the GPU frees the engines and raises one GpuRunError line.

Engines (GPU): one per batch size that load() named, kept (several: timed); a sample() of n images runs as
the calls of those engines that take the least time together (jetson_unet.sampling.engines), each
call on the smallest engine that holds its images, its missing rows padded (each image depends on
its own seed only, so the rows returned are the images of their seeds). Without load(), a sample()
builds an engine of its own batch size, kept until a sample() of another size replaces it.
"""
from __future__ import annotations

import gc
import logging
import math
import os
import reprlib
import threading
from pathlib import Path
from collections.abc import Iterable
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from jetson_unet.errors import BackendUnavailable, UsageError
from jetson_unet.ops.noise import NOISE_SOURCES
from jetson_unet.ops.policy import KernelPolicy
from jetson_unet.model.schedule import DEFAULT_SAMPLER, SAMPLERS, check_seeds, make_steps, sample_loop, to_uint8
from jetson_unet.model.weights import Weights, load_weights
from jetson_unet.sampling.engines import WARM_STEPS, Costs, split_batch, time_engine

log = logging.getLogger(__name__)
BACKEND_CHOICES = ("auto", "numpy", "cupy", "pycuda")
GPU_BACKENDS = ("cupy", "pycuda")   # auto tries them in this order
PRECISIONS = ("auto", "fp32", "fp16", "bf16", "fp64")
NUMPY_PRECISIONS = {"fp32": np.float32, "fp64": np.float64}
GPU_PRECISIONS = ("fp32", "fp16", "bf16")
DEFAULT_MODEL = "seed-unet-emoji64.safetensors"
MODES = ("auto", "gpu", "cpu")
DEFAULT_GPU_MODE = "gpu"     # chosen by measurement: see the README's performance section
NOISE_CHOICES = ("auto",) + NOISE_SOURCES
DEFAULT_NOISE = "auto"       # device on CuPy in gpu mode, else host: chosen by measurement (README, performance)

Callback = Callable[[int, int], None]


# ---- the checks at the API's edge (ranges of steps, eta and seeds: jetson_unet.model.schedule's) --------
def _show(value: Any) -> str:
    """A value as an error line shows it: its repr, shortened (a 400-digit int, a long list)."""
    return reprlib.repr(value)


def _choice(value: Any, choices: Sequence[str], what: str) -> str:
    if not isinstance(value, str) or value not in choices:
        raise UsageError(f"unknown {what} {_show(value)} (choose from {', '.join(choices)})")
    return value


def _integer(name: str, value: Any, low: Optional[int] = None) -> int:
    """An int or NumPy integer (not a bool), >= low."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise UsageError(f"{name} must be an integer, got {_show(value)}")
    if low is not None and value < low:
        raise UsageError(f"{name} must be >= {low}, got {_show(value)}")
    return int(value)


def _real(name: str, value: Any) -> float:
    """A finite int or float (not a bool)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise UsageError(f"{name} must be a number, got {_show(value)}")
    try:
        x = float(value)
    except OverflowError:
        x = math.inf
    if not math.isfinite(x):
        raise UsageError(f"{name} must be a finite number, got {_show(value)}")
    return x


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise UsageError(f"{name} must be True or False, got {_show(value)}")
    return bool(value)


def _seeds(seed: Any, seeds: Any, batch: Any) -> Tuple[int, Union[int, List[int]]]:
    """(batch, seed or seeds) of a sample() call: one seed s stays an int (images s .. s + batch - 1,
    drawn lazily), a list is checked whole (check_seeds)."""
    if seeds is None:
        batch = _integer("batch", 1 if batch is None else batch, 1)
        seed = _integer("seed", seed)
        try:   # the first and the last image's seed: the rest lie between
            check_seeds([seed, seed + batch - 1], 2)
        except UsageError as e:
            raise UsageError(f"seed {seed} (batch {batch}): {e}") from None
        return batch, seed
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Iterable):
        raise UsageError(f"seeds must be a sequence of integers, got {_show(seeds)}")
    seeds = list(seeds)
    if batch is not None:
        batch = _integer("batch", batch, 1)
    seeds = check_seeds(seeds, len(seeds) if batch is None else batch)
    if not seeds:
        raise UsageError("seeds must name at least one image")
    return len(seeds), seeds


def _batch_sizes(batch: Any) -> Tuple[int, ...]:
    """load()'s batch: one size or a sequence of them, as a sorted tuple without repeats."""
    if isinstance(batch, (str, bytes)) or not isinstance(batch, Iterable):
        return (_integer("batch", batch, 1),)
    sizes = sorted({_integer("batch", b, 1) for b in batch})
    if not sizes:
        raise UsageError("batch must name at least one batch size")
    return tuple(sizes)


def default_weights_path() -> Path:
    """The shipped model (package data `jetson_unet.models`, i.e. the repo's weights/ folder)."""
    from jetson_unet.paths import models_dir
    return models_dir() / DEFAULT_MODEL


class Pipeline:
    def __init__(self, weights: Union[str, Path, Weights, None] = None, backend: str = "auto",
                 precision: str = "auto", mode: str = "auto", graphs: bool = True,
                 noise: str = DEFAULT_NOISE, policy: KernelPolicy = KernelPolicy(),
                 sms: Optional[int] = None) -> None:
        """weights: a path (default: the shipped model) or loaded Weights; backend: auto, numpy, cupy,
        pycuda; precision: auto (fp16 on a GPU, fp32 on the CPU), fp32, fp16, bf16, fp64 (numpy);
        mode: gpu (the sampler step in the U-Net's last kernel, CUDA-graph steps) or cpu (p_sample on
        the CPU, overlapped); noise: where the seed's noise stream is drawn on a GPU (auto, host,
        device); policy: how the GPU kernels are picked (jetson_unet.ops.policy.KernelPolicy); sms: run
        on a slice of that many SMs (a CUDA green context, CuPy only: jetson_unet.backends.greenctx),
        with the tiles for that SM count."""
        if weights is not None and not isinstance(weights, (str, os.PathLike, Weights)):
            raise UsageError(f"weights must be a path, a loaded Weights or None (the shipped model), got {_show(weights)}")
        self.mode = DEFAULT_GPU_MODE if _choice(mode, MODES, "mode") == "auto" else mode
        self.graphs = _flag("graphs", graphs)
        _choice(noise, NOISE_CHOICES, "noise source")
        if not isinstance(policy, KernelPolicy):
            raise UsageError(f"policy must be a jetson_unet.ops.policy.KernelPolicy, got {_show(policy)}")
        _choice(backend, BACKEND_CHOICES, "backend")
        _choice(precision, PRECISIONS, "precision")
        if noise == "device" and (self.mode != "gpu" or backend == "numpy"):
            raise UsageError("device noise goes with a GPU backend in gpu mode")
        self.noise, self.policy = noise, policy
        self.sms = None if sms is None else _integer("sms", sms, 1)
        if self.sms is not None and (backend not in ("auto", "cupy") or precision == "fp64"):
            raise UsageError(f"an SM slice (sms) needs the cupy backend, not {backend} {precision}")
        if backend == "numpy" and precision in ("fp16", "bf16"):
            raise UsageError(f"the numpy backend computes in fp32 or fp64, not {precision}")
        if backend in GPU_BACKENDS and precision == "fp64":
            raise UsageError("the GPU backend computes in fp32, fp16 or bf16, not fp64")
        self.weights = weights if isinstance(weights, Weights) else load_weights(weights or default_weights_path())
        self.config = self.weights.config
        self._lock = threading.Lock()
        self._engine: Any = None     # the NumPy reference (numpy backend)
        self._engines: Dict[int, Any] = {}   # batch size -> GpuSampler
        self._sizes: Tuple[int, ...] = ()    # the batch sizes load() named: their engines are kept
        self._costs: Costs = {}              # and their times (sampling.engines.time_engine)
        self._stream: Any = None   # one compute stream for every GpuSampler of this Pipeline
        self._closed = False
        self.backend, self.precision = self._open_engine(backend, precision)
        if self.noise == "auto":   # the same stream either way; the GPU draws it faster (at batch 16, 2.5x per image)
            self.noise = "device" if self.backend == "cupy" and self.mode == "gpu" else "host"

    def _open_engine(self, backend: str, precision: str):
        if backend != "numpy" and precision != "fp64":
            from jetson_unet.backends import get_backend
            reasons = []
            names = (backend,) if backend != "auto" else ("cupy",) if self.sms else GPU_BACKENDS
            for name in names:
                try:
                    be = get_backend(name, self.sms)
                    if self.sms is not None:
                        log.info("SM slice: %s", be.slice.describe())
                    self._gpu_precision = "fp16" if precision == "auto" else precision
                    return name, self._gpu_precision
                except (BackendUnavailable, ImportError) as e:
                    if backend != "auto" or self.sms is not None:
                        raise BackendUnavailable(str(e)) from None
                    reasons.append(f"{name}: {e}")
            log.debug("GPU backends not usable: %s", "; ".join(reasons))
            log.warning("no usable GPU: using the NumPy reference backend (-v says why)")
        if precision in ("fp16", "bf16"):
            raise UsageError(f"the numpy backend computes in fp32 or fp64, not {precision}")
        from jetson_unet.model.reference import Reference
        np_precision = "fp32" if precision == "auto" else precision
        self._engine = Reference(self.weights, NUMPY_PRECISIONS[np_precision])
        return "numpy", np_precision

    @property
    def loaded(self) -> Tuple[int, ...]:
        """The batch sizes with a GPU engine built, ascending (empty on numpy)."""
        return tuple(sorted(self._engines))

    @property
    def engine_costs(self) -> Costs:
        """Each loaded engine's (seconds per step, seconds per call beside), as load() timed them
        (when it loaded more than one)."""
        return dict(self._costs)

    def _engine_batch(self, batch: int) -> int:
        """The engine a batch runs on: the smallest loaded size that holds it, else its own."""
        return next((size for size in self._sizes if size >= batch), batch)

    def _gpu_sampler(self, batch: int):
        """The GpuSampler of this batch size, built if need be (its arena, graph and tables are
        reused); building one drops the engine of any size load() did not name."""
        engine = self._engines.get(batch)
        if engine is None:
            self._drop_engines(keep=self._sizes)
            from jetson_unet.backends import get_backend
            from jetson_unet.sampling.gpu import GpuSampler
            be = get_backend(self.backend, self.sms)
            if self._stream is None:   # kept across batch sizes (GpuSampler's stream argument says why)
                self._stream = be.stream()
            engine = self._engines[batch] = GpuSampler(
                self.weights, self._gpu_precision, batch, self.mode, self.graphs, backend=be, noise=self.noise,
                stream=self._stream, policy=self.policy)
        return engine

    def _gpu_images(self, batch: int, seeds: Union[int, List[int]], plan: Any, callback: Optional[Callback],
                    timeline: Any) -> np.ndarray:
        """sample() on the GPU: the calls split_batch picks over the loaded engines (else one call),
        each on the engine of _engine_batch, its missing rows padded with its last seed; the callback
        counts the steps of all the calls."""
        listed = list(range(seeds, seeds + batch)) if isinstance(seeds, int) else list(seeds)
        costs = self._costs or {size: (1.0, 0.0) for size in self._sizes}   # one engine: as many calls as it takes
        calls = split_batch(batch, len(plan), costs) if costs else [batch]
        total, out, start = len(calls) * len(plan), [], 0
        for k, size in enumerate(calls):
            part, start = listed[start:start + size], start + size
            engine = self._engine_batch(len(part))
            log.debug("%d image(s) on the batch-%d engine", len(part), engine)
            cb = None if callback is None else (lambda i, n, done=k * len(plan): callback(done + i, total))
            images = self._gpu_sampler(engine).images(plan, part + [part[-1]] * (engine - len(part)), cb, timeline)
            out.append(images[:len(part)])
        return out[0] if len(out) == 1 else np.concatenate(out)

    def _drop_engines(self, keep: Sequence[int] = ()) -> None:
        """Close the GPU engines but those of the sizes in `keep` (after a CUDA error its streams may
        not sync: what can be freed is)."""
        for size in [b for b in self._engines if b not in keep]:
            engine = self._engines.pop(size)
            try:
                engine.close()
            except Exception as e:   # a CUDA error left by the failure itself
                log.debug("closing the GPU engine: %s: %s", type(e).__name__, e)

    def _on_gpu(self, doing: str, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on the GPU engines. A CUDA error or an out-of-memory (and a GpuRunError) frees the
        engines, and what the failed call had built, and raises one GpuRunError line; the next call
        builds the engine it needs anew."""
        from jetson_unet.sampling.gpu import GpuRunError, device_error
        try:
            return fn(*args)
        except GpuRunError:
            self._drop_engines()
            raise
        except Exception as e:
            err = device_error(e, doing)
            if err is None:
                raise
        # raised out here, with no context: the failed call's frames (a half-built executor's
        # buffers) go with the original exception, now
        self._drop_engines()
        gc.collect()
        raise err

    def load(self, batch: Union[int, Sequence[int]] = 1) -> "Pipeline":
        """Pay the start-up now rather than in the first sample(): on a GPU, build the engine of each
        batch size named (kernel modules loaded from the shipped cubins or the cubin cache, or
        compiled; arena and weights allocated; weights uploaded and waited for; gpu mode's step
        tables), so that a later sample() starts its first step at once; of several sizes, run each
        once (its step graph captured) and time it (sampling.engines.time_engine). The engines are
        kept; those of an earlier load() that this one does not name are freed. A sample() of n
        images runs as the loaded engines' calls of least time (load([1, 4, 16]): a lone image on the
        batch-1 engine, 3 on the batch-4 one, padded; on an Orin 8 as two batch-4 calls). On numpy
        there is nothing to build, only the host-memory check of the largest size. Returns self
        (`pipe = Pipeline().load(4)`)."""
        sizes = _batch_sizes(batch)
        with self._lock:
            self._check_open()
            if self.backend == "numpy":
                self._check_host(sizes[-1])
                return self
            self._sizes, self._costs = sizes, {}
            self._drop_engines(keep=sizes)
            try:
                for size in sizes:
                    self._on_gpu("loading", lambda size=size: self._gpu_sampler(size).prepare())
                if len(sizes) > 1:   # what the split weighs
                    self._costs = {size: self._on_gpu("timing", lambda size=size: self._time(size)) for size in sizes}
            finally:   # a size that failed (did not fit, a GPU error) is not kept
                self._sizes = tuple(size for size in sizes if size in self._engines)
        return self

    def _time(self, size: int) -> Tuple[float, float]:
        """Run the engine of `size` once (its step graph captured), then time it."""
        engine = self._gpu_sampler(size)

        def run(n: int) -> None:
            engine.images(make_steps(self.config.schedule, "ddim", n), [0] * size)
        run(WARM_STEPS)
        return time_engine(run)

    def sample(self, batch: Optional[int] = None, steps: Optional[int] = None,
               sampler: str = DEFAULT_SAMPLER, eta: float = 0.0, seed: int = 0, callback: Optional[Callback] = None,
               timeline: Any = None, seeds: Optional[Sequence[int]] = None) -> np.ndarray:
        """Generate images; returns uint8 (B, H, W, C). One noise stream per image: image i of a call
        with `seed` s draws from PCG64(s + i), or from `seeds[i]` (then the batch is len(seeds)), so
        an image depends on its own seed only, whatever the batch and its place in it. steps: None
        is the sampler's default (DDPM and DDIM: all T; dpmpp-2m: DPMPP_STEPS)."""
        batch, image_seeds = _seeds(seed, seeds, batch)
        if steps is not None:
            steps = _integer("steps", steps)
        if not isinstance(sampler, str):
            raise UsageError(f"sampler must be a string (one of {', '.join(SAMPLERS)}), got {_show(sampler)}")
        if callback is not None and not callable(callback):
            raise UsageError(f"callback must be callable as callback(step, n_steps), got {_show(callback)}")
        plan = make_steps(self.config.schedule, sampler, steps, _real("eta", eta))
        c = self.config
        shape = (batch, c.channels, c.image_size, c.image_size)
        with self._lock:
            self._check_open()
            if self.backend == "numpy":
                self._check_host(batch)
                return to_uint8(sample_loop(self._engine.eps, shape, plan, image_seeds, callback))
            return self._on_gpu("sampling", lambda: self._gpu_images(batch, image_seeds, plan, callback, timeline))

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("this Pipeline is closed")

    def _check_host(self, batch: int) -> None:
        from jetson_unet.sampling.host import check_host_fits
        check_host_fits(self.weights, self._engine.dtype, batch)

    def close(self) -> None:
        """Free what the pipeline holds on the GPU; safe to call twice."""
        with self._lock:
            self._drop_engines()
            self._engine = self._stream = None
            self._sizes, self._costs = (), {}
            self._closed = True

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

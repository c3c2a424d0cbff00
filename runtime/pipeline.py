"""What an application embeds: load a model once, sample many times.

    from jetson_unet.pipeline import Pipeline
    with Pipeline("weights/seed-unet-emoji64.npz", backend="auto") as pipe:
        pipe.load(batch=4)                             # optional: pay the GPU start-up now (at boot)
        images = pipe.sample(batch=4, seed=1)          # (4, 64, 64, 3) uint8

`sample` calls on one Pipeline from several threads are serialized by a lock (each call runs to
completion in turn; results never mix). A callback `cb(step, n_steps)` sees progress and may raise
`jetson_unet.errors.Cancelled` to stop within one step.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from jetson_unet.errors import BackendUnavailable, UsageError
from jetson_unet.ops.noise import NOISE_SOURCES
from jetson_unet.ops.policy import KernelPolicy
from jetson_unet.model.schedule import (DEFAULT_SAMPLER, check_seeds, image_seeds, make_steps,
                                        sample_loop, to_uint8)
from jetson_unet.model.weights import Weights, load_weights

log = logging.getLogger(__name__)
BACKEND_CHOICES = ("auto", "numpy", "cupy", "pycuda")
GPU_BACKENDS = ("cupy", "pycuda")   # auto tries them in this order
PRECISIONS = ("auto", "fp32", "fp16", "bf16", "fp64")
NUMPY_PRECISIONS = {"fp32": np.float32, "fp64": np.float64}
GPU_PRECISIONS = ("fp32", "fp16", "bf16")
DEFAULT_MODEL = "seed-unet-emoji64.npz"
MODES = ("auto", "gpu", "cpu")
DEFAULT_GPU_MODE = "gpu"     # chosen by measurement: see the README's performance section
NOISE_CHOICES = ("auto",) + NOISE_SOURCES
DEFAULT_NOISE = "auto"       # device on CuPy in gpu mode, else host: chosen by measurement (README, performance)

Callback = Callable[[int, int], None]


def default_weights_path() -> Path:
    """The shipped model (package data `jetson_unet.models`, i.e. the repo's weights/ folder)."""
    from jetson_unet.paths import models_dir
    return models_dir() / DEFAULT_MODEL


class Pipeline:
    def __init__(self, weights: Union[str, Path, Weights, None] = None, backend: str = "auto",
                 precision: str = "auto", mode: str = "auto", graphs: bool = True,
                 noise: str = DEFAULT_NOISE, policy: KernelPolicy = KernelPolicy()) -> None:
        """weights: a path (default: the shipped model) or loaded Weights; backend: auto, numpy, cupy,
        pycuda; precision: auto (fp16 on a GPU, fp32 on the CPU), fp32, fp16, bf16, fp64 (numpy);
        mode: gpu (the sampler step in the U-Net's last kernel, CUDA-graph steps) or cpu (p_sample on
        the CPU, overlapped); noise: where the seed's noise stream is drawn on a GPU (auto, host,
        device); policy: how the GPU kernels are picked (jetson_unet.ops.policy.KernelPolicy)."""
        if mode not in MODES:
            raise UsageError(f"unknown mode {mode!r} (choose from {', '.join(MODES)})")
        self.mode = DEFAULT_GPU_MODE if mode == "auto" else mode
        self.graphs = bool(graphs)
        if noise not in NOISE_CHOICES:
            raise UsageError(f"unknown noise source {noise!r} (choose from {', '.join(NOISE_CHOICES)})")
        if noise == "device" and (self.mode != "gpu" or backend == "numpy"):
            raise UsageError("device noise goes with a GPU backend in gpu mode")
        self.noise, self.policy = noise, policy
        if backend not in BACKEND_CHOICES:
            raise UsageError(f"unknown backend {backend!r} (choose from {', '.join(BACKEND_CHOICES)})")
        if precision not in PRECISIONS:
            raise UsageError(f"unknown precision {precision!r} (choose from {', '.join(PRECISIONS)})")
        if backend == "numpy" and precision in ("fp16", "bf16"):
            raise UsageError(f"the numpy backend computes in fp32 or fp64, not {precision}")
        if backend in GPU_BACKENDS and precision == "fp64":
            raise UsageError("the GPU backend computes in fp32, fp16 or bf16, not fp64")
        self.weights = weights if isinstance(weights, Weights) else load_weights(weights or default_weights_path())
        self.config = self.weights.config
        self._lock = threading.Lock()
        self._engine: Any = None
        self._stream: Any = None   # one compute stream for every GpuSampler of this Pipeline
        self._closed = False
        self.backend, self.precision = self._open_engine(backend, precision)
        if self.noise == "auto":   # the same stream either way; the GPU draws it faster (at batch 16, 2.5x per image)
            self.noise = "device" if self.backend == "cupy" and self.mode == "gpu" else "host"

    def _open_engine(self, backend: str, precision: str):
        if backend != "numpy" and precision != "fp64":
            from jetson_unet.backends import get_backend
            reasons = []
            for name in (GPU_BACKENDS if backend == "auto" else (backend,)):
                try:
                    get_backend(name)
                    self._gpu_precision = "fp16" if precision == "auto" else precision
                    return name, self._gpu_precision
                except (BackendUnavailable, ImportError) as e:
                    if backend != "auto":
                        raise BackendUnavailable(str(e)) from None
                    reasons.append(f"{name}: {e}")
            log.warning("no usable GPU (%s); using the NumPy reference backend", "; ".join(reasons))
        if precision in ("fp16", "bf16"):
            raise UsageError(f"the numpy backend computes in fp32 or fp64, not {precision}")
        from jetson_unet.model.reference import Reference
        np_precision = "fp32" if precision == "auto" else precision
        self._engine = Reference(self.weights, NUMPY_PRECISIONS[np_precision])
        return "numpy", np_precision

    def _gpu_sampler(self, batch: int):
        """One GpuSampler kept per batch size (its arena, graph and tables are reused)."""
        if self._engine is None or self._engine.batch != batch:
            if self._engine is not None:
                self._engine.close()
                self._engine = None
            from jetson_unet.backends import get_backend
            from jetson_unet.sampling.gpu import GpuSampler
            be = get_backend(self.backend)
            if self._stream is None:   # kept across batch sizes (GpuSampler's stream argument says why)
                self._stream = be.stream()
            self._engine = GpuSampler(self.weights, self._gpu_precision, batch, self.mode, self.graphs,
                                      backend=be, noise=self.noise, stream=self._stream,
                                      policy=self.policy)
        return self._engine

    def load(self, batch: int = 1) -> "Pipeline":
        """Pay the start-up now rather than in the first sample(): on a GPU, build the engine for
        `batch` (kernel modules loaded from the cubin cache, or compiled; arena and weights
        allocated; weights uploaded and waited for; gpu mode's step tables), so that a later
        sample() of this batch size starts its first step at once. On numpy there is nothing to
        build. One engine is kept: a sample() of another batch size builds that one instead.
        Returns self (`pipe = Pipeline(path).load(4)`)."""
        if batch < 1:
            raise UsageError(f"batch must be >= 1, got {batch}")
        with self._lock:
            if self._closed:
                raise UsageError("this Pipeline is closed")
            if self.backend != "numpy":
                self._gpu_sampler(batch).prepare()
        return self

    def sample(self, batch: Optional[int] = None, steps: Optional[int] = None,
               sampler: str = DEFAULT_SAMPLER, eta: float = 0.0, seed: int = 0, callback: Optional[Callback] = None,
               timeline: Any = None, seeds: Optional[Sequence[int]] = None) -> np.ndarray:
        """Generate images; returns uint8 (B, H, W, C). One noise stream per image: image i of a call
        with `seed` s draws from PCG64(s + i), or from `seeds[i]` (then the batch is len(seeds)), so
        an image depends on its own seed only, whatever the batch and its place in it. steps: None
        is the sampler's default (DDPM and DDIM: all T; dpmpp-2m: DPMPP_STEPS)."""
        if seeds is None:
            batch = 1 if batch is None else batch
            if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
                raise UsageError(f"batch must be an integer >= 1, got {batch!r}")
            seeds = image_seeds(seed, int(batch))
        else:
            seeds = check_seeds(seeds, len(seeds) if batch is None else batch)
            batch = len(seeds)
            if batch < 1:
                raise UsageError("seeds must name at least one image")
        plan = make_steps(self.config.schedule, sampler, steps, eta)
        c = self.config
        shape = (batch, c.channels, c.image_size, c.image_size)
        with self._lock:
            if self._closed:
                raise UsageError("this Pipeline is closed")
            if self.backend == "numpy":
                x0 = sample_loop(self._engine.eps, shape, plan, seeds, callback)
            else:
                x0 = self._gpu_sampler(batch).run(plan, seeds, callback, timeline)
        return to_uint8(x0)

    def close(self) -> None:
        """Free what the pipeline holds on the GPU; safe to call twice."""
        with self._lock:
            if self._engine is not None and hasattr(self._engine, "close"):
                self._engine.close()
            self._engine = self._stream = None
            self._closed = True

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

"""PyTorch peers of the runtime on the same weights, noise and device (the `train` extra: torch).

    fn, dtype = torch_model(weights, "fp16", "reduce-overhead")      # eager when compile_mode is None
    eps, st = peer_call(weights, x, t, "fp16", None, warmup=10, iters=100, repeats=5)
    x0, st = peer_sampling(weights, steps, batch=1, seed=0, repeat=3, precision="fp16")

The sampling loop runs the same affine step (jetson_unet.model.schedule) on the device, with every noise
array drawn from the runtime's NoiseStream and uploaded before the clock starts (which favours
the peer). torch.compile's compilation and CUDA-graph recording happen in the warm-up calls and
are reported apart (warmup_s). Used by tools.bench_unet, tools.bench_sampling and tools.bench_peers.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from jetson_unet.bench.timing import settle
from jetson_unet.model.schedule import NoiseStream, Step

PRECISIONS = ("fp32", "fp16")
COMPILE_MODES = (None, "default", "reduce-overhead")
# nchw: PyTorch's defaults (what a user gets); nhwc: channels_last activations and weights with
# cudnn.benchmark on (what a user tuning the peer would add)
LAYOUTS = ("nchw", "nhwc")
# (name, precision, torch.compile mode or None for eager, layout): the peers bench_peers.py runs
PEERS = (("torch eager fp32", "fp32", None, "nchw"), ("torch eager fp16", "fp16", None, "nchw"),
         ("torch.compile fp16", "fp16", "default", "nchw"), ("torch.compile ro fp16", "fp16", "reduce-overhead", "nchw"),
         ("torch.compile ro fp16 NHWC", "fp16", "reduce-overhead", "nhwc"))


def strict_fp32() -> None:
    """fp32 peers compute in IEEE fp32: PyTorch's default lets cuDNN convolutions use TF32."""
    import torch
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def torch_model(weights: Any, precision: str = "fp16", compile_mode: Optional[str] = None,
                device: str = "cuda", layout: str = "nchw") -> Tuple[Any, Any]:
    """(callable model(x, t), its dtype): the twin with our weights, eager or torch.compile'd; with
    layout "nhwc" on channels_last tensors (its NCHW input converted inside the model) and
    cudnn.benchmark on, for the process (each peer runs in a process of its own)."""
    import torch
    from tools.torch_unet import SeedUNet, load_numpy_params
    if precision not in PRECISIONS or compile_mode not in COMPILE_MODES or layout not in LAYOUTS:
        raise ValueError(f"peer precision {precision!r} / compile mode {compile_mode!r} / layout {layout!r} unsupported")
    model = SeedUNet(weights.config)
    load_numpy_params(model, {k: v.astype(np.float32) for k, v in weights.params.items()})
    dtype = torch.float16 if precision == "fp16" else torch.float32
    model = model.to(device).to(dtype).eval()
    if layout == "nhwc":
        torch.backends.cudnn.benchmark = True

        class ChannelsLast(torch.nn.Module):
            def __init__(self, inner: Any) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, x: Any, t: Any) -> Any:
                return self.inner(x.contiguous(memory_format=torch.channels_last), t)

        model = ChannelsLast(model.to(memory_format=torch.channels_last)).eval()
    if compile_mode is None:
        return model, dtype
    # dynamic=False: kernels for this batch size only. By default a second batch size in one process
    # recompiles for symbolic shapes: batch 16 after batch 1 took 3.09 ms per call on an H100 against
    # 1.95 compiled for 16 alone (docs/performance.md, Method).
    return torch.compile(model, mode=None if compile_mode == "default" else compile_mode, dynamic=False), dtype


# Seconds of back-to-back work (jetson_unet.bench.timing.settle) before any timed window, for every
# implementation alike: on an H100 our batch-1 U-Net graph took 415 us per call in the first 0.1 s
# of load and settled at 401 us after ~0.4 s (batch 16: 1121 -> 1092 us after ~0.3 s), with NVML's
# SM and memory clocks unchanged throughout (docs/performance.md, Method); 20 warm-up calls (8 ms)
# did not reach that.
SETTLE_S = 2.0


_GREEN: List[Any] = []   # a green context lives as long as its Python object


def torch_slice(sms: Optional[int]) -> int:
    """Confine this process's torch work (and the Triton kernels it launches) to a green context of
    `sms` SMs, made current before any model or stream is built; None: the whole GPU. Returns the
    SM count the work runs on."""
    import torch
    if sms is not None:
        ctx = torch.cuda.green_contexts.GreenContext.create(num_sms=sms, device_id=0)
        ctx.set_context()
        _GREEN.append(ctx)
        return sms
    return torch.cuda.get_device_properties(0).multi_processor_count


def in_fresh_process(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) in a new Python process (spawned: none of this process's CUDA state), its result
    back; fn must be a module-level function. On an H100 a process where a few plain kernel
    launches went to a second stream runs every later kernel launch ~0.2 us slower for good, CUDA
    graphs included (docs/performance.md, Method), so every benchmark row, ours and the peers', is
    measured in a process of its own, as `jetson-sample` runs one configuration."""
    import concurrent.futures
    import multiprocessing
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def _sync(device: str) -> None:
    import torch
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _window_ms(fn: Any, iters: int, device: str) -> float:
    """Mean ms per call over `iters` back-to-back calls: CUDA events on a GPU, else perf_counter."""
    import torch
    if str(device).startswith("cuda"):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(iters):
            fn()
        e1.record()
        e1.synchronize()
        return e0.elapsed_time(e1) / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) * 1e3 / iters


def peer_call(weights: Any, x: np.ndarray, t: np.ndarray, precision: str, compile_mode: Optional[str],
              warmup: int, iters: int, repeats: int, device: str = "cuda",
              model: Optional[Tuple[Any, Any]] = None) -> Tuple[np.ndarray, Dict[str, float]]:
    """One U-Net call: eps (float32 NCHW) and the median over `repeats` windows of the ms per call.
    `model`: a torch_model() result to reuse (a compiled one is then not compiled again)."""
    import torch
    fn, dtype = model or torch_model(weights, precision, compile_mode, device)
    xd = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(device).to(dtype)
    td = torch.from_numpy(np.asarray(t, dtype=np.int64)).to(device)
    with torch.inference_mode():
        t0 = time.perf_counter()
        for _ in range(max(warmup, 3 if compile_mode else 1)):   # compile + graph recording happen here
            fn(xd, td)
        _sync(device)
        warm_s = time.perf_counter() - t0
        settle(lambda: fn(xd, td), lambda: _sync(device), SETTLE_S, every=50)
        per = [_window_ms(lambda: fn(xd, td), iters, device) for _ in range(repeats)]
        eps = fn(xd, td).float().cpu().numpy()
    return eps, {"call_ms": statistics.median(per), "warmup_s": warm_s}


def peer_sampling(weights: Any, steps: Sequence[Step], batch: int, seed: int, repeat: int,
                  precision: str = "fp16", compile_mode: Optional[str] = None, device: str = "cuda",
                  model: Optional[Tuple[Any, Any]] = None) -> Tuple[np.ndarray, Dict[str, float]]:
    """The whole loop: x_0 (float32 NCHW) and the median wall time of `repeat` runs after warm-up."""
    import torch
    fn, dtype = model or torch_model(weights, precision, compile_mode, device)
    cfg = weights.config
    noise = NoiseStream(seed, (batch, cfg.channels, cfg.image_size, cfg.image_size))
    x_t = torch.from_numpy(noise.draw()).to(device)
    zs = [torch.from_numpy(z).to(device) if z is not None else None for z in noise.for_steps(list(steps))]
    ts = [torch.full((batch,), st.t, dtype=torch.long, device=device) for st in steps]

    def loop() -> Any:
        x = x_t.clone()
        with torch.inference_mode():
            for st, z, t in zip(steps, zs, ts):
                eps = fn(x.to(dtype), t).float()
                x = st.c_x * x + st.c_eps * eps
                if z is not None:
                    x = x + st.sigma * z
        _sync(device)
        return x

    t0 = time.perf_counter()
    for _ in range(2 if compile_mode else 1):   # compile + graph recording happen in the warm-ups
        loop()
    warm_s = time.perf_counter() - t0
    settle(loop, lambda: None, SETTLE_S)
    walls: List[float] = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        x = loop()
        walls.append(time.perf_counter() - t0)
    wall = statistics.median(walls)
    return x.cpu().numpy(), {"wall_s": wall, "s_per_image": wall / batch, "images_per_s": batch / wall,
                             "warmup_s": warm_s}


def time_torch(weights: Any, steps: Sequence[Step], batch: int, seed: int, compiled: bool,
               repeat: int) -> Tuple[np.ndarray, Dict[str, float]]:
    """tools.bench_sampling's peers: fp16 eager, or fp16 torch.compile(mode="reduce-overhead")."""
    x0, st = peer_sampling(weights, steps, batch, seed, repeat, "fp16", "reduce-overhead" if compiled else None)
    return x0, {k: st[k] for k in ("wall_s", "s_per_image", "images_per_s")}

"""GPU timing helpers shared by the tuner (`jetson-tune`) and the lab's benchmarks (tools/bench_unet.py):
the model a benchmark runs (`bench_weights`), a median over event-timed windows of back-to-back calls
(`timed`), and each launch of a call timed alone as a graph of repeated launches (`per_op_times`).
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, List, Optional, Set, Tuple

from jetson_unet.model.config import UNetConfig
from jetson_unet.model.weights import load_weights, random_params
from jetson_unet.paths import models_dir

SHIPPED_MODEL = "seed-unet-emoji64.safetensors"


class RandomWeights:
    """Random weights of a config, in the shape of jetson_unet.model.weights.Weights (config, params)."""

    def __init__(self, cfg: UNetConfig, seed: int = 0) -> None:
        self.config, self.params = cfg, random_params(cfg, seed)


def bench_weights() -> Tuple[Any, str]:
    """The shipped model when present, else random weights of the default config: (weights, label)."""
    path = models_dir() / SHIPPED_MODEL
    return (load_weights(path), "shipped") if path.is_file() else (RandomWeights(UNetConfig()), "random")


def settle(fn: Callable[[], Any], sync: Callable[[], Any], seconds: float, every: int = 1) -> int:
    """Call fn back to back until `seconds` have passed (checked after every `every` calls, each
    check synchronizing), at least `every` times; returns the number of calls."""
    t0, n = time.perf_counter(), 0
    while True:
        for _ in range(every):
            fn()
        n += every
        sync()
        if time.perf_counter() - t0 >= seconds:
            return n


def timed(backend: Any, stream: Any, fn: Callable[[], Any], warmup: int, iters: int, repeats: int,
          settle_s: float = 0.0) -> float:
    """Median over `repeats` of (event time of `iters` calls) / iters, in ms, after `warmup` calls
    and then calls until `settle_s` seconds of load have passed."""
    for _ in range(warmup):
        fn()
    stream.synchronize()
    if settle_s > 0:
        settle(fn, stream.synchronize, settle_s, every=50)
    per = []
    for _ in range(repeats):
        e0, e1 = backend.event(), backend.event()
        e0.record(stream)
        for _ in range(iters):
            fn()
        e1.record(stream)
        e1.synchronize()
        per.append(e0.elapsed_ms(e1) / iters)
    return statistics.median(per)


def per_op_times(ex: Any, backend: Any, reps: int = 20, windows: int = 3,
                 only: Optional[Set[str]] = None) -> List[Tuple[str, str, Tuple[int, ...], float]]:
    """GPU time of each launch alone (of the ops in `only`, when given), as (op name, kernel symbol,
    grid, us): a graph of `reps` back-to-back launches of that kernel, its replays timed with events
    (CuPy's ~10 us of host work per direct launch would hide the kernel)."""
    s, out = ex.stream, []
    for L in ex.launches:
        if only is not None and L.name not in only:
            continue
        backend.capture_begin(s)
        for _ in range(reps):
            L.fn.launch(L.grid, L.block, L.args, L.smem, s)
        g = backend.capture_end(s)
        ms = timed(backend, s, lambda: g.launch(s), 2, 5, windows)
        out.append((L.name, L.fn.symbol, L.grid, 1000.0 * ms / reps))
    return out

"""Several GPU engines of one Pipeline (one per loaded batch size): each timed once, and a batch run
as the engine calls of least summed time.

On a compute-bound GPU (an Orin, or 8 SMs of an H200) a call's time grows with its batch: the 8-SM
slice's engines took 0.75, 1.92 and 6.90 ms a step at batch 1, 4 and 16, so 8 images cost less as
two batch-4 calls than as one padded batch-16 call. On 132 SMs (0.41, 0.54, 0.85 ms) one batch-16
call wins from 5 images up.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Tuple

Costs = Dict[int, Tuple[float, float]]   # engine batch size -> (seconds per step, seconds per call beside)
WARM_STEPS = 2          # an engine's first run: every kernel loaded and its step graph captured
TIMED_STEPS = (1, 3)    # its timing: calls of 1 and of 3 steps, the faster of two each


def time_engine(run: Callable[[int], object]) -> Tuple[float, float]:
    """An engine's (seconds per step, seconds per call beside the steps), from `run(steps)`, which
    samples one batch of that many steps (the engine already warm): runs of TIMED_STEPS."""
    def best(steps: int) -> float:
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            run(steps)
            times.append(time.perf_counter() - t0)
        return min(times)
    (s1, s3), (t1, t3) = TIMED_STEPS, [best(n) for n in TIMED_STEPS]
    per_step = max(t3 - t1, 0.0) / (s3 - s1)
    return per_step, max(t1 - s1 * per_step, 0.0)


def split_batch(n: int, steps: int, costs: Costs) -> List[int]:
    """The engine calls (their batch sizes, largest first) that run n images of `steps` steps in the
    least summed time by `costs`, the fewest calls on a tie: a dynamic program over n."""
    call = {size: steps * per_step + per_call for size, (per_step, per_call) in costs.items()}
    best: List[Tuple[float, int, int]] = [(0.0, 0, 0)]   # k images: (seconds, calls, the first call's size)
    for k in range(1, n + 1):
        best.append(min((call[s] + best[max(0, k - s)][0], best[max(0, k - s)][1] + 1, s) for s in call))
    sizes = []
    while n > 0:
        sizes.append(best[n][2])
        n -= best[n][2]
    return sorted(sizes, reverse=True)

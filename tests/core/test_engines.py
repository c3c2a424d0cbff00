"""jetson_unet.sampling.engines: a batch split into the loaded engines' calls of least time, and an
engine's time per step and per call from two timed runs."""
from __future__ import annotations

import pytest

from jetson_unet.sampling import engines

# seconds per step and per call beside, as measured on an H200's 8-SM slice and on its 132 SMs
SLICE = {1: (0.72e-3, 0.3e-3), 4: (1.89e-3, 0.4e-3), 16: (6.83e-3, 0.8e-3)}
WHOLE = {1: (0.38e-3, 0.3e-3), 4: (0.52e-3, 0.4e-3), 16: (0.92e-3, 0.8e-3)}


@pytest.mark.parametrize("costs, n, want", [
    (SLICE, 1, [1]), (SLICE, 2, [1, 1]), (SLICE, 3, [4]), (SLICE, 5, [4, 1]), (SLICE, 8, [4, 4]),
    (SLICE, 13, [4, 4, 4, 1]), (SLICE, 14, [16]), (SLICE, 16, [16]), (SLICE, 20, [16, 4]),
    (WHOLE, 2, [4]), (WHOLE, 8, [16]), (WHOLE, 6, [16]), (WHOLE, 40, [16, 16, 16]),
    ({1: (1.0, 0.0), 4: (4.0, 0.0)}, 4, [4]),   # a tie: the fewest calls
    ({4: (1.0, 0.0)}, 9, [4, 4, 4]),             # one engine: as many calls as it takes
])
def test_a_batch_is_split_into_the_engine_calls_of_least_time(costs, n, want):
    assert engines.split_batch(n, 25, costs) == want


def test_an_engine_is_timed_per_step_and_per_call(monkeypatch):
    ran, clock = [], [0.0]

    def run(steps):   # 2 ms a step and 0.5 ms a call, on a clock that only the runs move
        ran.append(steps)
        clock[0] += 2e-3 * steps + 0.5e-3
    monkeypatch.setattr(engines.time, "perf_counter", lambda: clock[0])
    per_step, per_call = engines.time_engine(run)
    assert ran == [1, 1, 3, 3]
    assert per_step == pytest.approx(2e-3) and per_call == pytest.approx(0.5e-3)

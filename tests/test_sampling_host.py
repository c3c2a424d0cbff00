"""The GPU sampling loop's host logic, driven over a fake backend (no GPU): GPU errors surface as
one clear error (not a hang), cancel stops within one step, the noise follows the spec's order."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "gpu"))
from fakes import FakeBackend, FakeEvent  # noqa: E402

from runtime.config import Schedule, UNetConfig  # noqa: E402
from runtime.errors import Cancelled  # noqa: E402
from runtime.gpu.sampling import GpuRunError, GpuSampler  # noqa: E402
from runtime.schedule import NoiseStream, make_steps  # noqa: E402
from runtime.weights import random_params  # noqa: E402

CFG = UNetConfig(image_size=16, dim=8, dim_mults=(1, 2), time_dim=32, schedule=Schedule(timesteps=10, beta_end=0.005))


class W:
    def __init__(self) -> None:
        self.config, self.params = CFG, random_params(CFG, 0)


class FailingEvent(FakeEvent):
    def synchronize(self) -> None:
        raise RuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered")


class FailAfter(FakeBackend):
    """Events made after the first `ok` ones fail when waited on, as a CUDA fault would."""

    def __init__(self, ok: int) -> None:
        super().__init__()
        self.ok, self.made = ok, 0

    def event(self, timing: bool = True) -> FakeEvent:
        self.made += 1
        return FakeEvent() if self.made <= self.ok else FailingEvent()


@pytest.mark.parametrize("mode", ["cpu", "gpu"])
def test_gpu_error_mid_run_is_one_clear_error(mode):
    be = FailAfter(ok=10_000)
    s = GpuSampler(W(), "fp32", 2, mode=mode, graphs=False, backend=be)
    be.ok = be.made + 3          # a few steps run, then the device "faults"
    with pytest.raises(GpuRunError, match=r"GPU error at step \d+: RuntimeError: cudaErrorIllegalAddress"):
        s.run(make_steps(CFG.schedule, "ddpm"), seed=0)
    s.close()
    s.close()


@pytest.mark.parametrize("mode", ["cpu", "gpu"])
def test_cancel_within_one_step(mode):
    seen = []

    def cb(i, n):
        seen.append(i)
        if i == 1:
            raise Cancelled("stop")

    s = GpuSampler(W(), "fp32", 3, mode=mode, graphs=False, backend=FakeBackend())
    with pytest.raises(Cancelled):
        s.run(make_steps(CFG.schedule, "ddpm"), seed=0, callback=cb)
    assert seen == [0, 1]
    s.close()


def test_gpu_mode_uploads_noise_in_spec_order():
    """The noise rows the gpu mode stages are the spec's draws after x_T, in step order, NCHW (the
    layout p_sample_f32 reads)."""
    be = FakeBackend()
    s = GpuSampler(W(), "fp32", 2, mode="gpu", graphs=False, backend=be)
    steps = make_steps(CFG.schedule, "ddpm")
    s.run(steps, seed=4)
    ref = NoiseStream(4, (2, 3, 16, 16))
    ref.draw()
    noisy = [st for st in steps if st.sigma > 0]
    for r in range(len(noisy)):
        want = ref.draw().reshape(-1)
        np.testing.assert_array_equal(s._host_noise[r], want)
    s.close()

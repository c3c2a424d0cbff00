"""The GPU sampling loop's host logic, driven over a fake backend (no GPU): GPU errors surface as
one clear error (not a hang), cancel stops within one step, the noise follows the spec's order,
with host noise and with device noise (draws enqueued on the side stream ahead of the steps that
read them; a flagged run redrawn on the host)."""
from __future__ import annotations


import numpy as np
import pytest

from tests.helpers.fakes import FakeBackend, FakeEvent

from jetson_unet.model.config import Schedule, UNetConfig
from jetson_unet.errors import Cancelled, NoiseUnsupported, UsageError
from jetson_unet.ops import noise_ref
from jetson_unet.build.loader import KernelSet
from jetson_unet.ops.noise import STATE_DTYPE
from jetson_unet.sampling.gpu import GpuRunError, GpuSampler
from jetson_unet.model.schedule import NoiseStream, make_steps
from jetson_unet.model.weights import random_params

CFG = UNetConfig(image_size=16, dim=8, dim_mults=(1, 2), time_dim=32, schedule=Schedule(timesteps=10, beta_end=0.005))


class W:
    def __init__(self) -> None:
        self.config, self.params = CFG, random_params(CFG, 0)


class FailAfter(FakeBackend):
    """Waits on events after the first `ok` ones fail, as they would after a CUDA fault."""

    def __init__(self, ok: int) -> None:
        super().__init__()
        self.ok, self.syncs = ok, 0

    def event(self, timing: bool = True) -> FakeEvent:
        backend = self

        class Event(FakeEvent):
            def synchronize(self) -> None:
                backend.syncs += 1
                if backend.syncs > backend.ok:
                    raise RuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered")

        return Event()


MODES = [("cpu", "host"), ("gpu", "host"), ("gpu", "device")]


@pytest.mark.parametrize("mode,noise", MODES)
def test_gpu_error_mid_run_is_one_clear_error(mode, noise):
    be = FailAfter(ok=3)         # a few steps run, then the device "faults"
    s = GpuSampler(W(), "fp32", 2, mode=mode, graphs=False, backend=be, noise=noise)
    with pytest.raises(GpuRunError, match=r"GPU error at step \d+: RuntimeError: cudaErrorIllegalAddress"):
        s.run(make_steps(CFG.schedule, "ddpm"), seed=0)
    s.close()
    s.close()


@pytest.mark.parametrize("mode,noise", MODES)
def test_cancel_within_one_step(mode, noise):
    seen = []

    def cb(i, n):
        seen.append(i)
        if i == 1:
            raise Cancelled("stop")

    s = GpuSampler(W(), "fp32", 3, mode=mode, graphs=False, backend=FakeBackend(), noise=noise)
    with pytest.raises(Cancelled):
        s.run(make_steps(CFG.schedule, "ddpm"), seed=0, callback=cb)
    assert seen == [0, 1]
    s.close()


def test_gpu_mode_uploads_noise_in_spec_order():
    """The noise rows the gpu mode stages are the spec's draws after x_T, in step order, NCHW (the
    layout final_conv's sampling step reads)."""
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


def noise_launches(be: FakeBackend) -> list:
    """(kernel, output pointer, layout) of every noise draw and the index of each step's final_conv
    (which takes the sampling step)."""
    out = []
    for i, (sym, grid, block, args, smem) in enumerate(be.launches):
        if sym == "noise_emit":   # (.., normals, out, C, hw)
            out.append(("draw", int(args[6]), (int(args[7]), int(args[8])), i, int(args[5])))
        elif sym.startswith("final_conv") and int(args[8]):   # the U-Net's last kernel, taking the step
            out.append(("step", None, None, i))
    return out


def test_device_noise_draws_x_t_then_each_row_before_its_step(monkeypatch):
    monkeypatch.setattr(KernelSet, "_cache", {})   # a fresh module logs into this backend's launches
    be = FakeBackend()
    s = GpuSampler(W(), "fp32", 2, mode="gpu", graphs=False, backend=be, noise="device")
    steps = make_steps(CFG.schedule, "ddpm")
    s.run(steps, seed=4)
    ex, n = s.executors[0], 2 * 3 * 16 * 16
    log = noise_launches(be)
    draws = [e for e in log if e[0] == "draw"]
    assert draws[0][1:3] == (ex.x_ptr, (3, 256)), "x_T goes straight into the executor's NHWC input"
    assert draws[0][4] == n
    noisy = [k for k, st in enumerate(steps) if st.sigma > 0]
    sizes = [d[4] // n for d in draws[1:]]
    assert all(d[4] % n == 0 for d in draws[1:]) and sum(sizes) == len(noisy)
    assert len(noisy) == 9 and sizes == [1, 1, 2, 4, 1], "rows in draws of doubling size"
    starts = np.cumsum([0] + sizes[:-1])
    assert [d[1] for d in draws[1:]] == [s._off["noise"] + 4 * n * int(r) for r in starts]
    assert all(d[2] == (0, 0) for d in draws[1:])
    step_at = [e[3] for e in log if e[0] == "step"]
    for r, k in enumerate(noisy):
        d = draws[1 + int(np.searchsorted(starts, r, side="right")) - 1]
        assert d[3] < step_at[k], f"row {r} is drawn after step {k} that reads it"
    assert s._host_noise is None, "no pinned host rows in device mode"
    s.close()


class FlaggingBackend(FakeBackend):
    """Reads of the device generator's state come back with a flag raised."""

    def d2h(self, host: np.ndarray, src: int, stream) -> None:
        if host.nbytes == STATE_DTYPE.itemsize:
            host.view(STATE_DTYPE)["flags"] = noise_ref.FLAG_AMBIGUOUS


def test_flagged_device_noise_reruns_with_host_noise(notes):
    seen = []
    s = GpuSampler(W(), "fp32", 2, mode="gpu", graphs=False, backend=FlaggingBackend(), noise="device")
    steps = make_steps(CFG.schedule, "ddim", 4, eta=1.0)
    s.run(steps, seed=4, callback=lambda i, n: seen.append(i))
    assert [n for n in notes if "again with host noise" in n] == \
        ["device noise flagged a libm-dependent comparison too close to call; sampling seed 4 again with host noise"]
    assert seen == [0, 1, 2, 0, 1, 2, 3], "the redraw reports its steps again"
    ref = NoiseStream(4, (2, 3, 16, 16))
    ref.draw()
    for r in range(sum(st.sigma > 0 for st in steps)):
        np.testing.assert_array_equal(s._host_noise[r], ref.draw().reshape(-1))
    s.close()


def test_device_noise_refused_falls_back_with_a_notice(monkeypatch, notes):
    def refuse(*a, **k):
        raise NoiseUnsupported("device noise needs NumPy >= 1.22 (its float32 normal stream); this is NumPy 1.21.6")

    monkeypatch.setattr("jetson_unet.sampling.gpu.DeviceNoise", refuse)
    s = GpuSampler(W(), "fp32", 2, mode="gpu", graphs=False, backend=FakeBackend(), noise="device")
    s.prepare()
    assert s.noise == "host" and notes[-1:] == ["device noise needs NumPy >= 1.22 (its float32 normal stream); "
                                           "this is NumPy 1.21.6; drawing the noise on the host"]
    s.close()


@pytest.mark.parametrize("kw,needle", [({"mode": "cpu", "noise": "device"}, "gpu mode"),
                                       ({"noise": "gpu"}, "unknown noise source")])
def test_noise_usage_errors(kw, needle):
    with pytest.raises(UsageError, match=needle):
        GpuSampler(W(), "fp32", 2, graphs=False, backend=FakeBackend(), **kw)


@pytest.mark.parametrize("batch,graphs", [(2, False), (2, True), (16, False), (16, True)])
def test_plain_launches_stay_on_the_compute_stream(monkeypatch, batch, graphs):
    """On an H100 a few plain launches on a second stream slow every later launch of the process
    (~0.2 us each): plain launches go to the compute stream only; the side
    stream's noise draws run as graphs. With graphs, each distinct
    draw is captured once and a second run replays the same draws."""
    monkeypatch.setattr(KernelSet, "_cache", {})
    be = FakeBackend()
    s = GpuSampler(W(), "fp32", batch, mode="gpu", graphs=graphs, backend=be, noise="device")
    steps = make_steps(CFG.schedule, "ddpm")
    s.run(steps, seed=4)
    first, n_graphs = len(be.launches), len(be.graphs)
    s.run(steps, seed=5)
    plain = {id(st) for st, kind in be.launch_streams if kind == "plain"}
    assert plain == {id(s.compute[0])}, "a plain launch on another stream"
    if graphs:
        assert len(be.graphs) == n_graphs, "the second run captured nothing new"
        assert {id(st) for st, kind in be.launch_streams if kind == "graph"} == {id(s.side), id(s.compute[0])}
        be2 = be.launches
        run1, run2 = FakeBackend(), FakeBackend()
        run1.launches, run2.launches = be2[:first], be2[first:]
        assert [d[:3] + d[4:] for d in noise_launches(run1) if d[0] == "draw"] == \
            [d[:3] + d[4:] for d in noise_launches(run2) if d[0] == "draw"], "the same draws, replayed"
    s.close()

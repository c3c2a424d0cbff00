"""The GPU sampling loop's host logic, driven over a fake backend (no GPU): GPU errors surface as
one clear error (not a hang), cancel stops within one step, the noise follows the spec's order
(one stream per image; the rows image-major, [B][T][C*H*W]), with host noise and with device noise
(draws enqueued on the side stream ahead of the steps that read them, one generator per image; a
flagged run redrawn on the host); gpu mode's step tables hold the six coefficients of each step
and final_conv's step arguments the history; cpu mode carries dpmpp-2m's history per half-batch."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.helpers.fakes import FakeBackend, FakeEvent

from jetson_unet.model.config import Schedule, UNetConfig
from jetson_unet.errors import Cancelled, NoiseUnsupported, UsageError
from jetson_unet.ops import noise_ref
from jetson_unet.build.loader import KernelSet
from jetson_unet.executor import memory
from jetson_unet.ops.noise import STATE_DTYPE
from jetson_unet.sampling.gpu import GpuRunError, GpuSampler
from jetson_unet.model.reference import Reference
from jetson_unet.model.schedule import make_steps, sample_loop
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
        s.run(make_steps(CFG.schedule, "ddpm"), seeds=0)
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
        s.run(make_steps(CFG.schedule, "ddpm"), seeds=0, callback=cb)
    assert seen == [0, 1]
    s.close()


def image_streams(seeds) -> list:
    """The spec's generator of each image."""
    return [np.random.Generator(np.random.PCG64(k)) for k in seeds]


def next_row(g: np.random.Generator) -> np.ndarray:
    return g.standard_normal((3, 16, 16), dtype=np.float32).reshape(-1)


@pytest.mark.parametrize("seeds", [4, [9, 5]])
def test_gpu_mode_uploads_noise_in_spec_order(seeds):
    """The noise rows the gpu mode stages are each image's own draws after its x_T, in step order,
    NCHW, image-major (the layout final_conv's sampling step reads): _host_noise[i, r] is image i's
    generator's r-th noisy draw, uploaded to noise + 4 * CHW * (i * T + r)."""
    be = FakeBackend()
    s = GpuSampler(W(), "fp32", 2, mode="gpu", graphs=False, backend=be)
    steps = make_steps(CFG.schedule, "ddpm")
    s.run(steps, seeds=seeds)
    T, n = CFG.timesteps, 3 * 16 * 16
    assert s._host_noise.shape == (2, T, n)
    gens = image_streams([4, 5] if seeds == 4 else seeds)
    for g in gens:
        next_row(g)   # x_T
    noisy = [st for st in steps if st.sigma > 0]
    assert len(noisy) == T - 1
    for r in range(len(noisy)):
        for i, g in enumerate(gens):
            np.testing.assert_array_equal(s._host_noise[i, r], next_row(g), err_msg=f"image {i} row {r}")
    ups = [(dst, nbytes) for dst, nbytes in be.copies if s._off["noise"] <= dst < s._off["noise"] + 4 * 2 * n * T]
    covered = set()
    for dst, nbytes in ups:
        first, k = (dst - s._off["noise"]) // (4 * n), nbytes // (4 * n)
        assert (dst - s._off["noise"]) % (4 * n) == 0 and first // T == (first + k - 1) // T, "one image's rows"
        covered |= set(range(first, first + k))
    assert covered == {i * T + r for i in range(2) for r in range(len(noisy))}, "each image's rows, image-major"
    s.close()


def noise_launches(be: FakeBackend) -> list:
    """("draw", output pointer, layout, index, normals, first generator's state pointer, images, output
    stride in floats) of every noise draw and ("step", .., index) of each step's final_conv (which takes
    the sampling step)."""
    out, state = [], None
    for i, (sym, grid, block, args, smem) in enumerate(be.launches):
        if sym == "noise_words":   # (state, words, ..)
            state = int(args[0])
        elif sym == "noise_emit":   # (.., normals, out, C, hw, slot groups, out stride); grid y: images
            out.append(("draw", int(args[6]), (int(args[7]), int(args[8])), i, int(args[5]), state, grid[1],
                        int(args[10])))
        elif sym.startswith("final_conv") and int(args[8]):   # the U-Net's last kernel, taking the step
            out.append(("step", None, None, i))
    return out


def test_device_noise_draws_x_t_then_each_row_before_its_step(monkeypatch):
    monkeypatch.setattr(KernelSet, "_cache", {})   # a fresh module logs into this backend's launches
    be = FakeBackend()
    s = GpuSampler(W(), "fp32", 2, mode="gpu", graphs=False, backend=be, noise="device")
    steps = make_steps(CFG.schedule, "ddpm")
    s.run(steps, seeds=4)
    ex, n, T = s.executors[0], 3 * 16 * 16, CFG.timesteps   # n: one image's normals
    state0 = int(s._dnoise.ptr["state"])
    log = noise_launches(be)
    draws = [e for e in log if e[0] == "draw"]
    # both images' x_T in one set of launches, image i's from its own generator into its part of the NHWC input
    assert draws[0][1:3] == (ex.x_ptr, (3, 256)), "x_T goes straight into the executor's NHWC input"
    assert draws[0][4:] == (n, state0, 2, n), "one draw for both images, one image apart"
    rows = draws[1:]
    noisy = [k for k, st in enumerate(steps) if st.sigma > 0]
    assert all(d[4] % n == 0 for d in rows) and all(d[2] == (0, 0) for d in rows)
    assert all(d[5:] == (state0, 2, n * T) for d in rows), "every draw for both images, image-major rows"
    sizes = [d[4] // n for d in rows]
    assert len(noisy) == 9 and sizes == [1, 1, 2, 4, 1], "rows in draws of doubling size"
    starts = np.cumsum([0] + sizes[:-1])
    assert [d[1] for d in rows] == [s._off["noise"] + 4 * n * int(r) for r in starts], \
        "image-major rows: image i's row r at (i * T + r) * CHW"
    step_at = [e[3] for e in log if e[0] == "step"]
    for r, k in enumerate(noisy):
        g = int(np.searchsorted(starts, r, side="right")) - 1
        assert rows[g][3] < step_at[k], f"row {r} is drawn after step {k} that reads it"
    assert s._host_noise is None, "no pinned host rows in device mode"
    s.close()


class FlaggingBackend(FakeBackend):
    """Reads of the device generators' states come back with image 1's flag raised (flags() ORs
    every image's)."""

    def d2h(self, host: np.ndarray, src: int, stream) -> None:
        if host.dtype == np.uint8 and host.nbytes == 2 * STATE_DTYPE.itemsize:
            host.view(STATE_DTYPE)["flags"][1] = noise_ref.FLAG_AMBIGUOUS


def test_flagged_device_noise_reruns_with_host_noise(notes):
    seen = []
    s = GpuSampler(W(), "fp32", 2, mode="gpu", graphs=False, backend=FlaggingBackend(), noise="device")
    steps = make_steps(CFG.schedule, "ddim", 4, eta=1.0)
    s.run(steps, seeds=4, callback=lambda i, n: seen.append(i))
    assert [n for n in notes if "again with host noise" in n] == \
        ["device noise flagged a libm-dependent comparison too close to call; sampling seeds [4, 5] again with host noise"]
    assert seen == [0, 1, 2, 0, 1, 2, 3], "the redraw reports its steps again"
    gens = image_streams([4, 5])
    for g in gens:
        next_row(g)
    for r in range(sum(st.sigma > 0 for st in steps)):
        for i, g in enumerate(gens):
            np.testing.assert_array_equal(s._host_noise[i, r], next_row(g), err_msg=f"image {i} row {r}")
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
    s.run(steps, seeds=4)
    first, n_graphs = len(be.launches), len(be.graphs)
    s.run(steps, seeds=5)
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


# ---- gpu mode: the step tables and final_conv's step arguments (DPM-Solver++(2M)) ---------------------
def step_launches(be: FakeBackend, prefix: str) -> list:
    return [args for sym, grid, block, args, smem in be.launches if sym.startswith(prefix)]


def test_gpu_mode_tables_hold_six_coefficients_per_step():
    """dpmpp-2m's steps as the tables the step advance reads: coef[6 s .. 6 s + 5] = (c_x, c_eps,
    sigma, c_h, d_x, d_eps) in float32, no noise rows; sizes as memory.sampler_tables says."""
    T, n = CFG.timesteps, 3 * 16 * 16
    sizes = memory.sampler_tables(CFG, 2)
    assert memory.STEP_COEFS == 6
    assert sizes["coef"] == 4 * 6 * T and sizes["cur"] == 32 and sizes["hist"] == 4 * 2 * n
    assert sizes["noise"] == 4 * 2 * n * T and "hist" in memory.DEVICE_ONLY_TABLES
    be = FakeBackend()
    s = GpuSampler(W(), "fp32", 2, mode="gpu", graphs=False, backend=be)
    for sampler, S in (("dpmpp-2m", 5), ("ddim", 5), ("dpmpp-2m", T), ("dpmpp-2m", 2)):
        steps = make_steps(CFG.schedule, sampler, S)
        s.run(steps, seeds=[3, 1])
        tab = s._host_tab
        assert tab["coef"].shape == (T, 6) and tab["coef"].dtype == np.float32
        want = np.array([(st.c_x, st.c_eps, st.sigma, st.c_h, st.d_x, st.d_eps) for st in steps], np.float32)
        np.testing.assert_array_equal(tab["coef"][:S], want, err_msg=f"{sampler} S={S}")
        assert (tab["t_of_step"][:S] == [st.t for st in steps]).all()
        assert (tab["noise_row"][:S] == -1).all(), "no noise for DDIM eta 0 and dpmpp-2m"
        if sampler == "dpmpp-2m" and S > 2:
            assert (want[1:-1, 3] != 0).all() and (want[:, 4] != 0).all(), "the history is weighed and saved"
        else:
            assert sampler == "dpmpp-2m" or not want[:, 3:].any(), "DDIM: c_h = d_x = d_eps = 0"
        assert (s._off["coef"], 4 * 6 * T) in be.copies
    s.close()


def test_gpu_mode_retables_when_only_the_history_coefficients_differ():
    """The tables on the device are reused for the same steps only: a step list that differs in
    c_h / d_x / d_eps alone is uploaded again."""
    be = FakeBackend()
    s = GpuSampler(W(), "fp32", 1, mode="gpu", graphs=False, backend=be)
    steps = make_steps(CFG.schedule, "dpmpp-2m", 4)
    s.run(steps, seeds=0)
    n_coef = sum(d == s._off["coef"] for d, _ in be.copies)
    s.run(steps, seeds=1)
    assert sum(d == s._off["coef"] for d, _ in be.copies) == n_coef, "the same steps: tables kept"
    for field in ("c_h", "d_x", "d_eps"):
        other = [dataclasses.replace(st, **{field: getattr(st, field) + 0.5}) for st in steps]
        s.run(other, seeds=1)
        assert sum(d == s._off["coef"] for d, _ in be.copies) == n_coef + 1, field
        assert s._host_tab["coef"][1, ("c_h", "d_x", "d_eps").index(field) + 3] == np.float32(
            getattr(other[1], field))
        n_coef += 1
    s.close()


@pytest.mark.parametrize("graphs", [False, True])
def test_final_conv_step_arguments_carry_the_history(monkeypatch, graphs):
    """final_conv's step arguments are (xs, noise, cur, hist, rows = T) in a sampler step and null
    pointers with rows 0 in a plain U-Net call; init_conv's step advance gets the tables."""
    monkeypatch.setattr(KernelSet, "_cache", {})   # a fresh module logs into this backend's launches
    T = CFG.timesteps
    be = FakeBackend()
    s = GpuSampler(W(), "fp32", 2, mode="gpu", graphs=graphs, backend=be)
    ex = s.executors[0]
    steps = make_steps(CFG.schedule, "dpmpp-2m", 4)
    s.run(steps, seeds=[2, 7])
    o = s._off
    finals = step_launches(be, "final_conv")
    assert len(finals) == len(steps)
    for args in finals:   # FINAL_PARAMS: x, npix, Cin, ldx, w, bias, out, Cout, xs, noise, step, hist, rows, hw
        assert len(args) == 14
        assert [int(a) for a in args[8:13]] == [ex.x_ptr, o["noise"], o["cur"], o["hist"], T]
        assert isinstance(args[12], np.int32) and int(args[13]) == 16 * 16
    want_adv = [o["counter"], ex.t_idx_ptr, o["cur"], o["t_of_step"], o["coef"], o["noise_row"], T]
    adv = step_launches(be, "init_conv")
    assert len(adv) == len(steps)
    for args in adv:   # (.., counter, t_idx, cur, t_of_step, coef, noise_row, n_steps)
        vals = [int(a) for a in args]
        k = vals.index(int(o["counter"]))
        assert vals[k:k + 7] == want_adv
    be.launches.clear()
    ex.eps(np.zeros((2, 3, 16, 16), np.float32), 3)   # a plain call: no step
    (args,) = step_launches(be, "final_conv")
    assert [int(a) for a in args[8:13]] == [0, 0, 0, 0, 0]
    s.close()


# ---- cpu mode: p_sample on the host, the history per half-batch -----------------------------------------
class RefEpsBackend(FakeBackend):
    """Host memory behind the fake addresses: what h2d writes, d2h reads back; an executor's run
    (patched by with_reference_eps) writes the NumPy reference's eps of the uploaded x."""

    def __init__(self) -> None:
        super().__init__()
        self.mem: dict = {}

    def h2d(self, dst: int, host: np.ndarray, stream) -> None:
        super().h2d(dst, host, stream)
        self.mem[int(dst)] = np.array(host, copy=True)

    def d2h(self, host: np.ndarray, src: int, stream) -> None:
        if int(src) in self.mem and self.mem[int(src)].shape == host.shape:
            host[...] = self.mem[int(src)]


def with_reference_eps(s: GpuSampler, be: RefEpsBackend, ref: Reference) -> None:
    for ex in s.executors:
        def run(stream, t_idx_ptr=None, step=None, ex=ex):
            assert step is None, "cpu mode runs the U-Net alone"
            t = (int(t_idx_ptr) - ex.weights_ptr - ex.trows_offset) // (4 * ex.batch)   # ex.t_row_ptr(t)
            assert ex.t_row_ptr(t) == int(t_idx_ptr)
            x = be.mem[ex.x_ptr].transpose(0, 3, 1, 2)
            be.mem[ex.eps_ptr] = ref.eps(np.ascontiguousarray(x), t).transpose(0, 2, 3, 1)
        ex.run = run


@pytest.mark.parametrize("sampler,S,eta,seeds", [("dpmpp-2m", 5, 0.0, [3, 8, 1]), ("dpmpp-2m", 10, 0.0, 6),
                                                 ("ddim", 4, 1.0, [3, 8, 1]), ("ddpm", None, 0.0, [5, 2])])
def test_cpu_mode_equals_the_numpy_sample_loop(sampler, S, eta, seeds):
    """cpu mode (two half-batch executors, p_sample on the host) over a backend whose eps is the
    NumPy reference's gives sample_loop's x_0 bit for bit: each half carries its own history, and
    its images draw from their own streams."""
    w = W()
    ref = Reference(w, np.float32)
    B = 3 if isinstance(seeds, int) else len(seeds)
    be = RefEpsBackend()
    s = GpuSampler(w, "fp32", B, mode="cpu", graphs=False, backend=be)
    assert len(s.executors) == 2, "two half-batch executors"
    with_reference_eps(s, be, ref)
    steps = make_steps(CFG.schedule, sampler, S, eta)
    got = s.run(steps, seeds=seeds)
    want = sample_loop(ref.eps, (B, 3, 16, 16), steps, seeds)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"max diff {np.abs(got - want).max()}"
    s.close()

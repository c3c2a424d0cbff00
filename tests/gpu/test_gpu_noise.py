"""Device noise (kernels/noise.cu through jetson_unet.ops.noise.DeviceNoise) on the GPU against NumPy's
standard_normal(float32): rows bit for bit at batch 1 and 16 sizes for several seeds, 100
consecutive rows, NaN-poisoned outputs, NHWC, the generator state after them, flags clear, draws
replayed as CUDA graphs; one generator per image (the spec's per-image streams), drawn one at a time
or all in one draw; the ambiguity hook raises the flag; the sampler's device noise gives the host noise's
images, also when a flagged run is redrawn on the host."""
from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.gpu import report
from jetson_unet import logs
from jetson_unet.build.loader import KernelSet
from jetson_unet.ops.noise import FLAG_AMBIGUOUS, DeviceNoise
from jetson_unet.sampling.gpu import GpuSampler
from jetson_unet.model.schedule import make_steps

IMAGE = 3 * 64 * 64


@pytest.fixture(scope="module")
def module(backend):
    return KernelSet(backend, [], name="noise").module


def device_rows(backend, module, n, seed, rows, nhwc=None, timing=False):
    """rows consecutive draws of n normals into NaN-poisoned device rows: (rows x n, flags, state, ms/draw)."""
    dn, s = DeviceNoise(backend, n, module), backend.stream()
    buf = backend.alloc(4 * n * rows)
    host = backend.pinned((rows, n), np.float32)
    host[...] = np.nan
    backend.h2d(buf.ptr, host, s)
    dn.seed([seed], s)
    e0, e1 = backend.event(), backend.event()
    e0.record(s)
    for r in range(rows):
        dn.draw(buf.ptr + 4 * n * r, s, nhwc)
    e1.record(s)
    backend.d2h(host, buf.ptr, s)
    flags, state = dn.flags(s), dn.state(s)
    ms = e0.elapsed_ms(e1) / rows
    dn.close()
    buf.free()
    return np.array(host), flags, state, ms


def assert_bits(got, want, label):
    diff = np.nonzero(got.view(np.uint32) != want.view(np.uint32))[0]
    assert diff.size == 0, f"{label}: {diff.size} of {want.size} differ, first at {diff[:4].tolist()}: " \
                           f"got {got[diff[:4]]}, want {want[diff[:4]]}"


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 16])
@pytest.mark.parametrize("seed", [0, 1, 20240607])
def test_rows_equal_numpy_and_leave_its_state(backend, module, batch, seed):
    n = batch * IMAGE
    got, flags, state, ms = device_rows(backend, module, n, seed, rows=3)
    g = np.random.Generator(np.random.PCG64(seed))
    for r in range(3):
        assert_bits(got[r], g.standard_normal(n, dtype=np.float32), f"b{batch} seed {seed} row {r}")
    assert flags == 0 and state == g.bit_generator.state
    report(f"device noise b{batch} seed {seed}: 3 rows bit-exact, {ms:.3f} ms per row")


@pytest.mark.gpu
def test_hundred_consecutive_rows(backend, module):
    n = 16 * IMAGE
    got, flags, state, ms = device_rows(backend, module, n, 7, rows=100)
    g = np.random.Generator(np.random.PCG64(7))
    for r in range(100):
        assert_bits(got[r], g.standard_normal(n, dtype=np.float32), f"row {r}")
    assert flags == 0 and state == g.bit_generator.state
    report(f"device noise b16: 100 rows bit-exact, {ms:.3f} ms per row (GPU time, alone on the GPU)")


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 5, 12289])
def test_odd_sizes_carry_the_buffered_half_word(backend, module, n):
    got, flags, state, _ = device_rows(backend, module, n, 3, rows=5)
    g = np.random.Generator(np.random.PCG64(3))
    for r in range(5):
        assert_bits(got[r], g.standard_normal(n, dtype=np.float32), f"n {n} row {r}")
    assert flags == 0 and state == g.bit_generator.state


@pytest.mark.gpu
def test_nhwc_rows(backend, module):
    got, flags, _, _ = device_rows(backend, module, 4 * IMAGE, 11, rows=2, nhwc=(3, 64 * 64))
    g = np.random.Generator(np.random.PCG64(11))
    for r in range(2):
        want = g.standard_normal((4, 3, 64 * 64), dtype=np.float32).transpose(0, 2, 1).reshape(-1)
        assert_bits(got[r], np.ascontiguousarray(want), f"nhwc row {r}")
    assert flags == 0


@pytest.mark.gpu
def test_graph_draws_replay_the_stream(backend, module):
    """graphs=True: each distinct draw is captured once; reseeded, the replays draw the new seed's
    stream (one row, then two at once)."""
    n = 16 * IMAGE
    dn, s = DeviceNoise(backend, n, module, rows=2, graphs=True), backend.stream()
    buf = backend.alloc(4 * n * 3)
    host = backend.pinned((3, n), np.float32)
    try:
        for seed in (4, 9):
            host[...] = np.nan
            backend.h2d(buf.ptr, host, s)
            dn.seed([seed], s)
            dn.draw(buf.ptr, s)
            dn.draw(buf.ptr + 4 * n, s, rows=2)
            backend.d2h(host, buf.ptr, s)
            flags = dn.flags(s)
            want = np.random.Generator(np.random.PCG64(seed)).standard_normal(3 * n, dtype=np.float32)
            assert_bits(np.array(host).reshape(-1), want, f"seed {seed}")
            assert flags == 0
        assert len(dn._graphs) == 2
    finally:
        dn.close()
        buf.free()


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True])
def test_one_generator_per_image(backend, module, graphs):
    """images=4: image i's draws are PCG64(seeds[i])'s stream whatever the others draw in between
    (one scratch, one state each), x_T per image in NHWC, its state its own, and a reseed restarts
    every image (graph replays included)."""
    B = 4
    dn, s = DeviceNoise(backend, IMAGE, module, rows=3, graphs=graphs, images=B), backend.stream()
    buf = backend.alloc(4 * IMAGE * 4)
    host = backend.pinned((4, IMAGE), np.float32)
    try:
        for seeds in ([5, 6, 7, 8], [8, 0, 2 ** 63 - 1, 8]):
            dn.seed(seeds, s)
            gens = [np.random.Generator(np.random.PCG64(k)) for k in seeds]
            for i in range(B):   # x_T, NHWC per image
                host[...] = np.nan
                backend.h2d(buf.ptr, host, s)
                dn.draw(buf.ptr, s, nhwc=(3, 64 * 64), image=i)
                backend.d2h(host, buf.ptr, s)
                s.synchronize()
                want = gens[i].standard_normal((3, 64 * 64), dtype=np.float32).T.reshape(-1)
                assert_bits(np.array(host[0]), np.ascontiguousarray(want), f"seeds {seeds} x_T of image {i}")
            for image, rows in ((3, 1), (0, 3), (2, 2), (3, 3), (1, 1)):
                host[...] = np.nan
                backend.h2d(buf.ptr, host, s)
                dn.draw(buf.ptr, s, rows=rows, image=image)
                backend.d2h(host, buf.ptr, s)
                s.synchronize()
                want = gens[image].standard_normal(rows * IMAGE, dtype=np.float32)
                assert_bits(np.array(host[:rows]).reshape(-1), want, f"seeds {seeds} image {image} rows {rows}")
            for i, g in enumerate(gens):
                assert dn.state(s, image=i) == g.bit_generator.state, f"seeds {seeds} image {i}: state"
            assert dn.flags(s) == 0
    finally:
        dn.close()
        buf.free()


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("slots", [6, 4])
def test_a_draw_for_the_batch_is_each_images_stream(backend, module, graphs, slots):
    """The sampler's draws: every image's next rows in one draw (slots 4 of 6: two sets of launches),
    image i's into its own rows [B][T][CHW] (the row after them left poisoned), each its own stream
    and state, graph replays included."""
    B, T = 6, 3
    dn = DeviceNoise(backend, IMAGE, module, rows=2, graphs=graphs, images=B, slots=slots)
    s, buf = backend.stream(), backend.alloc(4 * B * T * IMAGE)
    host = backend.pinned((B, T, IMAGE), np.float32)
    try:
        for seeds in ([1, 2, 3, 4, 5, 6], [6, 0, 2 ** 63 - 1, 6, 9, 3]):
            dn.seed(seeds, s)
            gens = [np.random.Generator(np.random.PCG64(k)) for k in seeds]
            host[...] = np.nan
            backend.h2d(buf.ptr, host, s)
            dn.draw(buf.ptr, s, nhwc=(3, 64 * 64), images=B, stride=4 * T * IMAGE)          # x_T into row 0
            dn.draw(buf.ptr + 4 * IMAGE, s, rows=1, images=B, stride=4 * T * IMAGE)         # row 1
            backend.d2h(host, buf.ptr, s)
            s.synchronize()
            for i, g in enumerate(gens):
                want = g.standard_normal((3, 64 * 64), dtype=np.float32).T.reshape(-1)
                assert_bits(np.array(host[i, 0]), np.ascontiguousarray(want), f"seeds {seeds} x_T of image {i}")
                assert_bits(np.array(host[i, 1]), g.standard_normal(IMAGE, dtype=np.float32), f"image {i} row 1")
                assert np.isnan(host[i, 2]).all(), f"image {i}: row 2 written"
            dn.draw(buf.ptr + 4 * IMAGE, s, rows=2, images=B, stride=4 * T * IMAGE)         # rows 1, 2
            backend.d2h(host, buf.ptr, s)
            s.synchronize()
            for i, g in enumerate(gens):
                want = g.standard_normal(2 * IMAGE, dtype=np.float32)
                assert_bits(np.array(host[i, 1:]).reshape(-1), want, f"seeds {seeds} image {i} rows 1-2")
                assert dn.state(s, image=i) == g.bit_generator.state, f"seeds {seeds} image {i}: state"
            assert dn.flags(s) == 0
    finally:
        dn.close()
        buf.free()


@pytest.mark.gpu
def test_ambiguity_hook_raises_the_flag(backend, module, monkeypatch):
    monkeypatch.setattr(DeviceNoise, "window_log2", 45)
    _, flags, _, _ = device_rows(backend, module, IMAGE, 0, rows=1)
    assert flags & FLAG_AMBIGUOUS


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("batch", [2, 3])
@pytest.mark.parametrize("sampler,n_steps", [("ddpm", None), ("dpmpp-2m", 10)])
def test_sampler_device_noise_gives_the_host_noise_images(backend, weights, graphs, batch, sampler, n_steps):
    steps = make_steps(weights.config.schedule, sampler, n_steps)
    out = {}
    for noise in ("host", "device"):
        s = GpuSampler(weights, "fp16", batch, mode="gpu", graphs=graphs, backend=backend, noise=noise)
        try:
            out[noise] = s.run(steps, seeds=5)
            out[noise + "2"] = s.run(steps, seeds=list(range(batch, 0, -1)))   # a second run reseeds
        finally:
            s.close()
    assert np.array_equal(out["device"], out["host"]) and np.array_equal(out["device2"], out["host2"])


@pytest.mark.gpu
def test_flagged_run_is_redrawn_on_the_host(backend, weights, monkeypatch):
    steps = make_steps(weights.config.schedule, "ddim", 5, eta=1.0)
    host = GpuSampler(weights, "fp16", 2, mode="gpu", backend=backend)
    try:
        want = host.run(steps, seeds=9)
    finally:
        host.close()
    monkeypatch.setattr(DeviceNoise, "window_log2", 45)
    s = GpuSampler(weights, "fp16", 2, mode="gpu", backend=backend, noise="device")
    try:
        with logs.captured() as notes:
            got = s.run(steps, seeds=9)
    finally:
        s.close()
    assert len(notes) == 1 and "again with host noise" in notes[0]
    assert np.array_equal(got, want)

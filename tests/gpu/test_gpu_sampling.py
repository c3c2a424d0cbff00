"""The GPU sampling pipeline: cpu and gpu modes against the reference loop (DDIM with noise, and
DPM-Solver++(2M) with its history), graphs, cancel, threads, and one noise stream per image (an
image's seed gives the same image alone or in a batch, within the precision)."""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from tests.helpers.gpu import report
from jetson_unet.errors import Cancelled
from jetson_unet.sampling.gpu import GpuSampler
from jetson_unet.pipeline import Pipeline
from jetson_unet.model.reference import Reference
from jetson_unet.model.schedule import make_steps, sample_loop
from jetson_unet.trace import Timeline

# x_0 after a whole run, relative L2 against the NumPy loop on the same noise. fp32: the U-Net's
# 1e-4 per call stays of that order through the steps (each step contracts errors by c_x ~ 1);
# the two GPU modes differ only by where p_sample rounds (fp32 kernel vs float64 NumPy); in fp16
# that 1e-7 difference flips fp16 roundings of the next U-Net input, which 100 steps carry to ~1e-4
# (seen: 1.7e-4 on an H200), still 50 dB below the image's range.
RUN_TOL_FP32 = 1e-3
MODE_TOL = {"fp32": 1e-4, "fp16": 1e-3}


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["cpu", "gpu"])
def test_modes_match_reference_loop(backend, weights, mode):
    steps = make_steps(weights.config.schedule, "ddim", 6, eta=1.0)   # eta 1: noise on every step
    ref = Reference(weights, np.float32)
    shape = (3, 3, weights.config.image_size, weights.config.image_size)
    want = sample_loop(ref.eps, shape, steps, seeds=11)
    s = GpuSampler(weights, "fp32", 3, mode=mode, backend=backend)
    try:
        got = s.run(steps, seeds=11)
    finally:
        s.close()
    err = rel(got, want)
    report(f"sampling {mode} fp32 b3 ddim6 eta1 vs numpy loop: rel L2 {err:.2e}")
    assert got.shape == want.shape and np.isfinite(got).all()
    assert err < RUN_TOL_FP32


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["cpu", "gpu"])
@pytest.mark.parametrize("n_steps", [2, 5, 20])
def test_dpmpp_2m_matches_reference_loop(backend, weights, mode, n_steps):
    """dpmpp-2m in both modes (gpu: the history in final_conv, inside the replayed graph; cpu: per
    half-batch through p_sample) against the NumPy loop."""
    steps = make_steps(weights.config.schedule, "dpmpp-2m", n_steps)
    ref = Reference(weights, np.float32)
    shape = (3, 3, weights.config.image_size, weights.config.image_size)
    want = sample_loop(ref.eps, shape, steps, seeds=[4, 12, 0])
    s = GpuSampler(weights, "fp32", 3, mode=mode, backend=backend)
    try:
        got = s.run(steps, seeds=[4, 12, 0])
    finally:
        s.close()
    err = rel(got, want)
    report(f"sampling {mode} fp32 b3 dpmpp-2m {n_steps} vs numpy loop: rel L2 {err:.2e}")
    assert got.shape == want.shape and np.isfinite(got).all()
    assert err < RUN_TOL_FP32


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["cpu", "gpu"])
@pytest.mark.parametrize("sampler,n_steps,eta", [("ddpm", None, 0.0), ("ddim", 6, 1.0), ("dpmpp-2m", 10, 0.0)])
def test_seed_gives_the_same_image_alone_or_in_a_batch(backend, weights, mode, sampler, n_steps, eta):
    """Per-image streams on the GPU: seeds 5..8 in a batch of 4 are the images of seed k alone
    (batch 1), and seed 5 second in seeds=[9, 5] too, within fp32's precision (other batch sizes
    may pick other kernels: the ops suite's fp32 error per U-Net call)."""
    steps = make_steps(weights.config.schedule, sampler, n_steps, eta)
    out = {}
    for batch, seeds in ((4, 5), (1, None), (2, [9, 5])):
        s = GpuSampler(weights, "fp32", batch, mode=mode, backend=backend)
        try:
            out[batch] = [s.run(steps, seeds=[k])[0] for k in range(5, 9)] if seeds is None else s.run(steps, seeds)
        finally:
            s.close()
    errs = [rel(out[4][i], out[1][i]) for i in range(4)] + [rel(out[2][1], out[1][0])]
    report(f"sampling {mode} fp32 {sampler}: seed alone vs in a batch, rel L2 up to {max(errs):.2e}")
    assert max(errs) < RUN_TOL_FP32
    assert min(rel(out[4][i], out[4][0]) for i in range(1, 4)) > 0.1, "four seeds, four images"


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_gpu_mode_equals_cpu_mode_ddpm(backend, weights, precision):
    steps = make_steps(weights.config.schedule, "ddpm")
    out = {}
    for mode in ("cpu", "gpu"):
        s = GpuSampler(weights, precision, 2, mode=mode, backend=backend)
        try:
            out[mode] = s.run(steps, seeds=5)
        finally:
            s.close()
    err = rel(out["gpu"], out["cpu"])
    report(f"sampling ddpm {precision} b2 gpu vs cpu mode: rel L2 {err:.2e}")
    assert err < MODE_TOL[precision]


@pytest.mark.gpu
@pytest.mark.parametrize("sampler,n_steps,eta", [("ddim", 5, 0.5), ("dpmpp-2m", 6, 0.0)])
def test_graph_and_plain_launches_identical_and_reusable(backend, weights, sampler, n_steps, eta):
    steps = make_steps(weights.config.schedule, sampler, n_steps, eta)
    res = []
    for graphs in (True, False):
        s = GpuSampler(weights, "fp16", 2, mode="gpu", graphs=graphs, backend=backend)
        try:
            res.append(s.run(steps, seeds=3))
            res.append(s.run(steps, seeds=3))   # the graph and tables are reused
        finally:
            s.close()
    for r in res[1:]:
        assert np.array_equal(res[0], r)


@pytest.mark.gpu
@pytest.mark.parametrize("mode,noise", [("gpu", "device"), ("gpu", "host"), ("cpu", "host")])
def test_images_are_to_uint8_of_the_run(backend, weights, mode, noise):
    """images() (in gpu mode made by kernels/io.cu image_u8) is schedule.to_uint8 of run()'s x_0, byte
    for byte, the same run twice (the pinned buffer reused), batch 3 (a ragged last CTA)."""
    from jetson_unet.model.schedule import to_uint8
    steps = make_steps(weights.config.schedule, "ddim", 4, eta=1.0)   # noise on every step
    s = GpuSampler(weights, "fp16", 3, mode=mode, noise=noise, backend=backend)
    try:
        want = to_uint8(s.run(steps, seeds=5))
        got = [s.images(steps, seeds=5) for _ in range(2)]
    finally:
        s.close()
    for g in got:
        assert g.dtype == np.uint8 and g.shape == want.shape and np.array_equal(g, want)
    report(f"images() {mode} mode, {noise} noise: bytes equal to to_uint8(run()), {want.size} values")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["cpu", "gpu"])
def test_cancel_stops_within_one_step(backend, weights, mode):
    seen = []

    def cb(i, n):
        seen.append(i)
        if i == 3:
            raise Cancelled("stop")

    steps = make_steps(weights.config.schedule, "ddpm")
    s = GpuSampler(weights, "fp16", 2, mode=mode, backend=backend)
    try:
        with pytest.raises(Cancelled):
            s.run(steps, seeds=1, callback=cb)
        again = s.run(make_steps(weights.config.schedule, "ddim", 3), seeds=1)   # still usable
    finally:
        s.close()
        s.close()   # twice is fine
    assert seen == [0, 1, 2, 3]
    assert np.isfinite(again).all()


@pytest.mark.gpu
def test_pipeline_threads_serialize_and_trace(backend, weights, tmp_path):
    results = {}
    with Pipeline(weights, backend="cupy", precision="fp16") as pipe:
        solo = pipe.sample(batch=2, sampler="ddim", steps=4, seed=9)

        def work(k):
            results[k] = pipe.sample(batch=2, sampler="ddim", steps=4, seed=9)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        tl = Timeline(backend)
        pipe.sample(batch=1, sampler="ddim", steps=3, seed=2, timeline=tl)
        tl.write(tmp_path / "t.json")
    for k in range(2):
        assert np.array_equal(results[k], solo)
    doc = json.loads((tmp_path / "t.json").read_text())
    names = [e["name"] for e in doc["traceEvents"] if e["ph"] == "X"]
    assert names == ["step 0", "step 1", "step 2"]


@pytest.mark.gpu
def test_a_batch_on_a_larger_loaded_engine_gives_its_seeds_images(backend, weights):
    """load([4]): 3 images run on the batch-4 engine (a row padded) and are, bit for bit, the first
    three of that engine's batch with the pad's seed given; with load([1, 4]) a lone image runs on
    the batch-1 engine and is the same image within fp32's precision (other tiles)."""
    steps = dict(sampler="dpmpp-2m", steps=5)
    with Pipeline(weights, backend="cupy", precision="fp32") as pipe:
        pipe.load([4])
        three = pipe.sample(seeds=[21, 5, 13], **steps)
        four = pipe.sample(seeds=[21, 5, 13, 13], **steps)
        pipe.load([1, 4])
        alone = pipe.sample(seeds=[5], **steps)
        assert pipe.loaded == (1, 4) and set(pipe.engine_costs) == {1, 4}
    assert three.shape == (3,) + four.shape[1:]
    assert np.array_equal(three, four[:3])
    diff = np.abs(alone[0].astype(int) - three[1].astype(int))
    report(f"seed 5 on the batch-1 engine vs padded on batch 4: max |uint8 diff| {diff.max()}")
    assert diff.max() <= 1 and min(np.abs(three[i].astype(int) - three[0]).mean() for i in (1, 2)) > 1

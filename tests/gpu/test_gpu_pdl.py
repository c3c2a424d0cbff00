"""Programmatic dependent launch (runtime/gpu/launch_ex.py, sm_90+): the same U-Net call with and
without it. GRID_DEPENDENCY (kernels/common.cuh) changes only when a kernel's CTAs are placed, never
what or in which order they compute, so eps must be bit-identical to the plain launches (which the
float64 tests bound), run directly, run twice (a wait in the wrong place shows as a race) and replayed
from a CUDA graph; and a whole gpu-mode sampling run must give the same images."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import replayed_eps, report
from jetson_unet.executor.executor import GpuExecutor
from jetson_unet.executor.launch_ex import PDL_ENV
from jetson_unet.sampling.gpu import GpuSampler
from jetson_unet.model.schedule import make_steps


def needs_pdl(backend) -> None:
    if int(backend.arch()) < 90:
        pytest.skip(f"programmatic dependent launch needs sm_90+, this GPU is sm_{backend.arch()}")


@pytest.mark.gpu
@pytest.mark.parametrize("precision,batch", [("fp16", 1), ("fp16", 16), ("bf16", 3), ("fp32", 3)])
def test_pdl_call_is_bit_identical_to_plain_launches(backend, weights, precision, batch):
    needs_pdl(backend)
    c = weights.config
    rng = np.random.default_rng(100 + batch)
    x = rng.standard_normal((batch, c.channels, c.image_size, c.image_size)).astype(np.float32)
    t = rng.integers(0, c.timesteps, batch)
    with GpuExecutor(weights, precision, batch=batch, backend=backend, pdl=False) as ex:
        assert not ex.pdl
        want = ex.eps(x, t)
    with GpuExecutor(weights, precision, batch=batch, backend=backend, pdl=True) as ex:
        assert ex.pdl and "#define JETSON_UNET_PDL" in ex.kernels.source
        direct, again = ex.eps(x, t), ex.eps(x, t)
        replay = replayed_eps(ex, backend, direct)
        n = ex.launches_per_call
    report(f"pdl {precision} b{batch}: {n} launches, direct / again / graph replay bit-identical to plain: "
           f"{np.array_equal(direct, want)} / {np.array_equal(again, want)} / {np.array_equal(replay, want)}")
    assert np.isfinite(want).all()
    assert np.array_equal(direct, want)
    assert np.array_equal(again, want), "a second PDL call differs: a race"
    assert np.array_equal(replay, want)


@pytest.mark.gpu
def test_pdl_sampling_run_matches_plain(backend, weights, monkeypatch):
    needs_pdl(backend)
    steps = make_steps(weights.config.schedule, "ddim", 5, eta=0.5)
    out = {}
    for pdl in ("0", "1"):
        monkeypatch.setenv(PDL_ENV, pdl)
        s = GpuSampler(weights, "fp16", 2, mode="gpu", backend=backend)
        try:
            assert all(ex.pdl == (pdl == "1") for ex in s.executors)
            out[pdl] = s.run(steps, seed=3)
        finally:
            s.close()
    assert np.isfinite(out["0"]).all()
    assert np.array_equal(out["0"], out["1"])

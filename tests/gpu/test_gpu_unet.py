"""The whole U-Net on the GPU against the float64 reference, and CUDA-graph replay of one call."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import report
from runtime import models_dir
from runtime.config import UNetConfig
from runtime.gpu.executor import GpuExecutor
from runtime.reference import Reference
from runtime.weights import load_weights, random_params

# Relative L2 error of eps vs float64 over a whole call (~40 layers deep): fp32 arithmetic stays far
# below 1e-4; fp16/bf16 storage of every activation (u = 4.9e-4 / 3.9e-3) accumulates to < 1e-2.
UNET_TOL = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 1e-2}


class W:
    def __init__(self, cfg: UNetConfig, seed: int) -> None:
        self.config, self.params = cfg, random_params(cfg, seed)


@pytest.fixture(scope="module")
def case():
    path = models_dir() / "seed-unet-emoji64.npz"
    weights = load_weights(path) if path.is_file() else W(UNetConfig(), seed=5)
    cfg = weights.config
    rng = np.random.default_rng(123)
    x = rng.standard_normal((3, cfg.channels, cfg.image_size, cfg.image_size)).astype(np.float32)
    t = np.array([0, 47, cfg.timesteps - 1])
    want = Reference(weights, np.float64).eps(x, t)
    return weights, x, t, want, ("shipped" if path.is_file() else "random")


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("batch", [1, 3])
def test_unet_matches_float64_reference(backend, case, precision, batch):
    weights, x, t, want, kind = case
    with GpuExecutor(weights, precision, batch=batch, backend=backend) as ex:
        got = ex.eps(x[:batch], t[:batch])
        again = ex.eps(x[:batch], t[:batch])
        rep = ex.arena_report()
    assert got.shape == want[:batch].shape and got.dtype == np.float32
    assert np.isfinite(got).all()
    err = float(np.linalg.norm(got - want[:batch]) / np.linalg.norm(want[:batch]))
    report(f"unet {kind} {precision} b{batch}: rel L2 {err:.2e}; launches {ex.launches_per_call}; {rep['text']}")
    assert np.array_equal(got, again), "two calls on the same input differ: a race"
    assert err < UNET_TOL[precision]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16"])
def test_graph_replay_equals_direct_run(backend, case, precision):
    weights, x, t, want, _ = case
    with GpuExecutor(weights, precision, batch=3, backend=backend) as ex:
        direct = ex.eps(x, t)
        s = ex.stream
        backend.capture_begin(s)
        ex.run(s, ex.t_idx_ptr)
        graph = backend.capture_end(s)
        ex.upload_tensor("eps", np.full_like(direct, np.nan))
        graph.launch(s)
        s.synchronize()
        replay = ex.download_tensor("eps")
    assert np.array_equal(direct, replay)

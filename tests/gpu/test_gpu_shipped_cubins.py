"""The cubins shipped with the package, on this GPU: with an empty kernel cache and every compile path
made to fail, the shipped model's module loads from runtime/cubins/ once and serves batch 1 and 16,
whose U-Nets match the float64 reference. Skipped where the package ships nothing for this arch."""
from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.gpu import report
from jetson_unet.build import loader
from jetson_unet.build.loader import KernelSet
from jetson_unet.executor.executor import GpuExecutor
from jetson_unet.model.reference import Reference
from tools.build_kernels import SHIP_PRECISIONS, SHIP_SMS

TOL = {"fp32": 1e-4, "fp16": 1e-2}   # tests/gpu/test_gpu_unet.py's


def no_compile(*args, **kwargs):
    raise AssertionError("a kernel module was compiled: the shipped cubins did not serve this run")


@pytest.mark.gpu
@pytest.mark.parametrize("precision", SHIP_PRECISIONS)
def test_shipped_cubins_serve_every_batch_without_a_compile(backend, weights, tmp_path, monkeypatch, precision):
    arch = int(backend.arch())
    if arch not in SHIP_SMS or (arch < 80 and precision != "fp32"):
        pytest.skip(f"no shipped {precision} cubins for sm_{arch}")
    monkeypatch.setenv("JETSON_UNET_CACHE", str(tmp_path))                     # an empty user cache
    monkeypatch.setenv("JETSON_UNET_TILES", str(tmp_path / "no-user-tiles"))   # the shipped tuning files only
    monkeypatch.setattr(loader, "_build", no_compile)
    monkeypatch.setattr(type(backend), "compile_source", no_compile)
    monkeypatch.setattr(KernelSet, "_cache", {})
    cfg = weights.config
    rng = np.random.default_rng(5)
    x = rng.standard_normal((16, cfg.channels, cfg.image_size, cfg.image_size)).astype(np.float32)
    t = (np.arange(16) * 61) % cfg.timesteps
    want = Reference(weights, np.float64).eps(x[:3], t[:3])
    n = len(loader.LOADS)
    for batch in (1, 16):
        with GpuExecutor(weights, precision, batch=batch, backend=backend) as ex:
            got = ex.eps(x[:batch], t[:batch])[:3]
        err = float(np.linalg.norm(got - want[:batch]) / np.linalg.norm(want[:batch]))
        report(f"shipped cubins sm_{arch} {precision} b{batch}: rel L2 {err:.2e}; loads {loader.LOADS[n:]}")
        assert np.isfinite(got).all() and err < TOL[precision]
    assert [origin for origin, _ in loader.LOADS[n:]] == ["shipped"], "one shipped module for both batch sizes"
    assert not list(tmp_path.rglob("*.cubin"))

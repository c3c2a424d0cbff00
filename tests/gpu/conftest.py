"""GPU tests: skipped when no GPU is usable (the backend raises BackendUnavailable).

Tests that take `conv_variant` run with the runtime's default conv kernels (the cp.async conv with
DEFAULT_STAGES stages, id conv-s3) and, when $JETSON_UNET_CONV_STAGES names another variant (0: the
register-staged conv_gemm; 2..6 stages), once more with that one:
    JETSON_UNET_CONV_STAGES=0 python3 -m pytest -m gpu tests/gpu/test_gpu_ops.py tests/gpu/test_gpu_unet.py
"""
from __future__ import annotations

import os
import re
from typing import Any

import numpy as np
import pytest

from jetson_unet.errors import BackendUnavailable

from jetson_unet.ops.common import DEFAULT_STAGES, STAGES_ENV, stages_from_env  # noqa: E402

CONV_VARIANTS = list(dict.fromkeys([DEFAULT_STAGES, stages_from_env()]))


@pytest.fixture(scope="session")
def backend() -> Any:
    try:
        from jetson_unet.backends import get_backend
        return get_backend("cupy")
    except (BackendUnavailable, ImportError) as e:
        pytest.skip(f"no usable GPU: {e}")


@pytest.fixture(scope="module")
def weights() -> Any:
    """The shipped model, or random weights of the default config where it is absent."""
    from jetson_unet.paths import models_dir
    from jetson_unet.model.config import UNetConfig
    from jetson_unet.model.weights import Weights, load_weights, random_params
    path = models_dir() / "seed-unet-emoji64.npz"
    if path.is_file():
        return load_weights(path)
    cfg = UNetConfig()
    return Weights("random", cfg, random_params(cfg, 4), {"param_dtype": "float32"})


def replayed_eps(ex: Any, backend: Any, like: Any) -> Any:
    """eps of one call of `ex` (timesteps at t_idx) captured as a CUDA graph and replayed over an eps
    poisoned with NaN (`like`: an eps of the right shape)."""
    s = ex.stream
    backend.capture_begin(s)
    ex.run(s, ex.t_idx_ptr)
    graph = backend.capture_end(s)
    ex.upload_tensor("eps", np.full_like(like, np.nan))
    graph.launch(s)
    s.synchronize()
    return ex.download_tensor("eps")


def report(line: str) -> None:
    """Append a line to $GPU_REPORT (if set): per-op errors survive a passing, quiet run."""
    path = os.environ.get("GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def pytest_generate_tests(metafunc: Any) -> None:
    if "conv_variant" in metafunc.fixturenames:
        metafunc.parametrize("conv_variant", CONV_VARIANTS, ids=[f"conv-s{s}" for s in CONV_VARIANTS],
                             indirect=True)


@pytest.fixture
def conv_variant(request: Any, monkeypatch: Any) -> int:
    """The conv kernel family executors built in this test get: 0 = conv_gemm, n = cp.async, n stages."""
    stages = getattr(request, "param", DEFAULT_STAGES)
    monkeypatch.setenv(STAGES_ENV, str(stages))
    return stages


def variant_applies(conv_variant: int, precision: str) -> bool:
    """Whether this (variant, precision) case is worth running: fp32 runs conv_gemm (FFMA) whatever
    the variant, so it runs once, under the first variant."""
    return precision != "fp32" or conv_variant == CONV_VARIANTS[0]


def expects_pipelined(conv_variant: int, precision: str) -> bool:
    """Whether an executor of this case should launch cp.async conv kernels at all."""
    return bool(conv_variant) and precision != "fp32"


def pipelined_symbols(ex: Any) -> list:
    """Launch symbols of an executor that run the cp.async conv (suffix _s<stages>)."""
    return [L.fn.symbol for L in ex.launches if re.search(r"_s\d+$", L.fn.symbol)]


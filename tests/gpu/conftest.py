"""GPU tests: skipped when no GPU is usable (the backend raises BackendUnavailable).

With $JETSON_UNET_CONV_STAGES set (e.g. 3), tests that take `conv_variant` run twice: with the
default conv kernels (conv-s0) and with the opt-in cp.async conv (conv-s3). Unset, they run once,
under their usual ids:
    JETSON_UNET_CONV_STAGES=3 python3 -m pytest -m gpu tests/gpu/test_gpu_ops.py tests/gpu/test_gpu_unet.py
"""
from __future__ import annotations

import os
import re
from typing import Any

import pytest

from runtime.errors import BackendUnavailable

STAGES_ENV = "JETSON_UNET_CONV_STAGES"
_STAGES = os.environ.get(STAGES_ENV, "").strip()
CONV_VARIANTS = [0] + ([int(_STAGES)] if _STAGES not in ("", "0") else [])


@pytest.fixture(scope="session")
def backend() -> Any:
    try:
        from runtime.gpu.backend import get_backend
        return get_backend("cupy")
    except (BackendUnavailable, ImportError) as e:
        pytest.skip(f"no usable GPU: {e}")


def report(line: str) -> None:
    """Append a line to $GPU_REPORT (if set): per-op errors survive a passing, quiet run."""
    path = os.environ.get("GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def pytest_generate_tests(metafunc: Any) -> None:
    if "conv_variant" in metafunc.fixturenames and len(CONV_VARIANTS) > 1:
        metafunc.parametrize("conv_variant", CONV_VARIANTS, ids=[f"conv-s{s}" for s in CONV_VARIANTS],
                             indirect=True)


@pytest.fixture
def conv_variant(request: Any, monkeypatch: Any) -> int:
    """The conv kernel family executors built in this test get: 0 = default, n = cp.async, n stages."""
    stages = getattr(request, "param", 0)
    if stages:
        monkeypatch.setenv(STAGES_ENV, str(stages))
    else:
        monkeypatch.delenv(STAGES_ENV, raising=False)
    return stages


def pipelined_symbols(ex: Any) -> list:
    """Launch symbols of an executor that run the cp.async conv (suffix _s<stages>)."""
    return [L.fn.symbol for L in ex.launches if re.search(r"_s\d+$", L.fn.symbol)]


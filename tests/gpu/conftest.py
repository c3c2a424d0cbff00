"""GPU tests: skipped when no GPU is usable (the backend raises BackendUnavailable)."""
from __future__ import annotations

import os
from typing import Any

import pytest

from runtime.errors import BackendUnavailable


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

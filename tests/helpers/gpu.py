"""Plain helpers of the GPU tests (their fixtures are in tests/gpu/conftest.py)."""
from __future__ import annotations

import os
import re
from typing import Any

import numpy as np


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


def pipelined_symbols(ex: Any) -> list:
    """Launch symbols of an executor that run the cp.async conv (suffix _s<stages>)."""
    return [L.fn.symbol for L in ex.launches if re.search(r"_s\d+$", L.fn.symbol)]


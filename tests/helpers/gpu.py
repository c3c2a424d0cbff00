"""Plain helpers of the GPU tests (their fixtures are in tests/gpu/conftest.py)."""
from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

from jetson_unet.ops.common import TileChoice, cdiv
from jetson_unet.ops.keys import ConvKey


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
    """Launch symbols of an executor that run the cp.async conv (_s<stages>, then its features)."""
    return [L.fn.symbol for L in ex.launches if re.search(r"_s\d+_x\w+$", L.fn.symbol)]


def gemm_tiles(ex) -> dict:
    """Every GEMM conv and gate of `ex` on conv_gemm: its tile without stages (BK 32, no k slices), at
    most 128 rows and 4 warps (a row tile of 4 x 64 pixels is 256 rows of 8 warps, more than conv_gemm's
    static shared memory and copy split hold), its split-K kept."""
    out = {}
    for s in ex.specs:
        k = s.key
        if isinstance(k, ConvKey):
            splits = s.grid[0] // cdiv(ex.plan.tensors[s.op.out].size ** 2, k.bm)
            bm, wm = min(k.bm, 128), k.wm
            while wm * k.wn > 4 and wm > 1:   # 4 warps: an 8-warp row tile's B copies do not split over 256 threads
                wm //= 2
            out[s.op.out] = TileChoice(bm, k.bn, min(wm, bm // 16), k.wn, 32, 0, splits=splits)
    return out

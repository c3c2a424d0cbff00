"""Lab tools for kernel work, apart from the product and not installed; run from the repo root as
`python -m tools.lab.<name>`: `knockout` (time the working tree against copies with parts of the
kernels removed, another revision's kernels or an environment setting), `gemm_ceiling` (our GEMM
convs against cuBLAS, cuDNN and Triton on the same shapes), `ncu_ops` (chosen launches inside an
NVTX range for Nsight Compute), `roofline` (FLOP and byte floors of every op, measured against
this GPU, and the Orin Nano prediction), `mma_peak` (the `mma.sync` issue rate), `ring_stream`
(what a `cp.async` ring feeds from L2) and `neighbour_tiles` (another batch's tuning file at a batch).
"""
from __future__ import annotations

import sys
from typing import Any, Optional


def cupy_backend(tool: str, sms: Optional[int]) -> Optional[Any]:
    """The CuPy backend on `sms` SMs (None: the whole GPU), or None after one line on stderr that
    names `tool` and why no GPU is usable."""
    from jetson_unet.backends import get_backend, gpu_available
    reason = gpu_available("cupy")
    if reason is not None:
        print(f"{tool}: needs a GPU ({reason})", file=sys.stderr)
        return None
    return get_backend("cupy", sms)

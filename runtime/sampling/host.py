"""The CPU path's memory guard: what one sampling call on the NumPy backend holds in host memory,
and the refusal (ArenaError, as the GPU path's) of a batch that does not fit what the host has
available, before any work starts.

The reference runs the U-Net image by image (jetson_unet.model.reference: an image's eps is the same
bits whatever its batch), so the U-Net's activations are a FIXED part, and only the sampling loop's
arrays grow with the batch (the PER-IMAGE part):

    fixed     = itemsize * (every plan tensor of one image (the env keeps them all)
                            + the largest op's workspace (im2col columns + 4 arrays of its input/output))
                + the parameters cast to the reference's dtype (when the file holds another dtype)
                + 1 MB of Python objects
    per image = n * (3 * 4 + 3 * itemsize + 5 * 8) + a generator,   n = channels * size^2
                (float32 x, h and z; eps per image, concatenated and the input's cast, in the
                reference's dtype; p_sample's float64 temporaries)

Measured (tracemalloc, tests/core/test_memory_guard.py): the shipped 64x64 model in fp32 holds
~39 MB for a batch-1 call (plus its 64 MB parameter cast on the first call) and ~0.64 MB more
per image (52 bytes per element, dpmpp-2m; the formula says 0.79 MB).
"""
from __future__ import annotations

import logging
import os
from typing import Any, Optional

import numpy as np

from jetson_unet.errors import ArenaError
from jetson_unet.model.plan import CONV, build_plan

log = logging.getLogger(__name__)

LOOP_F32 = 3          # x, h and z of every image, float32
LOOP_EPS = 3          # eps: per image, concatenated, and the input cast to the reference's dtype
LOOP_F64 = 5          # p_sample's float64 arrays alive at once (x, eps, the result, two products)
GENERATOR_BYTES = 1024   # an image's PCG64 generator (measured: ~860 bytes)
OP_ARRAYS = 4         # an op's temporaries besides its im2col columns: pad, norm, matmul, activation
PYTHON_BYTES = 1 << 20   # the env dict, array headers, the time tables: ~25 KB measured on small configs
GB = 1e9


def fixed_bytes(weights: Any, dtype: Any) -> int:
    """Host bytes a call holds whatever its batch: one image's U-Net pass and the parameter cast."""
    itemsize = np.dtype(dtype).itemsize
    plan = build_plan(weights.config)
    tensors = sum(t.numel for t in plan.tensors.values())
    cast = sum(v.size for v in weights.params.values() if v.dtype != np.dtype(dtype))
    return itemsize * (tensors + max(_workspace(plan, op) for op in plan.ops) + cast) + PYTHON_BYTES


def _workspace(plan: Any, op: Any) -> int:
    """Elements one op holds beside the env: its im2col columns (a k x k conv) and a few arrays the
    size of its input (after up2 / unshuffle) or output."""
    t_in, t_out = plan.tensors[op.x], plan.tensors[op.out]
    n_in = t_in.numel * (4 if op.in_map == "up2" else 1)
    cols = t_out.size ** 2 * t_in.channels * op.k * op.k if op.kind == CONV and op.k > 1 and op.groups == 1 else 0
    return cols + OP_ARRAYS * max(n_in, t_out.numel)


def image_bytes(config: Any, dtype: Any) -> int:
    """Host bytes each image of a batch adds: the sampling loop's arrays and its generator."""
    n = config.channels * config.image_size ** 2
    return n * (4 * LOOP_F32 + np.dtype(dtype).itemsize * LOOP_EPS + 8 * LOOP_F64) + GENERATOR_BYTES


def host_bytes(weights: Any, dtype: Any, batch: int) -> int:
    """About what a NumPy-backend sampling call of `batch` images holds at its peak."""
    return fixed_bytes(weights, dtype) + batch * image_bytes(weights.config, dtype)


def available_bytes(meminfo: str = "/proc/meminfo") -> Optional[int]:
    """Host memory available to a new allocation: MemAvailable (Linux), else the free physical pages
    (os.sysconf), else None (cannot tell: no check)."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return None


def check_host_fits(weights: Any, dtype: Any, batch: int, available: Optional[int] = None) -> None:
    """Refuse (ArenaError, one line with the largest batch that fits) a NumPy-backend batch that
    needs more host memory than is available, before anything is drawn or run."""
    free = available_bytes() if available is None else available
    need = host_bytes(weights, dtype, batch)
    if free is None:
        log.debug("host memory available: unknown; batch %d needs about %d bytes", batch, need)
        return
    if need <= free:
        return
    fixed, per = fixed_bytes(weights, dtype), image_bytes(weights.config, dtype)
    fits = max(0, (free - fixed) // per)
    raise ArenaError(f"batch {batch} needs about {need / GB:.1f} GB of host memory on the numpy backend "
                     f"({np.dtype(dtype).name}: {fixed / 1e6:.0f} MB + {per / 1e6:.2f} MB per image), "
                     f"{free / GB:.1f} GB available: the largest batch that fits is {fits}")

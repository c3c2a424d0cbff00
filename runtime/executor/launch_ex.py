"""Programmatic dependent launch (PDL) through the driver's cuLaunchKernelEx, for the CuPy backend.

A U-Net call is ~75 kernels in a row on one stream. Normally a kernel's CTAs are placed only after
the previous kernel has drained and its completion has been processed. A launch with the attribute
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION may start as the previous kernel's CTAs exit;
each kernel of a module built with JETSON_UNET_PDL waits (`griddepcontrol.wait`, GRID_DEPENDENCY in
kernels/common.cuh) for the previous one's completion and writes before anything else, so the order of
reads and writes is unchanged. Stream capture keeps the attribute as a programmatic edge of the CUDA
graph. Measured on an H200 (docs/perf-notes.md, session 23): a graphed call 0.388 -> 0.376 ms at
batch 1, 0.992 -> 0.990 at batch 16, the results bit-identical.

sm_90 and later only (H100, H200, Jetson Thor): the Orin's sm_87 has no griddepcontrol, and the
executor never asks for it there. Off by default ($JETSON_UNET_PDL=1 or GpuExecutor(pdl=True)): the
default path stays the one the Orin runs. CuPy has no binding for cuLaunchKernelEx, hence ctypes.
"""
from __future__ import annotations

import ctypes
import os
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from jetson_unet.errors import BackendUnavailable, ConfigError, LaunchError

MIN_ARCH = 90                    # griddepcontrol needs sm_90
_ATTR_PROGRAMMATIC = 6           # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuda.h)


class _Attr(ctypes.Structure):   # CUlaunchAttribute: id, pad to 8, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("smem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_Attr)), ("num_attrs", ctypes.c_uint)]


class Params:
    """A kernel's arguments (numpy fixed-width scalars) as the void*[] that cuLaunchKernelEx reads:
    each value in one buffer, at its own size's alignment. Kept with the launch that owns it."""

    def __init__(self, args: Sequence[Any]) -> None:
        vals = [a if isinstance(a, np.generic) else None for a in args]
        if any(v is None for v in vals):
            raise TypeError("kernel arguments must be numpy fixed-width scalars (np.uint64 / np.int32 / np.float32)")
        self.args = tuple(vals)
        offs, end = [], 0
        for v in vals:
            end = -(-end // v.itemsize) * v.itemsize
            offs.append(end)
            end += v.itemsize
        self._buf = ctypes.create_string_buffer(max(end, 1))
        for o, v in zip(offs, vals):
            ctypes.memmove(ctypes.addressof(self._buf) + o, v.tobytes(), v.itemsize)
        base = ctypes.addressof(self._buf)
        self.ptrs = (ctypes.c_void_p * max(len(vals), 1))(*[base + o for o in offs])


class Driver:
    """libcuda's cuLaunchKernelEx, loaded once per process."""

    def __init__(self) -> None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            self._fn = lib.cuLaunchKernelEx
        except (OSError, AttributeError) as e:   # no driver, or one older than CUDA 11.8
            raise BackendUnavailable(f"programmatic dependent launch needs libcuda's cuLaunchKernelEx: {e}") from None
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._name = lib.cuGetErrorName
        self._name.restype = ctypes.c_int
        self._name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self._attr = _Attr(id=_ATTR_PROGRAMMATIC)
        self._attr.value[0] = 1

    def launch(self, func: int, grid: Tuple[int, ...], block: Tuple[int, ...], params: Params, smem: int,
               stream: int, symbol: str) -> None:
        cfg = _Config((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), int(smem), ctypes.c_void_p(stream),
                      ctypes.pointer(self._attr), 1)
        rc = self._fn(ctypes.byref(cfg), ctypes.c_void_p(func), params.ptrs, None)
        if rc != 0:
            name = ctypes.c_char_p()
            known = self._name(rc, ctypes.byref(name)) == 0 and name.value
            raise LaunchError(f"launching {symbol} (grid {grid}, block {block}, {smem} B dynamic smem) failed: "
                              f"{name.value.decode() if known else 'CUresult'} ({rc})")


_DRIVER: Dict[str, Driver] = {}


def driver() -> Driver:
    if "cuda" not in _DRIVER:
        _DRIVER["cuda"] = Driver()
    return _DRIVER["cuda"]


PDL_ENV = "JETSON_UNET_PDL"


def pdl_from_env(environ: Optional[Mapping[str, str]] = None) -> bool:
    """$JETSON_UNET_PDL: 1 -> programmatic dependent launch where the GPU and backend allow it
    (sm_90+, CuPy); unset, empty or 0 -> off (the default: the sm_87 path, launch for launch)."""
    raw = (os.environ if environ is None else environ).get(PDL_ENV, "").strip()
    if raw not in ("", "0", "1"):
        raise ConfigError(f"${PDL_ENV} must be 0 or 1, got {raw!r}")
    return raw == "1"

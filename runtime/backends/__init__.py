"""GPU backends behind one interface (jetson_unet.backends.base.Backend): CuPy first, pycuda for
images without CuPy. One backend object of each kind per process."""
from __future__ import annotations

from typing import Dict, Optional

from jetson_unet.backends.base import Backend
from jetson_unet.backends.cupy import CupyBackend
from jetson_unet.errors import BackendUnavailable

BACKENDS = ("cupy", "pycuda")
_CACHE: Dict[str, Backend] = {}


def get_backend(name: str = "cupy") -> Backend:
    """The process-wide backend of that name (raises BackendUnavailable with one clear line)."""
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown GPU backend {name!r} (choose from {', '.join(BACKENDS)})")
    if name not in _CACHE:
        if name == "pycuda":   # imported lazily: pycuda is optional (docs/pycuda.md)
            from jetson_unet.backends.pycuda import PycudaBackend
            _CACHE[name] = PycudaBackend()
        else:
            _CACHE[name] = CupyBackend()
    return _CACHE[name]


def gpu_available(name: str = "cupy") -> Optional[str]:
    """None when the backend is usable, else the one-line reason."""
    try:
        get_backend(name)
        return None
    except BackendUnavailable as e:
        return str(e)

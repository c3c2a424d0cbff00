"""GPU backends behind one interface (jetson_unet.backends.base.Backend): CuPy first, pycuda for
images without CuPy. One backend object of each kind (and SM slice) per process."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from jetson_unet.backends.base import Backend
from jetson_unet.backends.cupy import CupyBackend
from jetson_unet.errors import BackendUnavailable

BACKENDS = ("cupy", "pycuda")
_CACHE: Dict[Tuple[str, Optional[int]], Backend] = {}


def get_backend(name: str = "cupy", sms: Optional[int] = None) -> Backend:
    """The process-wide backend of that name (raises BackendUnavailable with one clear line); sms: the
    one whose streams run in a green context of that many SMs (CuPy only)."""
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown GPU backend {name!r} (choose from {', '.join(BACKENDS)})")
    if sms is not None and name != "cupy":
        raise BackendUnavailable(f"an SM slice (--sms) needs the cupy backend, not {name}")
    if (name, sms) not in _CACHE:
        if name == "pycuda":   # imported lazily: pycuda is optional (docs/pycuda.md)
            from jetson_unet.backends.pycuda import PycudaBackend
            _CACHE[name, sms] = PycudaBackend()
        else:
            _CACHE[name, sms] = CupyBackend(sms=sms)
    return _CACHE[name, sms]


def gpu_available(name: str = "cupy") -> Optional[str]:
    """None when the backend is usable, else the one-line reason."""
    try:
        get_backend(name)
        return None
    except BackendUnavailable as e:
        return str(e)

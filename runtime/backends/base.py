"""The backend seam: what every backend hands out.
"""
from __future__ import annotations

from typing import Any


class DeviceBuffer:
    """One raw device allocation; `ptr` is its address."""

    def __init__(self, mem: Any, ptr: int, nbytes: int) -> None:
        self._mem, self.ptr, self.nbytes = mem, int(ptr), int(nbytes)

    def free(self) -> None:
        self._mem = None   # the owning object releases the memory when dropped
        self.ptr = 0

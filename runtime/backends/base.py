"""The backend seam: every piece of device work (allocate, copy, load a module, launch, streams,
events, graphs) goes through this interface. `CupyBackend` (jetson_unet.backends.cupy) and
`PycudaBackend` (jetson_unet.backends.pycuda) implement it; the tests' fakes do too.

Backends compile nothing themselves: jetson_unet.build turns source text into cubins with the
compiler a backend names (`compiler`), keeps them in one validated cache, and hands the backend a
cubin file to load (`load_cubin`). `compile_source` is the fallback where no cubin can be built here.
"""
from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence, Tuple

import numpy as np


class DeviceBuffer:
    """One raw device allocation; `ptr` is its address."""

    def __init__(self, mem: Any, ptr: int, nbytes: int) -> None:
        self._mem, self.ptr, self.nbytes = mem, int(ptr), int(nbytes)

    def free(self) -> None:
        self._mem = None   # the owning object releases the memory when dropped
        self.ptr = 0


class Function(Protocol):
    symbol: str

    def set_max_dynamic_shared(self, nbytes: int) -> None:
        """Raise (never lower) the dynamic shared-memory opt-in of the kernel."""

    def launch(self, grid: Tuple[int, ...], block: Tuple[int, ...], args: Tuple[Any, ...],
               shared_mem: int = 0, stream: Any = None) -> None:
        """Enqueue; args are numpy fixed-width scalars (np.uint64 pointers, np.int32, np.float32)."""


class Module(Protocol):
    def get(self, symbol: str) -> Function:
        """The kernel of that name (KernelCompileError when the module has none)."""


class Event(Protocol):
    def record(self, stream: Any) -> None: ...
    def synchronize(self) -> None: ...
    def done(self) -> bool: ...
    def elapsed_ms(self, later: "Event") -> float: ...


class Backend(Protocol):
    name: str                  # "cupy" | "pycuda"
    supports_graphs: bool      # CUDA-graph capture (pycuda has no capture API)
    compiler: Optional[str]    # what jetson_unet.build compiles its cubins with: "nvrtc" (CuPy's binding) or
    #                            "nvcc"; None: no cubins, every module through compile_source

    # -- facts
    def device_name(self) -> str: ...
    def arch(self) -> int: ...                       # 87 for sm_87
    def sm_count(self) -> int: ...
    def integrated(self) -> bool: ...                # shares the CPU's DRAM (every Jetson)
    def mem_info(self) -> Tuple[int, int]: ...       # (free, total) bytes

    # -- memory
    def alloc(self, nbytes: int) -> DeviceBuffer: ...
    def pinned(self, shape: Sequence[int], dtype: Any) -> np.ndarray: ...
    def trim_pinned(self) -> None: ...               # page-locked memory no array holds, back to the OS
    def h2d(self, dst_ptr: int, host: np.ndarray, stream: Any) -> None: ...   # async from pinned memory
    def d2h(self, host: np.ndarray, src_ptr: int, stream: Any) -> None: ...

    # -- streams, events, graphs, profiler ranges
    def stream(self) -> Any: ...                     # non-blocking; .synchronize(), .ptr
    def event(self, timing: bool = True) -> Event: ...
    def wait(self, stream: Any, event: Event) -> None: ...
    def capture_begin(self, stream: Any) -> None: ...
    def capture_end(self, stream: Any) -> Any: ...   # a graph: .launch(stream)
    def nvtx_push(self, name: str) -> None: ...      # a no-op where there is no NVTX
    def nvtx_pop(self) -> None: ...

    # -- modules
    def load_cubin(self, path: Any, symbols: Sequence[str] = ()) -> Module: ...
    def compile_source(self, source: str, source_name: str, options: Tuple[str, ...],
                       symbols: Sequence[str] = ()) -> Module: ...

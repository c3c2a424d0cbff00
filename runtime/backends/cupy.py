"""The CuPy backend: device work through CuPy's runtime bindings (no array operators, no cuBLAS), so
anything enqueued through it can be captured in a CUDA graph.
"""
from __future__ import annotations

import numpy as np
from typing import Any, Dict, Optional, Sequence, Tuple

from jetson_unet.backends.base import DeviceBuffer
from jetson_unet.errors import BackendUnavailable, KernelCompileError


class CupyFunction:
    def __init__(self, kern: Any, symbol: str) -> None:
        self._kern, self.symbol = kern, symbol
        self._max_dyn = 0

    def set_max_dynamic_shared(self, nbytes: int) -> None:
        """Raise (never lower: executors of one process share the function) the dynamic smem opt-in."""
        if int(nbytes) > self._max_dyn:
            self._kern.max_dynamic_shared_size_bytes = self._max_dyn = int(nbytes)

    def launch(self, grid: Tuple[int, ...], block: Tuple[int, ...], args: Tuple[Any, ...],
               shared_mem: int = 0, stream: Any = None) -> None:
        self._kern(grid, block, args, shared_mem=shared_mem, stream=stream)



class CupyModule:
    """RawModule(code=...) (NVRTC inside CuPy, compiled lazily) or RawModule(path=...) (a cubin,
    loaded by the driver on the first get_function)."""

    def __init__(self, cp: Any, source: Optional[str], name: str, options: Tuple[str, ...],
                 path: Optional[str] = None) -> None:
        self._cp, self.name, self.options, self.path = cp, name, options, path
        self._mod = cp.RawModule(path=path) if path is not None else cp.RawModule(code=source, options=options)
        self._funcs: Dict[str, CupyFunction] = {}

    def get(self, symbol: str) -> CupyFunction:
        if symbol not in self._funcs:
            try:
                kern = self._mod.get_function(symbol)
            except self._cp.cuda.compiler.CompileException as e:
                raise KernelCompileError(self.name, self.options, e.get_message()) from None
            except Exception as e:   # a cubin the driver refuses (CUDADriverError), or no such kernel
                if self.path is None:
                    raise
                raise KernelCompileError(self.path, (), f"loading {symbol!r} failed: {type(e).__name__}: {e}") from None
            self._funcs[symbol] = CupyFunction(kern, symbol)
        return self._funcs[symbol]


class CupyBackend:
    name = "cupy"
    supports_graphs = True
    compiler = "nvrtc"   # CuPy's NVRTC binding (jetson_unet.build.compilers)

    def __init__(self, device: int = 0, sms: Optional[int] = None) -> None:
        """sms: run every stream in a green context of that many SMs (jetson_unet.backends.greenctx)."""
        try:
            import cupy
            import cupyx
        except Exception as e:  # ImportError, or a broken CUDA install raising at import
            raise BackendUnavailable(f"CuPy is not usable ({type(e).__name__}: {e}); "
                                     "install the extra that matches your CUDA, e.g. .[cuda12]") from None
        try:   # is_available() raises on CuPy 13.6 instead of returning False
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as e:
            raise BackendUnavailable(f"no usable CUDA GPU ({type(e).__name__}: {e})") from None
        if count < 1:
            raise BackendUnavailable("no CUDA GPU found")
        self.cp, self.cpx, self.rt = cupy, cupyx, cupy.cuda.runtime
        self.device = cupy.cuda.Device(device)
        self.device.use()
        self.slice = None
        if sms is not None:
            from jetson_unet.backends.greenctx import SmSlice
            self.rt.free(self.rt.malloc(1))   # the primary context exists before the green one
            self.slice = SmSlice(int(sms), self.device.id)

    # -- facts --------------------------------------------------------------------------
    def device_name(self) -> str:
        name = self.rt.getDeviceProperties(self.device.id)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)

    def arch(self) -> int:
        return int(self.device.compute_capability)

    def sm_count(self) -> int:
        """The SMs the work can use: the slice's, else the device's."""
        if self.slice is not None:
            return self.slice.sm_count
        return int(self.rt.getDeviceProperties(self.device.id)["multiProcessorCount"])

    def mem_info(self) -> Tuple[int, int]:
        free, total = self.rt.memGetInfo()
        return int(free), int(total)

    def integrated(self) -> bool:
        """True on a GPU that shares the CPU's DRAM (every Jetson): pinned host memory then counts
        against the same free memory as device allocations."""
        return bool(self.rt.getDeviceProperties(self.device.id)["integrated"])

    # -- memory -------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> DeviceBuffer:
        mem = self.cp.cuda.Memory(max(int(nbytes), 1))   # a plain cudaMalloc, not the pool
        return DeviceBuffer(mem, mem.ptr, nbytes)

    def pinned(self, shape: Sequence[int], dtype: Any) -> np.ndarray:
        return self.cpx.empty_pinned(tuple(shape), dtype=dtype)

    def trim_pinned(self) -> None:
        """CuPy keeps a freed page-locked block in its pool for the next array of that size: on a
        Jetson that is the board's DRAM, so what no array holds goes back."""
        self.cp.get_default_pinned_memory_pool().free_all_blocks()

    def h2d(self, dst_ptr: int, host: np.ndarray, stream: Any) -> None:
        """Asynchronous when `host` is pinned; a pageable source makes it synchronous."""
        assert host.flags.c_contiguous
        self.rt.memcpyAsync(int(dst_ptr), host.ctypes.data, host.nbytes,
                            self.rt.memcpyHostToDevice, stream.ptr)

    def d2h(self, host: np.ndarray, src_ptr: int, stream: Any) -> None:
        assert host.flags.c_contiguous
        self.rt.memcpyAsync(host.ctypes.data, int(src_ptr), host.nbytes,
                            self.rt.memcpyDeviceToHost, stream.ptr)

    # -- streams, events, graphs -----------------------------------------------------------
    def stream(self) -> Any:
        if self.slice is not None:
            return external_stream(self.cp, self.slice.stream(), self.device.id)
        return self.cp.cuda.Stream(non_blocking=True)

    def event(self, timing: bool = True) -> "CupyEvent":
        return CupyEvent(self.cp, timing)

    def wait(self, stream: Any, event: "CupyEvent") -> None:
        stream.wait_event(event.raw)

    def nvtx_push(self, name: str) -> None:
        """A named host range for Nsight Systems (a no-op where CuPy has no NVTX)."""
        try:
            self.cp.cuda.nvtx.RangePush(name)
        except Exception:
            pass

    def nvtx_pop(self) -> None:
        try:
            self.cp.cuda.nvtx.RangePop()
        except Exception:
            pass

    def capture_begin(self, stream: Any) -> None:
        stream.begin_capture()

    def capture_end(self, stream: Any) -> Any:
        return stream.end_capture()   # a cupy.cuda.graph.Graph: .launch(stream)

    # -- kernels --------------------------------------------------------------------------
    def compile_source(self, source: str, source_name: str, options: Tuple[str, ...],
                       symbols: Sequence[str] = ()) -> CupyModule:
        """CuPy's own NVRTC path (RawModule(code=...), its disk cache), where no cubin can be built
        here: a CuPy whose binding has no cubin output, or a GPU newer than its NVRTC (CuPy then
        builds PTX for the driver to finish)."""
        mod = CupyModule(self.cp, source, source_name, tuple(options))
        for s in symbols:   # compile and load now, never during a capture
            mod.get(s)
        return mod

    def load_cubin(self, path: Any, symbols: Sequence[str] = ()) -> CupyModule:
        """Load a cubin file (cupy.RawModule(path=...)) and fetch every symbol now."""
        mod = CupyModule(self.cp, None, str(path), (), path=str(path))
        for s in symbols:
            mod.get(s)
        return mod


class CupyEvent:
    def __init__(self, cp: Any, timing: bool) -> None:
        self._cp = cp
        self.raw = cp.cuda.Event(disable_timing=not timing)

    def record(self, stream: Any) -> None:
        self.raw.record(stream)

    def synchronize(self) -> None:
        self.raw.synchronize()

    def done(self) -> bool:
        return bool(self.raw.done)

    def elapsed_ms(self, later: "CupyEvent") -> float:
        return float(self._cp.cuda.get_elapsed_time(self.raw, later.raw))


class StreamHandle:
    """A raw CUstream under the CUDA stream protocol (`__cuda_stream__`: version 0, the handle)."""

    def __init__(self, handle: int) -> None:
        self.handle = int(handle)

    def __cuda_stream__(self) -> Tuple[int, int]:
        return (0, self.handle)


def external_stream(cp: Any, handle: int, device_id: int) -> Any:
    """A CuPy stream over a stream CuPy did not create (a green context's): `Stream.from_external`
    where CuPy has it (14 deprecates `ExternalStream`), else `ExternalStream`. The caller keeps the
    stream alive."""
    from_external = getattr(cp.cuda.Stream, "from_external", None)
    if from_external is not None:
        return from_external(StreamHandle(handle))
    return cp.cuda.ExternalStream(handle, device_id)

"""The pycuda backend (`--backend pycuda`): the interface of `CupyBackend`, through pycuda's driver
API, for Jetson images with pycuda and nvcc but no CuPy. Same plan, same kernels/*.cu, same
launches; no CUDA graphs (pycuda has no stream-capture API), so gpu mode runs with graphs=False.

Context: the device's *primary* context (what `pycuda.autoprimaryctx` retains, and what CuPy's
runtime API uses), so both backends can live in one process without one's allocations landing in
the other's context. Nothing else is shared: buffers, streams, events and modules belong to the
backend object that made them. pycuda keeps a per-thread context stack and aborts the process when
a thread exits with a context still pushed; so the main thread keeps the context pushed (popped at
exit, as autoprimaryctx does) and any other thread pushes it for the length of each call.

Kernels: cubins from the one cubin cache of jetson_unet.build (made by nvcc on this machine, or ahead
of time by `jetson-sample --prepare` anywhere), loaded with `module_from_file`. No nvcc is needed
where the cache already holds the modules.
"""
from __future__ import annotations

import atexit
import threading
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from jetson_unet.errors import BackendUnavailable, KernelCompileError
from jetson_unet.backends.base import DeviceBuffer

NO_GRAPHS = "pycuda has no CUDA-graph capture API; use graphs=False (jetson-sample --no-graphs)"
NO_NVCC = ("no cached cubin for these kernels and no nvcc to build one (on PATH, $CUDA_ROOT/bin or "
           "/usr/local/cuda/bin; JetPack: export PATH=/usr/local/cuda/bin:$PATH), or build them anywhere "
           "with `jetson-sample --prepare` and copy the cache")
NON_BLOCKING = 1          # CU_STREAM_NON_BLOCKING (pycuda exposes no enum for stream flags)


# ---- context handling -----------------------------------------------------------------------------------
class _Active:
    """`with self._active:` makes the primary context current on the calling thread for one call."""

    def __init__(self, ctx: Any, pop: Callable[[], None], resident: Optional[int]) -> None:
        self.ctx, self.pop, self.resident, self.tls = ctx, pop, resident, threading.local()

    def __enter__(self) -> None:
        if threading.get_ident() != self.resident:
            depth = getattr(self.tls, "depth", 0)
            if depth == 0:
                self.ctx.push()
            self.tls.depth = depth + 1

    def __exit__(self, *exc: Any) -> None:
        if threading.get_ident() != self.resident:
            self.tls.depth -= 1
            if self.tls.depth == 0:
                self.pop()   # pycuda.driver.Context.pop: pops this thread's top, which is ours


def _release(owner: Any, attr: str, free: Callable[[Any], None] = lambda raw: None) -> None:
    """Drop owner.<attr>, pycuda's object, with the context current on this thread: pycuda frees an
    object only where its context is current, and elsewhere (a worker thread between calls) warns
    "in out-of-thread context could not be cleaned up" and leaks it. For __del__: quiet at exit."""
    raw = owner.__dict__.pop(attr, None)
    if raw is None:
        return
    try:
        with owner._active:
            free(raw)
            del raw
    except Exception:   # interpreter shutdown: the context may be gone already
        pass


# ---- device objects ---------------------------------------------------------------------------------------
class PycudaBuffer(DeviceBuffer):
    def __init__(self, mem: Any, nbytes: int, active: _Active) -> None:
        super().__init__(mem, int(mem), nbytes)
        self._active = active

    def free(self) -> None:
        if self._mem is not None:
            with self._active:
                self._mem.free()
        super().free()


class PycudaStream:
    """`.raw` is the pycuda.driver.Stream; `.ptr`/`.handle` its CUstream, like CuPy's `.ptr`."""

    def __init__(self, raw: Any, active: _Active) -> None:
        self.raw, self._active = raw, active
        self.ptr = self.handle = int(raw.handle)

    def synchronize(self) -> None:
        with self._active:
            self.raw.synchronize()

    def __del__(self) -> None:
        _release(self, "raw")


class PycudaEvent:
    def __init__(self, raw: Any, active: _Active) -> None:
        self.raw, self._active = raw, active

    def __del__(self) -> None:
        _release(self, "raw")

    def record(self, stream: Any) -> None:
        with self._active:
            self.raw.record(_raw(stream))

    def synchronize(self) -> None:
        with self._active:
            self.raw.synchronize()

    def done(self) -> bool:
        with self._active:
            return bool(self.raw.query())

    def elapsed_ms(self, later: "PycudaEvent") -> float:
        with self._active:
            return float(self.raw.time_till(later.raw))


class _PinnedHost:
    """Owner of one page-locked allocation and the base of every array `pinned` hands out over it:
    the allocation is freed with the context current when its last view dies, in any thread."""

    def __init__(self, arr: np.ndarray, active: _Active) -> None:
        self._arr, self._active = arr, active
        self.__array_interface__ = arr.__array_interface__

    def __del__(self) -> None:
        _release(self, "_arr", lambda arr: arr.base.free())


class PycudaFunction:
    def __init__(self, func: Any, symbol: str, attrs: Any, active: _Active) -> None:
        self._f, self.symbol, self._attrs, self._active = func, symbol, attrs, active
        self._max_dyn = 0

    def set_max_dynamic_shared(self, nbytes: int) -> None:
        """Raise (never lower: executors of one process share the function) the dynamic smem opt-in."""
        if int(nbytes) > self._max_dyn:
            with self._active:
                self._f.set_attribute(self._attrs.MAX_DYNAMIC_SHARED_SIZE_BYTES, int(nbytes))
            self._max_dyn = int(nbytes)

    def launch(self, grid: Tuple[int, ...], block: Tuple[int, ...], args: Tuple[Any, ...],
               shared_mem: int = 0, stream: Any = None) -> None:
        """args: numpy fixed-width scalars (np.uint64 pointers, np.int32, np.float32), packed with
        C alignment by pycuda, as the kernel's parameter list is laid out."""
        grid, block = tuple(int(g) for g in grid), tuple(int(b) for b in block)
        with self._active:
            try:
                self._f(*args, block=block, grid=grid, stream=_raw(stream), shared=int(shared_mem))
            except TypeError as e:   # a Python int or float: its width would be a guess
                raise TypeError(f"{self.symbol}: {e}; pass np.uint64 / np.int32 / np.float32") from None


class PycudaModule:
    def __init__(self, mod: Any, name: str, options: Tuple[str, ...], backend: "PycudaBackend") -> None:
        self._mod, self.name, self.options, self._be = mod, name, options, backend
        self._funcs: Dict[str, PycudaFunction] = {}

    def get(self, symbol: str) -> PycudaFunction:
        if symbol not in self._funcs:
            be = self._be
            with be._active:
                try:
                    f = self._mod.get_function(symbol)
                except be.cuda.Error as e:
                    raise KernelCompileError(self.name, self.options, f"no kernel {symbol!r} in the module: {e}") from None
            self._funcs[symbol] = PycudaFunction(f, symbol, be.cuda.function_attribute, be._active)
        return self._funcs[symbol]


def _raw(stream: Any) -> Any:
    return None if stream is None else stream.raw


def _load_pycuda() -> Any:
    try:
        import pycuda
    except ImportError as e:
        raise BackendUnavailable(f"pycuda is not installed ({e}); `pip install pycuda` with nvcc on PATH "
                                 "(see docs/pycuda.md)") from None
    try:
        import pycuda.driver
    except ImportError as e:   # typically libcuda.so.1 (the driver) is missing
        raise BackendUnavailable(f"pycuda {getattr(pycuda, 'VERSION_TEXT', '')} is installed but cannot load "
                                 f"the CUDA driver ({e})") from None
    return pycuda.driver


# ---- the backend -------------------------------------------------------------------------------------------
class PycudaBackend:
    name = "pycuda"
    supports_graphs = False
    compiler = "nvcc"

    def __init__(self, device: int = 0) -> None:
        cuda = _load_pycuda()
        try:
            cuda.init()
            count = cuda.Device.count()
            if count < 1:
                raise BackendUnavailable("no CUDA GPU found")
            self.dev = cuda.Device(device)
            ctx = self.dev.retain_primary_context()   # what pycuda.autoprimaryctx does, for any device
        except cuda.Error as e:
            raise BackendUnavailable(f"no usable CUDA GPU ({type(e).__name__}: {e})") from None
        self.cuda, self.ctx = cuda, ctx
        resident = None
        if threading.current_thread() is threading.main_thread():
            ctx.push()                   # stays current on the main thread; popped at exit
            resident = threading.get_ident()
            atexit.register(self._release)
        self._active = _Active(ctx, cuda.Context.pop, resident)

    def _release(self) -> None:
        try:
            self.cuda.Context.pop()
        except Exception:
            pass

    # -- facts --------------------------------------------------------------------------
    def device_name(self) -> str:
        return str(self.dev.name())

    def arch(self) -> int:
        major, minor = self.dev.compute_capability()
        return 10 * int(major) + int(minor)

    def sm_count(self) -> int:
        return int(self.dev.get_attribute(self.cuda.device_attribute.MULTIPROCESSOR_COUNT))

    def mem_info(self) -> Tuple[int, int]:
        with self._active:
            free, total = self.cuda.mem_get_info()
        return int(free), int(total)

    def integrated(self) -> bool:
        """True on a GPU that shares the CPU's DRAM (every Jetson)."""
        return bool(self.dev.get_attribute(self.cuda.device_attribute.INTEGRATED))

    # -- memory -------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> PycudaBuffer:
        with self._active:
            mem = self.cuda.mem_alloc(max(int(nbytes), 1))
        return PycudaBuffer(mem, nbytes, self._active)

    def pinned(self, shape: Sequence[int], dtype: Any) -> np.ndarray:
        with self._active:
            arr = self.cuda.pagelocked_empty(tuple(int(s) for s in shape), dtype)
        return np.asarray(_PinnedHost(arr, self._active))

    def trim_pinned(self) -> None:
        """Nothing to do: a page-locked array's memory goes with the array."""

    def h2d(self, dst_ptr: int, host: np.ndarray, stream: Any) -> None:
        """Asynchronous when `host` is pinned; a pageable source makes it synchronous."""
        assert host.flags.c_contiguous
        with self._active:
            self.cuda.memcpy_htod_async(int(dst_ptr), host, _raw(stream))

    def d2h(self, host: np.ndarray, src_ptr: int, stream: Any) -> None:
        assert host.flags.c_contiguous
        with self._active:
            self.cuda.memcpy_dtoh_async(host, int(src_ptr), _raw(stream))

    # -- streams, events ----------------------------------------------------------------------
    def stream(self) -> PycudaStream:
        with self._active:
            return PycudaStream(self.cuda.Stream(NON_BLOCKING), self._active)

    def event(self, timing: bool = True) -> PycudaEvent:
        flags = 0 if timing else int(self.cuda.event_flags.DISABLE_TIMING)
        with self._active:
            return PycudaEvent(self.cuda.Event(flags), self._active)

    def wait(self, stream: Any, event: PycudaEvent) -> None:
        with self._active:
            stream.raw.wait_for_event(event.raw)

    def capture_begin(self, stream: Any) -> None:
        raise BackendUnavailable(NO_GRAPHS)

    def capture_end(self, stream: Any) -> Any:
        raise BackendUnavailable(NO_GRAPHS)

    # -- kernels --------------------------------------------------------------------------
    def nvtx_push(self, name: str) -> None:
        """pycuda has no NVTX binding: a no-op."""

    def nvtx_pop(self) -> None:
        """pycuda has no NVTX binding: a no-op."""

    def load_cubin(self, path: Any, symbols: Sequence[str] = ()) -> PycudaModule:
        """Load a cubin file (cuModuleLoad) and fetch every symbol now, like the CuPy backend."""
        with self._active:
            try:
                mod = self.cuda.module_from_file(str(path))
            except self.cuda.Error as e:
                raise KernelCompileError(str(path), (), f"loading the cubin failed: {e}") from None
        module = PycudaModule(mod, str(path), (), self)
        for s in symbols:
            module.get(s)
        return module

    def compile_source(self, source: str, source_name: str, options: Tuple[str, ...],
                       symbols: Sequence[str] = ()) -> PycudaModule:
        """pycuda builds nothing itself: its cubins come from nvcc through jetson_unet.build."""
        raise KernelCompileError(source_name, tuple(options), NO_NVCC)

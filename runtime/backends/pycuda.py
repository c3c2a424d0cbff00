"""The pycuda backend (`--backend pycuda`): the interface of `CupyBackend`, through pycuda's driver
API, for Jetson images with pycuda and nvcc but no CuPy. Same plan, same kernels/*.cu, same
launches; no CUDA graphs (pycuda has no stream-capture API), so gpu mode runs with graphs=False.

Context: the device's *primary* context (what `pycuda.autoprimaryctx` retains, and what CuPy's
runtime API uses), so both backends can live in one process without one's allocations landing in
the other's context. Nothing else is shared: buffers, streams, events and modules belong to the
backend object that made them. pycuda keeps a per-thread context stack and aborts the process when
a thread exits with a context still pushed; so the main thread keeps the context pushed (popped at
exit, as autoprimaryctx does) and any other thread pushes it for the length of each call.

Kernels: nvcc (pycuda's `compiler.compile`, the body of `SourceModule`) on the one source text of
kernels.KernelSet, with the NVRTC options translated (`nvcc_args`). The cubin is cached on disk
under $JETSON_UNET_CACHE/pycuda (default ~/.cache/jetson-unet/pycuda), keyed by source text,
options and `nvcc --version`: pycuda's own cache runs `nvcc --preprocess` on every lookup of a
source with an #include (ours has), which costs a second per module even on a hit.
"""
from __future__ import annotations

import atexit
import ctypes
import hashlib
import itertools
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from jetson_unet.errors import BackendUnavailable, KernelCompileError
from jetson_unet.files import atomic_open
from jetson_unet.backends.base import DeviceBuffer

NO_GRAPHS = "pycuda has no CUDA-graph capture API; use graphs=False (jetson-sample --no-graphs)"
CUDA_ROOTS = ("/usr/local/cuda",)   # where JetPack and the x86 installers put the toolkit
NON_BLOCKING = 1          # CU_STREAM_NON_BLOCKING (pycuda exposes no enum for stream flags)
NVRTC_ONLY = ("-default-device", "--device-as-default-execution-space", "-pch", "--pch", "--create-pch",
              "--use-pch", "--pch-dir", "--minimal", "-no-source-include", "--no-source-include")


# ---- pure helpers (tested without a GPU) ------------------------------------------------------------
class NvccArgs(NamedTuple):
    arch: str                        # "sm_87": pycuda passes it as `-arch sm_87`
    include_dirs: Tuple[str, ...]
    options: Tuple[str, ...]         # everything else, spelled the same for nvcc and NVRTC

    def command_options(self) -> Tuple[str, ...]:
        """What nvcc finally sees (less pycuda's own include dir): the cache key and error text."""
        return self.options + ("-arch", self.arch) + tuple("-I" + d for d in self.include_dirs)


def nvcc_args(options: Sequence[str], source_name: str = "kernels") -> NvccArgs:
    """NVRTC options (kernels.nvrtc_options) -> nvcc's: the target becomes `arch`, include paths
    become include_dirs; -std, -D, -U, --use_fast_math, --fmad, -lineinfo, --maxrregcount and the
    like are spelled the same by both. A virtual target (compute_XX) becomes sm_XX: we build cubins."""
    arch, incs, rest = None, [], []
    it = iter(options)
    for opt in it:
        if opt in ("-arch", "--gpu-architecture", "-I", "--include-path"):
            value = next(it, None)
            if value is None:
                raise KernelCompileError(source_name, tuple(options), f"option {opt} needs a value")
            opt = opt + ("=" if opt.startswith("--") or opt == "-arch" else "") + value
        if opt.startswith(("-arch=", "--gpu-architecture=")):
            arch = opt.split("=", 1)[1].replace("compute_", "sm_")
        elif opt.startswith("--include-path="):
            incs.append(opt.split("=", 1)[1])
        elif opt.startswith("-I"):
            incs.append(opt[2:])
        elif opt.split("=", 1)[0] in NVRTC_ONLY:
            raise KernelCompileError(source_name, tuple(options), f"{opt} is an NVRTC-only option; nvcc has none like it")
        else:
            rest.append(opt)
    if arch is None:
        raise KernelCompileError(source_name, tuple(options), "no target (--gpu-architecture=sm_XX) in the options")
    return NvccArgs(arch, tuple(dict.fromkeys(incs)), tuple(rest))


def find_nvcc(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """nvcc on PATH, else under $CUDA_ROOT / $CUDA_HOME / $CUDA_PATH, else /usr/local/cuda/bin."""
    found = shutil.which("nvcc", path=environ.get("PATH"))
    if found:
        return found
    roots = [environ.get(k) for k in ("CUDA_ROOT", "CUDA_HOME", "CUDA_PATH")] + list(CUDA_ROOTS)
    for root in roots:
        if root and os.access(os.path.join(root, "bin", "nvcc"), os.X_OK):
            return os.path.join(root, "bin", "nvcc")
    return None


def cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    if environ.get("JETSON_UNET_CACHE"):
        return Path(environ["JETSON_UNET_CACHE"]) / "pycuda"
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "jetson-unet" / "pycuda"


def cubin_key(source: str, nv: NvccArgs, nvcc_version: str) -> str:
    h = hashlib.sha256(source.encode())
    for part in nv.command_options() + (nvcc_version,):
        h.update(b"\0" + part.encode())
    return h.hexdigest()


def build_cubin(compiler: Any, compile_error: type, source: str, source_name: str, nv: NvccArgs, nvcc: str,
                cache: Optional[Path], nvcc_version: str) -> bytes:
    """Cached cubin, else `compiler.compile` (pycuda.compiler) -> cubin; errors -> KernelCompileError."""
    path = cache / (cubin_key(source, nv, nvcc_version) + ".cubin") if cache else None
    if path is not None and path.is_file():
        return path.read_bytes()
    try:
        cubin = compiler.compile(source, nvcc=nvcc, options=list(nv.options), no_extern_c=True, arch=nv.arch,
                                 include_dirs=list(nv.include_dirs), cache_dir=False)
    except compile_error as e:
        log = "\n".join(s for s in (getattr(e, "stderr", None), getattr(e, "stdout", None)) if s) or str(e)
        raise KernelCompileError(source_name, nv.command_options(), log) from None
    except OSError as e:   # nvcc missing or not runnable (pytools' ExecError is an OSError)
        raise KernelCompileError(source_name, nv.command_options(), f"cannot run {nvcc}: {e}") from None
    if path is not None:
        try:   # atomic: a concurrent process sees a whole file or none
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_open(path, "wb") as f:
                f.write(cubin)
        except OSError:
            pass   # an unwritable cache only costs a recompile next time
    return cubin


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


def _load_pycuda() -> Tuple[Any, Any]:
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
    try:
        import pycuda.compiler
    except ImportError as e:
        raise BackendUnavailable(f"pycuda's compiler cannot be imported ({e}): install its dependencies "
                                 "(pytools, platformdirs, mako)") from None
    return pycuda.driver, pycuda.compiler


# ---- the backend -------------------------------------------------------------------------------------------
class PycudaBackend:
    name = "pycuda"
    supports_graphs = False

    def __init__(self, device: int = 0) -> None:
        cuda, compiler = _load_pycuda()
        try:
            cuda.init()
            count = cuda.Device.count()
            if count < 1:
                raise BackendUnavailable("no CUDA GPU found")
            self.dev = cuda.Device(device)
            ctx = self.dev.retain_primary_context()   # what pycuda.autoprimaryctx does, for any device
        except cuda.Error as e:
            raise BackendUnavailable(f"no usable CUDA GPU ({type(e).__name__}: {e})") from None
        self.nvcc = find_nvcc()
        if self.nvcc is None:
            raise BackendUnavailable("pycuda compiles the kernels with nvcc, which is on neither PATH nor "
                                     "$CUDA_ROOT/bin nor /usr/local/cuda/bin (JetPack: export PATH=/usr/local/cuda/bin:$PATH)")
        self.cuda, self.compiler, self.ctx = cuda, compiler, ctx
        resident = None
        if threading.current_thread() is threading.main_thread():
            ctx.push()                   # stays current on the main thread; popped at exit
            resident = threading.get_ident()
            atexit.register(self._release)
        self._active = _Active(ctx, cuda.Context.pop, resident)
        self._nvcc_version: Optional[str] = None
        self._host_funcs: Dict[int, Tuple[Callable[[Any], None], Any]] = {}
        self._host_ids = itertools.count(1)
        self._trampoline: Any = None
        self._libcuda: Any = None

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

    def h2d(self, dst_ptr: int, host: np.ndarray, stream: Any) -> None:
        """Asynchronous when `host` is pinned; a pageable source makes it synchronous."""
        assert host.flags.c_contiguous
        with self._active:
            self.cuda.memcpy_htod_async(int(dst_ptr), host, _raw(stream))

    def d2h(self, host: np.ndarray, src_ptr: int, stream: Any) -> None:
        assert host.flags.c_contiguous
        with self._active:
            self.cuda.memcpy_dtoh_async(host, int(src_ptr), _raw(stream))

    def d2d(self, dst_ptr: int, src_ptr: int, nbytes: int, stream: Any) -> None:
        with self._active:
            self.cuda.memcpy_dtod_async(int(dst_ptr), int(src_ptr), int(nbytes), _raw(stream))

    def memset(self, ptr: int, byte: int, nbytes: int, stream: Any) -> None:
        with self._active:
            self.cuda.memset_d8_async(int(ptr), int(byte), int(nbytes), _raw(stream))

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

    def host_func(self, stream: Any, fn: Callable[[Any], None], arg: Any = None) -> None:
        """fn(arg) on a driver thread once the stream reaches this point (cuLaunchHostFunc, through
        ctypes: pycuda does not wrap it). fn must not call CUDA."""
        if self._trampoline is None:   # one C callback for the backend's life: never freed mid-call
            lib = ctypes.CDLL("libcuda.so.1")
            lib.cuLaunchHostFunc.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
            lib.cuLaunchHostFunc.restype = ctypes.c_int
            self._libcuda = lib
            self._trampoline = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(self._run_host_func)
        key = next(self._host_ids)
        self._host_funcs[key] = (fn, arg)
        with self._active:
            rc = self._libcuda.cuLaunchHostFunc(ctypes.c_void_p(stream.handle if stream is not None else 0),
                                                ctypes.cast(self._trampoline, ctypes.c_void_p), ctypes.c_void_p(key))
        if rc != 0:
            del self._host_funcs[key]
            raise self.cuda.LogicError(f"cuLaunchHostFunc failed with CUresult {rc}")

    def _run_host_func(self, key: Optional[int]) -> None:
        fn, arg = self._host_funcs.pop(int(key or 0))
        fn(arg)

    def synchronize(self) -> None:
        with self._active:
            self.cuda.Context.synchronize()

    def capture_begin(self, stream: Any) -> None:
        raise BackendUnavailable(NO_GRAPHS)

    def capture_end(self, stream: Any) -> Any:
        raise BackendUnavailable(NO_GRAPHS)

    # -- kernels --------------------------------------------------------------------------
    def nvcc_version(self) -> str:
        if self._nvcc_version is None:
            try:
                out = subprocess.run([self.nvcc, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     check=False).stdout
                self._nvcc_version = out.decode("utf-8", "replace")
            except OSError as e:
                raise KernelCompileError("kernels", (), f"cannot run {self.nvcc} --version: {e}") from None
        return self._nvcc_version

    def compile(self, source: str, source_name: str, options: Tuple[str, ...],
                symbols: Sequence[str] = ()) -> PycudaModule:
        nv = nvcc_args(options, source_name)
        cubin = build_cubin(self.compiler, self.cuda.CompileError, source, source_name, nv, self.nvcc,
                            cache_dir(), self.nvcc_version())
        with self._active:
            try:
                mod = self.cuda.module_from_buffer(cubin)
            except self.cuda.Error as e:
                raise KernelCompileError(source_name, nv.command_options(), f"loading the cubin failed: {e}") from None
        module = PycudaModule(mod, source_name, nv.command_options(), self)
        for s in symbols:   # load every function now, like the CuPy backend
            module.get(s)
        return module


"""CPU-only checks of the pycuda backend and its nvcc: NVRTC -> nvcc option translation, nvcc
discovery, nvcc's errors (jetson_unet.build.compilers), one-line errors when pycuda / its driver / a
GPU / nvcc is missing, and the adapter driven through the GPU executor over a fake `pycuda` (its
module from the one cubin cache, launch arguments, streams, per-thread context)."""
from __future__ import annotations

import os
import stat
import sys
import threading
import types
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.cubin_fakes import fake_compiler, write_fake_nvcc

from jetson_unet.model.config import UNetConfig
from jetson_unet.errors import BackendUnavailable, KernelCompileError
from jetson_unet.backends import BACKENDS, _CACHE, get_backend, gpu_available
from jetson_unet.backends import pycuda as bp
from jetson_unet.build import cache as cubins
from jetson_unet.build import compilers
from jetson_unet.executor.executor import GpuExecutor
from jetson_unet.build.loader import KernelSet
from jetson_unet.build.sources import nvrtc_options
from jetson_unet.model.weights import random_params

TINY = UNetConfig(image_size=16, dim=8, dim_mults=(1, 2), time_dim=32)
NVCC_TOOLCHAIN = "nvcc: Cuda compilation tools, release 12.6, V12.6.68"


# ---- option translation, nvcc discovery, nvcc's errors (jetson_unet.build.compilers) -------------------------------
def test_nvrtc_options_of_the_kernel_loader_translate(tmp_path):
    nv = compilers.nvcc_args(nvrtc_options(87, tmp_path))
    assert nv.arch == "sm_87"
    assert nv.include_dirs[0] == str(tmp_path)
    assert "-std=c++17" in nv.options and not any(o.startswith(("-I", "--gpu-arch")) for o in nv.options)
    assert nv.command_options()[-len(nv.include_dirs) - 2:-len(nv.include_dirs)] == ("-arch", "sm_87")


@pytest.mark.parametrize("opts, arch, incs, rest", [
    (("-arch=sm_90", "-I/a", "--use_fast_math"), "sm_90", ("/a",), ("--use_fast_math",)),
    (("-arch", "compute_87", "--include-path", "/b", "-DX=1"), "sm_87", ("/b",), ("-DX=1",)),
    (("--gpu-architecture", "sm_72", "-I", "/c", "-I/c", "--fmad=false"), "sm_72", ("/c",), ("--fmad=false",)),
])
def test_option_spellings(opts, arch, incs, rest):
    assert compilers.nvcc_args(opts) == compilers.NvccArgs(arch, incs, rest)


@pytest.mark.parametrize("opts, words", [
    (("-std=c++17",), "no target"),
    (("-arch=sm_87", "-default-device"), "NVRTC-only"),
    (("-arch=sm_87", "-I"), "needs a value"),
])
def test_option_errors_are_compile_errors(opts, words):
    with pytest.raises(KernelCompileError, match=words) as ei:
        compilers.nvcc_args(opts, "seed-unet.cu")
    assert ei.value.source == "seed-unet.cu"


def _exe(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_find_nvcc_path_then_roots(tmp_path, monkeypatch):
    on_path = _exe(tmp_path / "p" / "nvcc")
    root = _exe(tmp_path / "root" / "bin" / "nvcc")
    assert compilers.find_nvcc({"PATH": str(on_path.parent), "CUDA_ROOT": str(tmp_path / "root")}) == str(on_path)
    assert compilers.find_nvcc({"PATH": str(tmp_path), "CUDA_HOME": str(tmp_path / "root")}) == str(root)
    monkeypatch.setattr(compilers, "CUDA_ROOTS", ())
    assert compilers.find_nvcc({"PATH": str(tmp_path)}) is None


def test_compiler_log_and_missing_nvcc_become_kernel_compile_errors(tmp_path):
    nvcc = str(write_fake_nvcc(tmp_path, b""))
    opts = ("--gpu-architecture=sm_87", "-std=c++17")
    with pytest.raises(KernelCompileError) as ei:
        compilers.nvcc_cubin("BROKEN", "seed-unet.cu", opts, 87, nvcc)
    assert 'seed-unet.cu(3): error: identifier "x" is undefined' in ei.value.log and ei.value.source == "seed-unet.cu"
    assert "-std=c++17" in ei.value.options and "-arch=sm_87" in ei.value.options
    with pytest.raises(KernelCompileError, match="cannot run /no/nvcc"):
        compilers.nvcc_cubin("A", "s.cu", opts, 87, "/no/nvcc")


# ---- one-line errors when something is missing ------------------------------------------------------------
@pytest.fixture
def fresh_backends(monkeypatch):
    monkeypatch.delitem(_CACHE, ("pycuda", None), raising=False)
    yield
    _CACHE.pop("pycuda", None)


def test_pycuda_missing(monkeypatch, fresh_backends):
    monkeypatch.setitem(sys.modules, "pycuda", None)
    assert "pycuda" in BACKENDS
    reason = gpu_available("pycuda")
    assert reason.startswith("pycuda is not installed") and "docs/pycuda.md" in reason


def test_pycuda_without_driver(monkeypatch, fresh_backends):
    monkeypatch.setitem(sys.modules, "pycuda", types.ModuleType("pycuda"))
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)   # as when libcuda.so.1 cannot be loaded
    with pytest.raises(BackendUnavailable, match="cannot load the CUDA driver"):
        get_backend("pycuda")


# ---- a fake pycuda: the adapter through the executor, without a GPU ------------------------------------------
class FakeError(Exception):
    pass


class FakeCtx:
    def __init__(self, log):
        self.log = log

    def push(self):
        self.log.append(("push", threading.get_ident()))


def fake_pycuda(log, gpus=1):
    drv = types.ModuleType("pycuda.driver")
    drv.Error, drv.LogicError = FakeError, FakeError
    ctx = FakeCtx(log)

    class Device:
        count = staticmethod(lambda: gpus)

        def __init__(self, i):
            pass

        name = lambda self: "Fake GPU"  # noqa: E731
        compute_capability = lambda self: (8, 7)  # noqa: E731
        get_attribute = lambda self, a: 0 if a == 17 else 8  # noqa: E731  (17: INTEGRATED, a discrete GPU)
        retain_primary_context = lambda self: ctx  # noqa: E731

    class Context:
        pop = staticmethod(lambda: log.append(("pop", threading.get_ident())))
        synchronize = staticmethod(lambda: None)

    class Alloc(int):
        def free(self):
            log.append(("free", int(self)))

    class Stream:
        def __init__(self, flags=0):
            self.flags, self.handle = flags, 0x5000 + len(log)

        synchronize = lambda self: None  # noqa: E731
        wait_for_event = lambda self, ev: log.append(("wait", self, ev))  # noqa: E731
        __del__ = lambda self: log.append(("gone", "stream", threading.get_ident()))  # noqa: E731

    class Event:
        def __init__(self, flags=0):
            self.flags = flags

        record = lambda self, s=None: log.append(("record", s))  # noqa: E731
        __del__ = lambda self: log.append(("gone", "event", threading.get_ident()))  # noqa: E731

    class HostAllocation:   # the base of a page-locked array, as pycuda's
        def __init__(self, shape, dtype):
            self._a = np.zeros(shape, dtype)
            self.__array_interface__ = self._a.__array_interface__

        free = lambda self: log.append(("gone", "pinned", threading.get_ident()))  # noqa: E731

    class Func:
        def __init__(self, name):
            self.name = name

        def __call__(self, *args, **kw):
            log.append(("launch", self.name, args, kw, threading.get_ident()))

    class Module:
        def __init__(self, path):
            self.data = Path(path).read_bytes()

        def get_function(self, name):
            if b".text." + name.encode() + b"\0" not in self.data:
                raise FakeError(f"cuModuleGetFunction failed: named symbol not found ({name})")
            return Func(name)

    def module_from_file(path):
        """cuModuleLoad: only a CUDA ELF of this GPU's arch (as the driver)."""
        data = Path(path).read_bytes()
        if cubins.check_cubin(data, 87) is not None:
            raise FakeError("cuModuleLoad failed: device kernel image is invalid")
        log.append(("load", str(path)))
        return Module(path)

    next_ptr = [1 << 32]

    def mem_alloc(n):
        next_ptr[0] += (n + 255) // 256 * 256
        return Alloc(next_ptr[0] - (n + 255) // 256 * 256)

    drv.init, drv.Device, drv.Context, drv.Stream, drv.Event = (lambda: None), Device, Context, Stream, Event
    drv.mem_alloc, drv.mem_get_info = mem_alloc, (lambda: (8 << 30, 8 << 30))
    drv.pagelocked_empty = lambda shape, dtype: np.asarray(HostAllocation(shape, dtype))
    drv.memcpy_htod_async = lambda dst, src, s: log.append(("h2d", dst, src.nbytes, s))
    drv.memcpy_dtoh_async = lambda dst, src, s: log.append(("d2h", src, dst.nbytes, s))
    drv.module_from_file = module_from_file
    drv.event_flags = types.SimpleNamespace(DISABLE_TIMING=2)
    drv.device_attribute = types.SimpleNamespace(MULTIPROCESSOR_COUNT=16, INTEGRATED=17)
    drv.function_attribute = types.SimpleNamespace(MAX_DYNAMIC_SHARED_SIZE_BYTES=8)
    pkg = types.ModuleType("pycuda")
    pkg.driver, pkg.VERSION_TEXT = drv, "fake"
    # pycuda.compiler (and pytools behind it) is never imported: nvcc runs in jetson_unet.build
    return {"pycuda": pkg, "pycuda.driver": drv, "pycuda.compiler": None}


@pytest.fixture
def nvcc_builds(monkeypatch):
    """The nvcc the loader finds (jetson_unet.build.compilers.runtime_compiler("nvcc")): a fake
    Compiler of kind "nvcc"; the list gets (arch, source name) per build."""
    builds = []
    monkeypatch.setattr(compilers, "find_nvcc", lambda: "/fake/nvcc")
    monkeypatch.setattr(compilers, "nvcc_compiler",
                        lambda nvcc: fake_compiler(builds, toolchain=NVCC_TOOLCHAIN, kind="nvcc"))
    return builds


@pytest.fixture
def fake_backend(monkeypatch, tmp_path, nvcc_builds):
    log = []
    for name, mod in fake_pycuda(log).items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(bp.atexit, "register", lambda fn: None)
    monkeypatch.setenv("JETSON_UNET_CACHE", str(tmp_path))
    monkeypatch.setattr(KernelSet, "_cache", {})
    return bp.PycudaBackend(), log


class W:
    def __init__(self, cfg, seed=0):
        self.config, self.params = cfg, random_params(cfg, seed)


def test_executor_over_fake_pycuda(fake_backend):
    be, log = fake_backend
    assert (be.arch(), be.sm_count(), be.device_name()) == (87, 8, "Fake GPU")
    ex = GpuExecutor(W(TINY), "fp16", batch=2, backend=be)
    assert any(e[0] == "load" for e in log)
    del log[:]
    ex.run(ex.stream)
    launches = [e for e in log if e[0] == "launch"]
    assert len(launches) == ex.launches_per_call
    for _, name, args, kw, _ in launches:
        assert all(isinstance(a, (np.uint64, np.int32, np.float32, np.int64)) for a in args), name
        assert all(type(v) is int for v in kw["grid"] + kw["block"]) and len(kw["grid"]) == 3
        assert kw["stream"] is ex.stream.raw and type(kw["shared"]) is int
    assert ex.stream.raw.flags == bp.NON_BLOCKING
    assert [e[0] for e in log if e[0] in ("push", "pop")] == []    # the main thread keeps it current
    ex.close()
    assert sum(e[0] == "free" for e in log) == 2


def test_other_threads_push_and_pop_per_call(fake_backend):
    be, log = fake_backend
    ex = GpuExecutor(W(TINY), "fp32", batch=1, backend=be)
    del log[:]
    errors = []

    def work():
        try:
            ex.eps(np.ones((1, 3, 16, 16), np.float32), 5)
        except BaseException as e:
            errors.append(e)

    th = threading.Thread(target=work)
    th.start()
    th.join()
    assert not errors, errors
    ctx_ops = [e for e in log if e[0] in ("push", "pop")]
    assert ctx_ops and all(e[1] == th.ident for e in ctx_ops)
    kinds = [e[0] for e in ctx_ops]
    assert kinds == ["push", "pop"] * (len(kinds) // 2)            # balanced, never nested
    assert all(e[4] == th.ident for e in log if e[0] == "launch")


def test_objects_dropped_in_a_worker_thread_are_freed_with_the_context_current(fake_backend):
    """pycuda frees an event, a stream or a page-locked allocation only where their context is
    current, and elsewhere warns and leaks it (the GPU suite's worker-thread test showed 5 such
    warnings): dropped in a thread other than the main one, each goes between that thread's push
    and pop; a pinned array goes with its last view."""
    be, log = fake_backend

    def work():
        ev, st, host = be.event(), be.stream(), be.pinned((4, 3), np.float32)
        view = host[1:]
        view[...] = 1.0
        del ev, st, host
        log.append(("mark", threading.get_ident()))
        del view

    th = threading.Thread(target=work)
    th.start()
    th.join()
    depth, gone = 0, []
    for entry in log:
        if entry[-1] != th.ident:
            continue
        if entry[0] in ("push", "pop"):
            depth += 1 if entry[0] == "push" else -1
        elif entry[0] in ("gone", "mark"):
            gone.append(entry[1] if entry[0] == "gone" else "mark")
            assert entry[0] == "mark" or depth == 1, (entry, depth)
    assert gone == ["event", "stream", "mark", "pinned"] and depth == 0


def test_events_streams_and_capture(fake_backend):
    be, log = fake_backend
    s = be.stream()
    ev = be.event(timing=False)
    assert ev.raw.flags == 2 and be.event().raw.flags == 0
    ev.record(s)
    be.wait(s, ev)
    assert ("record", s.raw) in log and ("wait", s.raw, ev.raw) in log
    assert be.supports_graphs is False
    with pytest.raises(BackendUnavailable, match="graphs=False"):
        be.capture_begin(s)


def test_the_module_comes_from_the_one_cubin_cache(fake_backend, nvcc_builds, monkeypatch):
    """pycuda builds nothing itself: the loader builds the cubin with nvcc (here a fake nvcc
    Compiler) into the cubin cache both backends share, and the backend loads that file
    (module_from_file); a later process finds it there and needs no nvcc."""
    be, log = fake_backend
    assert be.compiler == "nvcc"
    ex = GpuExecutor(W(TINY), "fp16", batch=2, backend=be)
    [cub] = list(cubins.cache_dir().glob("*.cubin"))
    assert cub.parent == Path(os.environ["JETSON_UNET_CACHE"]) / "cubins" / "v1"
    assert nvcc_builds == [(87, "seed-unet.cu")] and [e for e in log if e[0] == "load"] == [("load", str(cub))]
    entry, = cubins.CubinCache().find(ex.kernels.source, ex.kernels.options, 87, NVCC_TOOLCHAIN, ex.kernels.symbols)
    assert entry.cubin == cub and entry.toolchain == NVCC_TOOLCHAIN
    ex.close()
    KernelSet._cache.clear()                              # a new process, as far as the modules in memory go
    monkeypatch.setattr(compilers, "find_nvcc", lambda: None)
    with GpuExecutor(W(TINY), "fp16", batch=2, backend=bp.PycudaBackend()) as again:
        assert again.kernels.symbols == ex.kernels.symbols
    assert len(nvcc_builds) == 1 and [e for e in log if e[0] == "load"] == [("load", str(cub))] * 2


def test_no_nvcc_and_no_cached_cubin_is_a_one_line_compile_error(fake_backend, monkeypatch):
    """No nvcc is needed to make the backend (only where a module must be built): the loader then
    falls to PycudaBackend.compile_source, which names nvcc and --prepare in one line."""
    monkeypatch.setattr(compilers, "find_nvcc", lambda: None)
    be = bp.PycudaBackend()
    with pytest.raises(KernelCompileError) as ei:
        GpuExecutor(W(TINY), "fp32", batch=1, backend=be)
    assert ei.value.log == bp.NO_NVCC and "\n" not in ei.value.log
    assert "no nvcc" in ei.value.log and "jetson-sample --prepare" in ei.value.log
    assert not list(cubins.cache_dir().glob("*.cubin"))


def test_no_gpu_is_a_one_line_error(monkeypatch, fake_backend):
    log = []
    for name, mod in fake_pycuda(log, gpus=0).items():
        monkeypatch.setitem(sys.modules, name, mod)
    with pytest.raises(BackendUnavailable, match="no CUDA GPU"):
        bp.PycudaBackend()


def test_pycuda_compiler_is_not_needed(fake_backend):
    """Only pycuda.driver is imported (the fake maps pycuda.compiler to None, as when pytools is
    missing): the backend works without it."""
    be, _ = fake_backend
    assert sys.modules["pycuda.compiler"] is None and be.arch() == 87


@pytest.mark.slow
def test_real_kernels_compile_with_nvcc(tmp_path):
    """Where nvcc is installed (no GPU or pycuda needed): the kernel loader's source, for sm_87,
    built by the Compiler the pycuda backend's loader uses."""
    nvcc = compilers.find_nvcc()
    if nvcc is None:
        pytest.skip("no nvcc")
    if 87 not in (compilers.nvcc_archs(nvcc) or (87,)):
        pytest.skip(f"{nvcc} cannot target sm_87")
    from jetson_unet.ops.keys import SimpleKey
    from jetson_unet.build.sources import module_source
    keys = [SimpleKey("dwconv", "fp16", 7), SimpleKey("final", "bf16", 3)]
    comp = compilers.nvcc_compiler(nvcc)
    assert comp.kind == "nvcc" and comp.toolchain.startswith("nvcc: ")
    cubin = comp.build(module_source(keys), "t.cu", nvrtc_options(87), 87)
    assert cubin[:4] == b"\x7fELF" and b"dwconv7_f16" in cubin and b"final_conv3_bf16" in cubin
    assert cubins.check_cubin(cubin, 87, [k.symbol for k in keys]) is None

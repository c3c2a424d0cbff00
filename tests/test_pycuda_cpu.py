"""CPU-only checks of the pycuda backend: NVRTC -> nvcc option translation, the cubin cache, compiler
errors, one-line errors when pycuda / its driver / a GPU / nvcc is missing, and the adapter driven
through the GPU executor over a fake `pycuda` (launch arguments, streams, per-thread context)."""
from __future__ import annotations

import os
import stat
import sys
import threading
import types
from pathlib import Path

import numpy as np
import pytest

from jetson_unet.model.config import UNetConfig
from jetson_unet import backends as backend_mod  # noqa: E402
from jetson_unet.errors import BackendUnavailable, KernelCompileError
from jetson_unet.backends import BACKENDS, _CACHE, get_backend, gpu_available
from jetson_unet.backends import pycuda as bp
from jetson_unet.executor.executor import GpuExecutor
from jetson_unet.build.loader import KernelSet
from jetson_unet.build.sources import nvrtc_options
from jetson_unet.model.weights import random_params

TINY = UNetConfig(image_size=16, dim=8, dim_mults=(1, 2), time_dim=32)


# ---- option translation, nvcc discovery, cache ------------------------------------------------------------
def test_nvrtc_options_of_the_kernel_loader_translate(tmp_path):
    nv = bp.nvcc_args(nvrtc_options(87, tmp_path))
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
    assert bp.nvcc_args(opts) == bp.NvccArgs(arch, incs, rest)


@pytest.mark.parametrize("opts, words", [
    (("-std=c++17",), "no target"),
    (("-arch=sm_87", "-default-device"), "NVRTC-only"),
    (("-arch=sm_87", "-I"), "needs a value"),
])
def test_option_errors_are_compile_errors(opts, words):
    with pytest.raises(KernelCompileError, match=words) as ei:
        bp.nvcc_args(opts, "seed-unet.cu")
    assert ei.value.source == "seed-unet.cu"


def _exe(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_find_nvcc_path_then_roots(tmp_path, monkeypatch):
    on_path = _exe(tmp_path / "p" / "nvcc")
    root = _exe(tmp_path / "root" / "bin" / "nvcc")
    assert bp.find_nvcc({"PATH": str(on_path.parent), "CUDA_ROOT": str(tmp_path / "root")}) == str(on_path)
    assert bp.find_nvcc({"PATH": str(tmp_path), "CUDA_HOME": str(tmp_path / "root")}) == str(root)
    monkeypatch.setattr(bp, "CUDA_ROOTS", ())
    assert bp.find_nvcc({"PATH": str(tmp_path)}) is None


def test_cache_dir_environment():
    assert bp.cache_dir({"JETSON_UNET_CACHE": "/x"}) == Path("/x/pycuda")
    assert bp.cache_dir({"XDG_CACHE_HOME": "/y"}) == Path("/y/jetson-unet/pycuda")
    assert bp.cache_dir({}).parts[-3:] == (".cache", "jetson-unet", "pycuda")


class FakeCompileError(Exception):
    def __init__(self, msg, command_line, stdout=None, stderr=None):
        super().__init__(msg)
        self.command_line, self.stdout, self.stderr = command_line, stdout, stderr


class FakeCompiler:
    def __init__(self, fail=None):
        self.calls, self.fail = [], fail

    def compile(self, source, **kw):
        self.calls.append((source, kw))
        if self.fail is not None:
            raise self.fail
        return b"CUBIN:" + source.encode()


def test_build_cubin_caches_by_text_options_and_nvcc(tmp_path):
    nv = bp.nvcc_args(("-arch=sm_87", "-std=c++17", "-I/k"))
    comp = FakeCompiler()
    build = lambda src, nv=nv, ver="13.0": bp.build_cubin(comp, FakeCompileError, src, "s.cu", nv, "nvcc",  # noqa: E731
                                                          tmp_path, ver)
    assert build("A") == b"CUBIN:A" and build("A") == b"CUBIN:A"
    assert len(comp.calls) == 1                          # the second came from the disk cache
    _, kw = comp.calls[0]
    assert kw["no_extern_c"] and kw["arch"] == "sm_87" and kw["include_dirs"] == ["/k"]
    assert kw["options"] == ["-std=c++17"] and kw["cache_dir"] is False
    build("B")
    build("A", ver="12.6")
    build("A", nv=bp.nvcc_args(("-arch=sm_90", "-std=c++17", "-I/k")))
    assert len(comp.calls) == 4 and len(list(tmp_path.glob("*.cubin"))) == 4
    assert not list(tmp_path.glob("*.tmp"))


def test_build_cubin_unwritable_cache_still_compiles(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    nv = bp.nvcc_args(("-arch=sm_87",))
    assert bp.build_cubin(FakeCompiler(), FakeCompileError, "A", "s.cu", nv, "nvcc", blocker / "sub", "v") == b"CUBIN:A"


def test_compiler_log_and_missing_nvcc_become_kernel_compile_errors(tmp_path):
    nv = bp.nvcc_args(("-arch=sm_87", "-std=c++17"))
    err = FakeCompileError("nvcc compilation failed", ["nvcc"], stdout="", stderr='kernel.cu(3): error: identifier "x" is undefined')
    with pytest.raises(KernelCompileError) as ei:
        bp.build_cubin(FakeCompiler(err), FakeCompileError, "A", "seed-unet.cu", nv, "nvcc", None, "v")
    assert 'identifier "x" is undefined' in ei.value.log and ei.value.source == "seed-unet.cu"
    assert "-std=c++17" in ei.value.options and "sm_87" in ei.value.options
    with pytest.raises(KernelCompileError, match="cannot run /no/nvcc"):
        bp.build_cubin(FakeCompiler(FileNotFoundError("no such file")), FakeCompileError, "A", "s.cu", nv,
                       "/no/nvcc", None, "v")


# ---- one-line errors when something is missing ------------------------------------------------------------
@pytest.fixture
def fresh_backends(monkeypatch):
    monkeypatch.delitem(_CACHE, "pycuda", raising=False)
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


def test_pycuda_without_its_dependencies(monkeypatch, fresh_backends):
    monkeypatch.setitem(sys.modules, "pycuda", types.ModuleType("pycuda"))
    monkeypatch.setitem(sys.modules, "pycuda.driver", types.ModuleType("pycuda.driver"))
    monkeypatch.setitem(sys.modules, "pycuda.compiler", None)   # as when pytools is missing
    with pytest.raises(BackendUnavailable, match="pytools"):
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
    drv.Error, drv.LogicError, drv.CompileError = FakeError, FakeError, FakeCompileError
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
        get_function = lambda self, name: Func(name)  # noqa: E731

    next_ptr = [1 << 32]

    def mem_alloc(n):
        next_ptr[0] += (n + 255) // 256 * 256
        return Alloc(next_ptr[0] - (n + 255) // 256 * 256)

    drv.init, drv.Device, drv.Context, drv.Stream, drv.Event = (lambda: None), Device, Context, Stream, Event
    drv.mem_alloc, drv.mem_get_info = mem_alloc, (lambda: (8 << 30, 8 << 30))
    drv.pagelocked_empty = lambda shape, dtype: np.asarray(HostAllocation(shape, dtype))
    drv.memcpy_htod_async = lambda dst, src, s: log.append(("h2d", dst, src.nbytes, s))
    drv.memcpy_dtoh_async = lambda dst, src, s: log.append(("d2h", src, dst.nbytes, s))
    drv.module_from_buffer = lambda cubin: (log.append(("load", len(cubin))), Module())[1]
    drv.event_flags = types.SimpleNamespace(DISABLE_TIMING=2)
    drv.device_attribute = types.SimpleNamespace(MULTIPROCESSOR_COUNT=16, INTEGRATED=17)
    drv.function_attribute = types.SimpleNamespace(MAX_DYNAMIC_SHARED_SIZE_BYTES=8)
    comp = types.ModuleType("pycuda.compiler")
    comp.compile = FakeCompiler().compile
    pkg = types.ModuleType("pycuda")
    pkg.driver, pkg.compiler, pkg.VERSION_TEXT = drv, comp, "fake"
    return {"pycuda": pkg, "pycuda.driver": drv, "pycuda.compiler": comp}


@pytest.fixture
def fake_backend(monkeypatch, tmp_path):
    log = []
    for name, mod in fake_pycuda(log).items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(bp, "find_nvcc", lambda: "/fake/nvcc")
    monkeypatch.setattr(bp.PycudaBackend, "nvcc_version", lambda self: "fake nvcc")
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
    assert any(e[0] == "load" for e in log) and list(Path(os.environ["JETSON_UNET_CACHE"]).rglob("*.cubin"))
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


def test_no_gpu_or_no_nvcc_are_one_line_errors(monkeypatch, fake_backend):
    monkeypatch.setattr(bp, "find_nvcc", lambda: None)
    with pytest.raises(BackendUnavailable, match="nvcc"):
        bp.PycudaBackend()
    log = []
    for name, mod in fake_pycuda(log, gpus=0).items():
        monkeypatch.setitem(sys.modules, name, mod)
    with pytest.raises(BackendUnavailable, match="no CUDA GPU"):
        bp.PycudaBackend()


@pytest.mark.slow
def test_real_kernels_compile_with_nvcc(tmp_path):
    """Where pycuda and nvcc are installed (no GPU needed): the kernel loader's source, for sm_87."""
    pytest.importorskip("pycuda.compiler")
    nvcc = bp.find_nvcc()
    if nvcc is None:
        pytest.skip("no nvcc")
    import pycuda.compiler
    import pycuda.driver
    from jetson_unet.ops.keys import SimpleKey
    from jetson_unet.build.sources import module_source
    keys = [SimpleKey("dwconv", "fp16", 7), SimpleKey("final", "bf16")]
    nv = bp.nvcc_args(nvrtc_options(87))
    cubin = bp.build_cubin(pycuda.compiler, pycuda.driver.CompileError, module_source(keys), "t.cu", nv, nvcc,
                           tmp_path, "v")
    assert cubin[:4] == b"\x7fELF" and b"dwconv7_f16" in cubin and b"final_conv_bf16" in cubin

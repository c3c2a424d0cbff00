"""Programmatic dependent launch without a GPU (runtime/gpu/launch_ex.py): the switch, the packed
kernel arguments, the module source, and which launches of a call ask for it (the recording fakes).
On the GPU, tests/gpu/test_gpu_pdl.py checks the calls bit-identical to plain launches."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "gpu"))
from fakes import FakeBackend, own_module_cache  # noqa: E402,F401  (the fixture: autouse)

from jetson_unet.model.config import UNetConfig  # noqa: E402
from jetson_unet.errors import BackendUnavailable, ConfigError, LaunchError  # noqa: E402
from jetson_unet.executor import launch_ex  # noqa: E402
from jetson_unet.backends.cupy import CupyBackend  # noqa: E402
from jetson_unet.executor.executor import GpuExecutor  # noqa: E402
from jetson_unet.build.sources import module_source, nvrtc_options  # noqa: E402
from jetson_unet.model.weights import random_params  # noqa: E402


class W:
    def __init__(self, cfg: UNetConfig) -> None:
        self.config, self.params = cfg, random_params(cfg, 1)


class PdlBackend(FakeBackend):
    def supports_pdl(self) -> bool:   # as CupyBackend.supports_pdl, with a driver that has it
        return CupyBackend.supports_pdl(self)


@pytest.fixture(autouse=True)
def a_driver(monkeypatch):
    """A loaded launch_ex.Driver stands in for libcuda (none here); PdlBackend never launches through it."""
    monkeypatch.setitem(launch_ex._DRIVER, "cuda", object())


@pytest.fixture(scope="module")
def weights(tiny_config) -> W:
    return W(tiny_config)


@pytest.mark.parametrize("raw,want", [(None, False), ("", False), ("0", False), ("1", True), (" 1 ", True)])
def test_pdl_from_env(raw, want):
    assert launch_ex.pdl_from_env({} if raw is None else {launch_ex.PDL_ENV: raw}) is want


@pytest.mark.parametrize("raw", ["2", "yes", "on"])
def test_pdl_from_env_refuses_nonsense(raw):
    with pytest.raises(ConfigError, match=launch_ex.PDL_ENV):
        launch_ex.pdl_from_env({launch_ex.PDL_ENV: raw})


def test_params_point_at_each_value_at_its_alignment():
    args = (np.uint64(0x1234_5678_9ABC), np.int32(-7), np.float32(1.5), np.uint64(42), np.int32(3))
    p = launch_ex.Params(args)
    addr = [int(p.ptrs[i]) for i in range(len(args))]
    assert [a - addr[0] for a in addr] == [0, 8, 12, 16, 24]   # the uint64 after two 4-byte values: 16
    assert ctypes.c_uint64.from_address(addr[0]).value == 0x1234_5678_9ABC
    assert ctypes.c_int32.from_address(addr[1]).value == -7
    assert ctypes.c_float.from_address(addr[2]).value == 1.5
    assert ctypes.c_uint64.from_address(addr[3]).value == 42
    assert ctypes.c_int32.from_address(addr[4]).value == 3
    assert p.args == args


def test_params_refuse_python_numbers():
    with pytest.raises(TypeError, match="numpy fixed-width"):
        launch_ex.Params((np.uint64(1), 5))


def test_default_module_source_has_no_pdl(weights):
    """Off, GRID_DEPENDENCY compiles to nothing (no define); on, the module only gains the define."""
    ex = GpuExecutor(weights, "fp16", batch=1, backend=FakeBackend(arch=90))
    keys = {s.key for s in ex.specs}
    assert not ex.pdl and "#define JETSON_UNET_PDL" not in ex.kernels.source
    assert module_source(keys) == module_source(keys, pdl=False)
    assert module_source(keys, pdl=True) == "#define JETSON_UNET_PDL 1\n" + module_source(keys)
    on = GpuExecutor(weights, "fp16", batch=1, backend=PdlBackend(arch=90), pdl=True)
    assert on.kernels.source == "#define JETSON_UNET_PDL 1\n" + ex.kernels.source


def kinds(be: FakeBackend) -> list:
    return [k for _, k in be.launch_streams]


def test_pdl_launches_all_but_the_first_kernel_of_a_call(weights):
    be = PdlBackend(arch=90)
    ex = GpuExecutor(weights, "fp16", batch=2, backend=be, pdl=True)
    assert ex.pdl and ex.kernels.source.startswith("#define JETSON_UNET_PDL 1\n")
    n = ex.launches_per_call
    ex.run(ex.stream)            # the first call waits on each op's weight upload: all plain
    assert kinds(be) == ["plain"] * n
    plain = list(be.launches)
    be.launches.clear()
    be.launch_streams.clear()
    ex.run(ex.stream)            # the first kernel follows a copy or another graph: plain
    assert kinds(be) == ["plain"] + ["pdl"] * (n - 1)
    assert [e[:3] + (e[4],) for e in be.launches] == [e[:3] + (e[4],) for e in plain]
    for got, want in zip(be.launches, plain):   # the packed arguments are the plain ones
        assert len(got[3]) == len(want[3]) and all(type(a) is type(b) and a == b for a, b in zip(got[3], want[3]))
    be.launches.clear()
    ex.run(ex.stream, ex.t_row_ptr(5))   # other timesteps: packed again, and kept
    assert be.launches[1:] != plain[1:]
    assert all(len(L.packed) <= 4 for L in ex.launches)


@pytest.mark.parametrize("arch,backend_pdl,want", [(87, True, False), (90, False, False), (90, True, True)])
def test_pdl_only_on_sm90_and_a_backend_that_has_it(weights, monkeypatch, arch, backend_pdl, want):
    monkeypatch.setenv(launch_ex.PDL_ENV, "1")
    be = (PdlBackend if backend_pdl else FakeBackend)(arch=arch)
    ex = GpuExecutor(weights, "fp16", batch=1, backend=be)
    assert ex.pdl is want
    assert ("#define JETSON_UNET_PDL" in ex.kernels.source) is want
    monkeypatch.setenv(launch_ex.PDL_ENV, "0")
    assert GpuExecutor(weights, "fp16", batch=1, backend=be).pdl is False


@pytest.mark.slow
@pytest.mark.parametrize("arch,want", [(87, 0), (90, 1)])
def test_griddepcontrol_only_in_sm90_pdl_builds(weights, tmp_path, arch, want):
    """nvcc's PTX of a PDL module: one wait per kernel for sm_90, none for the Orin's sm_87."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc")
    ex = GpuExecutor(weights, "fp16", batch=1, backend=FakeBackend(arch=90))
    src = tmp_path / "m.cu"
    src.write_text(module_source({s.key for s in ex.specs}, pdl=True))
    opts = [o for o in nvrtc_options(arch) if o.startswith(("-std", "-I"))]
    r = subprocess.run([nvcc, "-ptx", f"-arch=sm_{arch}", *opts, str(src), "-o", str(tmp_path / "m.ptx")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    ptx = (tmp_path / "m.ptx").read_text()
    kernels = ptx.count(".entry ") - ptx.count(".entry noise_")   # the noise kernels run outside a call
    assert kernels == len({s.key.symbol for s in ex.specs})
    assert ptx.count("griddepcontrol.wait") == want * kernels
    assert "griddepcontrol.launch_dependents" not in ptx   # the next kernel launches as this one exits


def test_driver_names_a_refused_launch():
    """A launch the driver refuses raises LaunchError naming the kernel, its shape and the CUresult."""
    drv = object.__new__(launch_ex.Driver)
    seen = {}

    def launch_ex_fn(cfg, func, params, extra):
        c = cfg._obj
        seen.update(grid=tuple(c.grid), block=tuple(c.block), smem=c.smem, attr=(c.attrs[0].id, c.attrs[0].value[0]))
        return 700

    def name_fn(rc, out):
        out._obj.value = b"CUDA_ERROR_ILLEGAL_ADDRESS"
        return 0

    drv._fn, drv._name = launch_ex_fn, name_fn
    drv._attr = launch_ex._Attr(id=launch_ex._ATTR_PROGRAMMATIC)
    drv._attr.value[0] = 1
    with pytest.raises(LaunchError, match=r"launching conv_x \(grid \(3, 2, 1\), block \(128, 1, 1\), 512 B.*"
                                          r"CUDA_ERROR_ILLEGAL_ADDRESS \(700\)"):
        drv.launch(1234, (3, 2, 1), (128, 1, 1), launch_ex.Params((np.uint64(1),)), 512, 0, "conv_x")
    assert seen == {"grid": (3, 2, 1), "block": (128, 1, 1), "smem": 512, "attr": (6, 1)}


def test_no_driver_is_one_clear_line_before_any_work(monkeypatch, weights):
    def no_lib(name):
        raise OSError(f"{name}: cannot open shared object file")
    monkeypatch.setattr(launch_ex.ctypes, "CDLL", no_lib)
    monkeypatch.delitem(launch_ex._DRIVER, "cuda")
    be = PdlBackend(arch=90)
    with pytest.raises(BackendUnavailable, match="cuLaunchKernelEx: libcuda.so.1: cannot open"):
        GpuExecutor(weights, "fp16", batch=1, backend=be, pdl=True)
    assert be.compiled == [] and be.copies == []   # nothing compiled or uploaded
    assert GpuExecutor(weights, "fp16", batch=1, backend=be, pdl=False).pdl is False

"""Faults on the device while sampling: a GPU out-of-memory (refused before anything is built, or a
cudaMalloc that fails after the check passed) and a kernel error mid-run (a launch the driver
refuses) each give ONE line (jetson-sample: exit 1) or one typed exception (the API: ArenaError,
GpuRunError), free what the pipeline had taken on the device, and leave no output file; the
pipeline stays usable.

The first tests drive the same faults through the fake backend (tests/helpers/fakes.py), so they
run everywhere; the ones marked gpu run them on a real GPU through CuPy (skipped without one).
"""
from __future__ import annotations

import gc
import os
import weakref
from pathlib import Path
from typing import Any, List

import numpy as np
import pytest

from tests.helpers.fakes import FakeBackend, FakeBuffer, FakeFunction, own_module_cache  # noqa: F401  (an autouse fixture)
from jetson_unet import cli
from jetson_unet.errors import ArenaError
from jetson_unet.pipeline import Pipeline
from jetson_unet.sampling.gpu import GpuRunError, device_error

# The real-GPU faults fill the device's memory and count what comes back: other tests running beside
# them (pytest-xdist) would fail for lack of memory and move the count. They run in a session alone.
ALONE = pytest.mark.skipif(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1,
                           reason="fills the GPU's memory: run alone, pytest -m gpu tests/gpu/test_gpu_faults.py")
MB = 1 << 20
FREE_TOL = 16 * MB   # device memory not back after a fault (CUDA's 2 MB pages, context bookkeeping)


def cuda_error(name: str, module: str, message: str) -> BaseException:
    """An exception of the backend library's kind (what CuPy or pycuda raises), without a GPU."""
    return type(name, (RuntimeError,), {"__module__": module})(message)


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def nothing_written(folder: Path) -> None:
    assert sorted(p.name for p in folder.iterdir() if p.name != "weights.npz") == []


# ---- the mapping ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("exc,line", [
    (cuda_error("CUDARuntimeError", "cupy_backends.cuda.api.runtime", "cudaErrorMemoryAllocation: out of memory"),
     "out of memory while sampling on the GPU: CUDARuntimeError: cudaErrorMemoryAllocation: out of memory"),
    (cuda_error("OutOfMemoryError", "cupy.cuda.memory", "Out of memory allocating 1,024 bytes\n(allocated so far: 0)"),
     "out of memory while sampling on the GPU: OutOfMemoryError: Out of memory allocating 1,024 bytes (allocated"),
    (cuda_error("CUDADriverError", "cupy_backends.cuda.api.driver", "CUDA_ERROR_INVALID_VALUE: invalid argument"),
     "CUDA error while sampling on the GPU: CUDADriverError: CUDA_ERROR_INVALID_VALUE: invalid argument"),
    (cuda_error("LaunchError", "pycuda._driver", "cuLaunchKernel failed: an illegal memory access"),
     "CUDA error while sampling on the GPU: LaunchError: cuLaunchKernel failed"),
    (MemoryError(), "out of memory while sampling on the GPU: MemoryError: (no message)"),
])
def test_device_errors_become_one_line(exc, line):
    err = device_error(exc, "sampling")
    assert isinstance(err, GpuRunError) and str(err).startswith(line) and "\n" not in str(err)


@pytest.mark.parametrize("exc", [ValueError("a bug"), KeyError("x"), ArenaError("typed already"), KeyboardInterrupt()])
def test_other_errors_are_left_alone(exc):
    assert device_error(exc, "sampling") is None


# ---- through the fake backend ------------------------------------------------------------------------------
class Faulty(FakeBackend):
    """Allocation number `fail_alloc` raises CuPy's cudaMalloc error; every buffer is tracked."""

    def __init__(self, fail_alloc: int = 0) -> None:
        super().__init__()
        self.fail_alloc = fail_alloc
        self.tracked: List[Any] = []   # per allocation: a weak reference to its buffer (None: it failed)

    def alloc(self, nbytes: int):
        if len(self.tracked) + 1 == self.fail_alloc:
            self.tracked.append(None)
            raise cuda_error("CUDARuntimeError", "cupy_backends.cuda.api.runtime",
                             "cudaErrorMemoryAllocation: out of memory")
        b = FakeBuffer(self._next, nbytes)   # as FakeBackend.alloc, but held by its owner alone
        self._next += (nbytes + MB) // 256 * 256
        self.tracked.append(weakref.ref(b))
        return b

    def held(self) -> int:
        """Buffers neither freed nor collected."""
        gc.collect()
        return sum(1 for r in self.tracked if r is not None and r() is not None and r().ptr)


@pytest.fixture
def faulty(monkeypatch):
    def install(be: Faulty) -> Faulty:
        monkeypatch.setattr("jetson_unet.backends.get_backend", lambda name="cupy", sms=None: be)
        return be
    return install


@pytest.mark.parametrize("fail_alloc", [2, 3], ids=["executor-arena", "sampler-tables"])
def test_fake_out_of_memory(tiny_weights, faulty, fail_alloc):
    """Allocation 2 fails inside the executor's construction (its weights buffer already taken),
    allocation 3 in the first run (the sampler's tables): both free everything and say it in one line."""
    be = faulty(Faulty(fail_alloc))
    with Pipeline(tiny_weights, backend="cupy", precision="fp32", graphs=False, noise="host") as pipe:
        with pytest.raises(GpuRunError, match="^out of memory while sampling on the GPU: CUDARuntimeError") as ei:
            pipe.sample(batch=2, steps=2)
        assert be.held() == 0 and pipe.loaded == ()   # the half-built executor's buffer too
        assert "\n" not in str(ei.value) and ei.value.__context__ is None
        be.fail_alloc = 0
        assert pipe.sample(batch=2, steps=2).shape == (2, 16, 16, 3)   # usable again


def test_fake_kernel_error_mid_run(tiny_weights, faulty, monkeypatch):
    be = faulty(Faulty())
    launches = {"n": 0, "fail_at": 40}
    real = FakeFunction.launch

    def launch(self, *a, **k):
        launches["n"] += 1
        if launches["n"] == launches["fail_at"]:
            raise cuda_error("CUDADriverError", "cupy_backends.cuda.api.driver",
                             "CUDA_ERROR_INVALID_VALUE: invalid argument")
        return real(self, *a, **k)

    monkeypatch.setattr(FakeFunction, "launch", launch)
    with Pipeline(tiny_weights, backend="cupy", precision="fp32", graphs=False, noise="host") as pipe:
        with pytest.raises(GpuRunError, match="^CUDA error while sampling on the GPU: CUDADriverError: "
                                              "CUDA_ERROR_INVALID_VALUE"):
            pipe.sample(batch=2, steps=10)
        assert be.held() == 0
        assert pipe.sample(batch=2, steps=10).shape == (2, 16, 16, 3)


def test_fake_faults_through_the_cli(tiny_weights_path, faulty, tmp_path, capsys):
    be = faulty(Faulty(fail_alloc=3))
    out = tmp_path / "grid.png"
    rc = cli.main(["--weights", str(tiny_weights_path), "--backend", "cupy", "--precision", "fp32", "--noise", "host",
                   "--batch", "2", "--steps", "2", "--out", str(out), "--quiet"])
    line = one_line(capsys)
    assert rc == 1 and line.startswith("jetson-sample: error: out of memory while sampling on the GPU")
    assert be.held() == 0
    nothing_written(tmp_path)


# ---- on a GPU -------------------------------------------------------------------------------------------------
def weights_file(weights: Any, folder: Path) -> str:
    if Path(weights.path).is_file():
        return str(weights.path)
    from jetson_unet.model.weights import save_weights
    path = folder / "weights.npz"
    save_weights(path, weights.config, weights.params)
    return str(path)


def sample_argv(path: str, out: Path, *extra: str) -> List[str]:
    return ["--weights", path, "--backend", "cupy", "--precision", "fp32", "--batch", "4", "--steps", "4",
            "--out", str(out), "--quiet", *extra]


def warm(backend, path: str, **kw) -> int:
    """Run once (kernel modules loaded for good, as a real first run leaves them); the bytes the
    pipeline held on the device while it ran."""
    free0 = backend.mem_info()[0]
    with Pipeline(path, backend="cupy", precision="fp32", **kw) as pipe:
        pipe.load(4)
        held = free0 - backend.mem_info()[0]
        assert np.isfinite(pipe.sample(batch=4, steps=4)).all()
    return held


@pytest.mark.gpu
@ALONE
@pytest.mark.parametrize("how", ["refused", "alloc-2", "alloc-3"])
def test_gpu_out_of_memory(backend, weights, tmp_path, capsys, monkeypatch, how):
    """refused: the device nearly full before sampling (ArenaError with the largest batch that fits);
    alloc-N: cudaMalloc number N fails for real (asked for more than the card has) after the check:
    2 inside the executor's construction, 3 in the first run. One line, exit 1, no file, and the
    device memory back to what it was."""
    path = weights_file(weights, tmp_path)
    held = warm(backend, path)
    assert held > 3 * FREE_TOL, "the pipeline must hold enough for the check below to mean something"
    free0 = backend.mem_info()[0]
    hog = None
    if how == "refused":
        hog = backend.alloc(max(free0 - held // 4, 0))   # a quarter of what the pipeline needs is left
    else:
        real, calls = backend.alloc, []

        def alloc(nbytes: int):
            calls.append(nbytes)
            return real(nbytes + (backend.mem_info()[1] if len(calls) == int(how[-1]) else 0))
        monkeypatch.setattr(backend, "alloc", alloc)
    out = tmp_path / "grid.png"
    rc = cli.main(sample_argv(path, out))
    line = one_line(capsys)
    if hog is not None:
        hog.free()
        assert "the largest batch that fits is" in line
    else:
        monkeypatch.undo()
        assert "out of memory while" in line
    assert rc == 1 and line.startswith("jetson-sample: error: ")
    assert not out.exists()
    gc.collect()
    assert backend.mem_info()[0] >= free0 - FREE_TOL


@pytest.mark.gpu
@ALONE
@pytest.mark.parametrize("mode", ["gpu", "cpu"])
def test_gpu_kernel_error_mid_run(backend, weights, tmp_path, capsys, monkeypatch, mode):
    """A launch the driver refuses (a block of 2048 threads: CUDA_ERROR_INVALID_VALUE) halfway
    through the run's launches: one line and no file from jetson-sample; GpuRunError from the API,
    whose pipeline then samples again; the device memory back to what it was."""
    from jetson_unet.backends.cupy import CupyFunction
    path = weights_file(weights, tmp_path)
    real = CupyFunction.launch
    count = {"n": 0, "fail_at": 0}

    def launch(self, grid, block, args, shared_mem=0, stream=None):
        count["n"] += 1
        if count["n"] == count["fail_at"]:
            block = (2048, 1, 1)   # above the 1024 threads a block may have: refused at launch
        return real(self, grid, block, args, shared_mem, stream)

    monkeypatch.setattr(CupyFunction, "launch", launch)
    kw = dict(mode=mode, graphs=False)
    warm(backend, path, **kw)
    count["fail_at"], count["n"] = count["n"] // 2, 0   # the launches of a warm run: fail halfway
    assert count["fail_at"] > 50
    free0 = backend.mem_info()[0]
    out = tmp_path / "grid.png"
    rc = cli.main(sample_argv(path, out, "--mode", mode, "--no-graphs"))
    line = one_line(capsys)
    assert rc == 1 and line.startswith("jetson-sample: error: CUDA error while sampling on the GPU: "), line
    assert not out.exists()
    gc.collect()
    assert backend.mem_info()[0] >= free0 - FREE_TOL
    count["n"] = 0
    with Pipeline(path, backend="cupy", precision="fp32", **kw) as pipe:
        with pytest.raises(GpuRunError, match="^CUDA error while sampling on the GPU"):
            pipe.sample(batch=4, steps=4)
        assert np.isfinite(pipe.sample(batch=4, steps=4)).all()   # count is past fail_at: runs clean

"""Cold start on the CPU: Pipeline.load builds the engine ahead of the first sample (numpy, and the
GPU path over the recording fakes), and the jetson_unet.bench.coldstart child prints one JSON line of phase
times that sum to at most the total, counting the kernel modules it compiled."""
from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.cubin_fakes import CubinBackend, cupy_nvrtc

from jetson_unet.bench import coldstart
from jetson_unet.errors import UsageError
from jetson_unet.backends import _CACHE
from jetson_unet.build.loader import KernelSet
from jetson_unet.sampling.gpu import GpuSampler
from jetson_unet.pipeline import Pipeline

ROOT = Path(__file__).resolve().parents[2]
DDIM2 = ["--sampler", "ddim", "--steps", "2"]


@pytest.fixture
def nvrtc(monkeypatch):
    """CuPy's NVRTC binding, as the loader finds it (a FakeNvrtc): its `calls` are the modules built."""
    return cupy_nvrtc(monkeypatch)


@pytest.fixture
def fake_cupy(tmp_path, monkeypatch, nvrtc):
    """`get_backend("cupy")` is a fake that loads cubins (compiler "nvrtc": built through the fake
    NVRTC), over an empty cubin cache and no modules in memory: a fresh process on an empty kernel
    cache."""
    be = CubinBackend()
    monkeypatch.setitem(_CACHE, ("cupy", None), be)
    monkeypatch.setattr(KernelSet, "_cache", {})
    monkeypatch.setenv("JETSON_UNET_CACHE", str(tmp_path / "cache"))
    return be


# ---- Pipeline.load ----------------------------------------------------------------------------------

def test_load_on_numpy_returns_self_and_sampling_follows(tiny_weights):
    with Pipeline(tiny_weights, backend="numpy") as pipe:
        assert pipe.load() is pipe
        assert pipe.sample(batch=1, steps=2, sampler="ddim").shape == (1, 16, 16, 3)
        with pytest.raises(UsageError, match="batch must be >= 1"):
            pipe.load(0)
    with pytest.raises(UsageError, match="closed"):
        pipe.load()


def test_load_builds_the_gpu_engine_that_sample_then_uses(tiny_weights, fake_cupy, nvrtc):
    with Pipeline(tiny_weights, backend="cupy", graphs=False) as pipe:
        assert pipe.loaded == (), "nothing is built before load() or sample()"
        assert pipe.load(2) is pipe
        eng = pipe._engines[2]
        assert isinstance(eng, GpuSampler) and eng.batch == 2 and eng._tables is not None
        assert len(nvrtc.calls) == 1 and len(fake_cupy.loads) == 1 and fake_cupy.compiled == []
        uploads = len(fake_cupy.copies)
        assert uploads > 0 and all(not ex._pending for ex in eng.executors), "the weight upload was waited for"
        assert all(ex._host_w is None for ex in eng.executors) and fake_cupy.trims == 1, "its staging freed"
        pipe.sample(batch=2, steps=2, sampler="ddim")
        assert pipe._engines == {2: eng} and len(nvrtc.calls) == 1 and len(fake_cupy.loads) == 1
        pipe.load(1)
        assert pipe.loaded == (1,) and not eng.executors, "the old one is freed"
        assert pipe._engines[1].compute[0] is eng.compute[0], "one compute stream across batch sizes"
    assert pipe.loaded == ()
    with pytest.raises(UsageError, match="closed"):
        pipe.load(1)


def test_a_batch_runs_as_the_loaded_engines_calls_of_least_time(tiny_weights, fake_cupy, monkeypatch):
    """load() runs and times each engine (here: the 8-SM slice's measured costs); a sample() runs as the calls
    split_batch picks, each on the smallest engine that holds its images, padded with its last seed;
    the callback counts the steps of all the calls."""
    from jetson_unet import pipeline
    slice_costs = {1: (0.72e-3, 0.3e-3), 4: (1.89e-3, 0.4e-3)}
    timed = []   # load() times the sizes ascending; the last load() one more
    in_order = itertools.chain([slice_costs[1], slice_costs[4]], itertools.repeat((1e-3, 0.0)))
    monkeypatch.setattr(pipeline, "time_engine", lambda run: timed.append(run) or next(in_order))
    runs = []
    real = GpuSampler.images

    def images(self, plan, seeds, *rest):
        runs.append((self.batch, list(seeds) if not isinstance(seeds, int) else seeds))
        return real(self, plan, seeds, *rest)
    monkeypatch.setattr(GpuSampler, "images", images)
    with Pipeline(tiny_weights, backend="cupy", graphs=False) as pipe:
        pipe.load([4, 1, 4])
        assert pipe.loaded == (1, 4) and len(timed) == 2 and pipe.engine_costs == slice_costs
        engines = dict(pipe._engines)
        assert pipe.sample(seeds=[7, 3, 5], steps=2, sampler="ddim").shape == (3, 16, 16, 3)
        assert pipe.sample(seed=9, steps=2, sampler="ddim").shape == (1, 16, 16, 3)
        seen = []
        assert pipe.sample(batch=6, seed=10, steps=2, sampler="ddim", callback=lambda i, n: seen.append((i, n))).shape[0] == 6
        assert runs[:2] == [(1, [0]), (4, [0] * 4)], "load() ran each engine once"
        assert runs[2:] == [(4, [7, 3, 5, 5]), (1, [9]), (4, [10, 11, 12, 13]), (1, [14]), (1, [15])]
        assert seen == [(i, 6) for i in range(6)], "the steps of the three calls, counted as one run"
        assert pipe._engines == engines, "no engine built: the loaded ones run every batch"
        pipe.load([2])
        assert pipe.loaded == (2,) and not engines[1].executors and not engines[4].executors


def test_without_load_a_batch_builds_its_own_engine(tiny_weights, fake_cupy):
    with Pipeline(tiny_weights, backend="cupy", graphs=False) as pipe:
        pipe.sample(batch=5, steps=2, sampler="ddim")
        assert pipe.loaded == (5,) and pipe.engine_costs == {}
        five = pipe._engines[5]
        assert five.executors[0]._host_w is None, "its first run freed its staging"
        pipe.sample(batch=6, steps=2, sampler="ddim")
        assert pipe.loaded == (6,) and not five.executors, "which a batch of another size replaces"


def test_a_size_that_does_not_fit_is_not_kept(tiny_weights, fake_cupy):
    from jetson_unet.errors import ArenaError
    with Pipeline(tiny_weights, backend="cupy", graphs=False) as pipe:
        with pytest.raises(ArenaError):
            pipe.load([1, 10 ** 7])
        assert pipe.loaded == (1,) and pipe._sizes == (1,)


def test_load_waits_for_a_sample_in_flight(tiny_weights):
    with Pipeline(tiny_weights, backend="numpy") as pipe:
        done = threading.Event()
        with pipe._lock:                     # as a sample() running in another thread holds it
            t = threading.Thread(target=lambda: (pipe.load(1), done.set()))
            t.start()
            time.sleep(0.05)
            assert not done.is_set()
        t.join(5)
        assert done.is_set()


# ---- the child ----------------------------------------------------------------------------------------

def check_phases(rec: dict) -> None:
    for k in coldstart.PHASES + ("kernels_s", "upload_s"):
        assert isinstance(rec[k], float) and rec[k] >= 0, (k, rec[k])
    parts = sum(rec[k] for k in ("import_s", "weights_s", "load_s", "first_step_s", "image_s"))
    assert parts <= rec["total_s"] * (1 + 1e-12), rec
    assert rec["ready_s"] == pytest.approx(rec["weights_s"] + rec["load_s"] + rec["first_step_s"])
    assert rec["kernels_s"] + rec["upload_s"] <= rec["load_s"] * (1 + 1e-9) + 1e-9, rec


def test_child_process_prints_one_json_line_of_phases(tiny_weights_path):
    r = subprocess.run([sys.executable, "-m", "jetson_unet.bench.coldstart", "--weights", str(tiny_weights_path),
                        "--backend", "numpy"] + DDIM2, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1, r.stdout
    rec = coldstart.parse_line(lines[0])
    assert rec is not None, lines[0]
    check_phases(rec)
    assert (rec["backend"], rec["precision"], rec["batch"], rec["steps"], rec["compiles"]) == ("numpy", "fp32", 1, 2, 0)
    assert rec["import_s"] > 0.01, "numpy and the runtime were imported inside the child's clock"


def test_child_counts_the_kernel_modules_it_compiles(tiny_weights_path, fake_cupy, nvrtc, capsys):
    args = ["--weights", str(tiny_weights_path), "--backend", "cupy", "--no-graphs"] + DDIM2
    assert coldstart.main(args) == 0
    cold = json.loads(capsys.readouterr().out)
    check_phases(cold)
    assert (cold["backend"], cold["precision"], cold["mode"], cold["compiles"]) == ("cupy", "fp16", "gpu", 1)
    compiling = [n for n in cold["kernel_notices"] if n.startswith("compiling GPU kernels for sm_87")]
    tiles = [n for n in cold["kernel_notices"] if n.startswith("no measured tiles for ")]   # the fake GPU has none
    assert len(compiling) == 1 and len(tiles) == 1 and len(cold["kernel_notices"]) == 2
    KernelSet._cache.clear()                 # a second process on the cache the first one filled
    assert coldstart.main(args) == 0
    warm = json.loads(capsys.readouterr().out)
    assert warm["compiles"] == 0 and warm["kernel_notices"] == tiles and len(nvrtc.calls) == 1
    assert (cold["kernels_from"], warm["kernels_from"]) == (["compiled"], ["cache"])
    assert len(fake_cupy.loads) == 2 and fake_cupy.loads[0] == fake_cupy.loads[1], "the cached cubin"


def test_child_times_a_new_batch_size_in_the_same_pipeline(tiny_weights_path, fake_cupy, nvrtc, capsys):
    """--then-batch: the module serves every batch size, so the new engine compiles and loads nothing."""
    args = ["--weights", str(tiny_weights_path), "--backend", "cupy", "--no-graphs", "--then-batch", "3"] + DDIM2
    assert coldstart.main(args) == 0
    rec = json.loads(capsys.readouterr().out)
    check_phases(rec)
    assert (rec["compiles"], rec["new_batch"], rec["new_batch_compiles"], rec["new_batch_kernels_s"]) == (1, 3, 0, 0)
    assert rec["new_batch_s"] == pytest.approx(rec["new_batch_load_s"] + rec["new_batch_image_s"])
    assert len(nvrtc.calls) == 1 and len(fake_cupy.loads) == 1


def test_child_failure_is_one_line_and_an_exit_code(tmp_path, capsys):
    assert coldstart.main(["--weights", str(tmp_path / "none.npz"), "--backend", "numpy"]) == 2
    io = capsys.readouterr()
    assert io.out == "" and io.err.count("\n") == 1 and "none.npz" in io.err


@pytest.mark.parametrize("line", [None, "", "wrote x.png", "[1, 2]", '{"import_s": 1}',
                                  json.dumps(dict.fromkeys(coldstart.PHASES, -1.0)),
                                  json.dumps(dict.fromkeys(coldstart.PHASES, True))])
def test_parse_line_takes_only_a_complete_record(line):
    assert coldstart.parse_line(line) is None

"""CPU checks of the memory plan (jetson_unet.executor.memory): the report's bytes equal what the executor and
the sampler request from a recording fake backend, the executor refuses a batch before compiling,
budgets, the largest-batch search, and `jetson-sample --plan-only` / `--prepare` end to end."""
from __future__ import annotations

import os
import re

import pytest

from tests.helpers.fakes import FakeBackend

from jetson_unet import cli
from jetson_unet.model.config import UNetConfig
from jetson_unet.errors import ArenaError, UsageError
from jetson_unet.build import aot
from jetson_unet.executor import memory
from jetson_unet.executor.executor import GpuExecutor
from jetson_unet.build.loader import KernelSet
from jetson_unet.sampling.gpu import GpuSampler
from jetson_unet.model.weights import random_params, save_weights

TINY = UNetConfig(image_size=16, dim=8, dim_mults=(1, 2), time_dim=32)
ODD = UNetConfig(image_size=12, dim=6, dim_mults=(1, 2, 3), time_dim=20)


class W:
    def __init__(self, cfg, seed=0):
        self.config, self.params = cfg, random_params(cfg, seed)


class RecordingBackend(FakeBackend):
    """FakeBackend that also records every page-locked host allocation."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.pinned_bytes = 0

    def pinned(self, shape, dtype):
        a = super().pinned(shape, dtype)
        self.pinned_bytes += a.nbytes
        return a


@pytest.fixture(autouse=True)
def fresh_modules(monkeypatch):
    monkeypatch.setattr(KernelSet, "_cache", {})


@pytest.mark.parametrize("cfg", [UNetConfig(), ODD], ids=["default", "odd"])
@pytest.mark.parametrize("precision, batch, sms", [("fp16", 1, 8), ("fp32", 3, 4), ("bf16", 16, 132)])
@pytest.mark.parametrize("noise", ["host", "device"])
def test_gpu_mode_report_equals_what_the_sampler_allocates(cfg, precision, batch, sms, noise):
    w = W(cfg)
    be = RecordingBackend(sms=sms)
    s = GpuSampler(w, precision, batch, mode="gpu", backend=be, noise=noise)
    s._prepare_gpu()                                   # the step tables and noise rows (+ the generator's scratch)
    wbuf, abuf, *sampler = (b.nbytes for b in be.allocs)
    assert len(sampler) == (2 if noise == "device" else 1)
    tables = sum(sampler)
    est = memory.estimate(w, precision, batch, sms, "gpu", noise)
    assert (wbuf, abuf, tables) == (est.weights_bytes, est.arena_bytes, est.sampler_bytes)
    if noise == "device":   # its pinned host rows come only with a flagged run's redraw (counted: the worst case)
        be.pinned((batch, cfg.timesteps, cfg.channels * cfg.image_size ** 2), "float32")   # [B][T][CHW]
    assert be.pinned_bytes == est.pinned_bytes
    assert est.device_bytes == wbuf + abuf + tables and est.peak_bytes == est.device_bytes + est.pinned_bytes
    ex = s.executors[0]
    assert ex.memory_estimate().arena_bytes == ex.arena.nbytes == ex.arena_report()["arena_bytes"]


def test_cpu_mode_report_equals_two_half_executors():
    w = W(ODD)
    be = RecordingBackend(sms=8)
    s = GpuSampler(w, "fp16", 5, mode="cpu", backend=be)
    assert [ex.batch for ex in s.executors] == [3, 2]
    est = memory.estimate(w, "fp16", 5, 8, "cpu")
    sizes = [b.nbytes for b in be.allocs]
    assert est.weights_bytes == sizes[0] + sizes[2] and est.arena_bytes == sizes[1] + sizes[3]
    per_run = 2 * 4 * 5 * ODD.channels * ODD.image_size ** 2      # x and eps pinned by each run
    assert est.sampler_bytes == 0 and be.pinned_bytes == est.pinned_bytes - per_run


def test_executor_refuses_before_compiling_with_the_report_line():
    w = W(UNetConfig())
    one = memory.estimate(w, "fp16", 1, 8)
    be = FakeBackend(free=(one.weights_bytes + one.arena_bytes) * 3, sms=8)
    with pytest.raises(ArenaError) as ei:
        GpuExecutor(w, "fp16", batch=64, backend=be)
    msg = str(ei.value)
    assert msg.startswith("batch 64 fp16 (executor): weights ") and " arena " in msg and "sampler" not in msg
    fits = int(re.search(r"the largest batch that fits is (\d+) ", msg).group(1))
    assert 1 <= fits < 64
    assert be.compiled == [] and be.allocs == [], "refused before any compile or allocation"
    GpuExecutor(w, "fp16", batch=fits, backend=FakeBackend(free=be.free, sms=8))
    with pytest.raises(ArenaError):
        GpuExecutor(w, "fp16", batch=fits + 1, backend=FakeBackend(free=be.free, sms=8))


def test_largest_batch_search():
    need = lambda b: 1000 + 37 * b + (b // 10) * 5  # noqa: E731  (monotone, not affine)
    for budget in (999, 1000, 1037, 5000, 123456):
        want = max([b for b in range(1, 5000) if need(b) <= budget], default=0)
        assert memory.largest_batch(need, budget) == want
        assert memory.largest_batch(need, budget, hi=10) == min(want, 10)
    assert memory.largest_batch(lambda b: b, 10 ** 9, cap=1 << 10) == 1 << 10


def test_budgets():
    assert memory.parse_budget("4gb").nbytes == 2_500_000_000 and memory.parse_budget("8GB").label == "Orin Nano 8GB"
    assert memory.parse_budget("3000000000").nbytes == memory.parse_budget("3e9").nbytes == 3 * 10 ** 9
    for bad in ("lots", "0", "-5"):
        with pytest.raises(UsageError, match="--budget"):
            memory.parse_budget(bad)


# ---- the CLI ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("w") / "tiny.npz"
    save_weights(path, TINY, random_params(TINY, seed=3))
    return str(path)


def test_plan_only_prints_the_table_and_exits_0(tiny_path, capsys):
    assert cli.main(["--plan-only", "--weights", tiny_path, "--batch", "1", "4", "--precision", "fp16", "fp32"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [ln.split() for ln in out if ln.startswith(("fp16 ", "fp32 "))]
    assert [(r[0], r[1]) for r in rows] == [("fp16", "1"), ("fp16", "4"), ("fp32", "1"), ("fp32", "4")]
    est = memory.estimate(W(TINY, 3), "fp32", 4, 8)
    assert float(rows[3][7]) == pytest.approx(est.peak_bytes / 1e6, abs=0.06) and rows[3][8:] == ["4GB", "8GB"]
    assert any(ln.startswith("  Orin Nano 4GB (2.50 GB, ~2.5 GB usable assumed): fp16 ") for ln in out)
    assert "peak = device + pinned" in "\n".join(out)


def test_plan_only_budget_exceeded_exits_1(tiny_path, capsys):
    one = memory.estimate(W(TINY, 3), "fp16", 1, 8).peak_bytes
    rc = cli.main(["--plan-only", "--weights", tiny_path, "--batch", "1", "64", "--precision", "fp16",
                   "--budget", str(one + 1)])
    cap = capsys.readouterr()
    assert rc == 1 and "does not fit: batch 64 fp16" in cap.err
    assert cap.out.splitlines()[-2].endswith(": fp16 1")


@pytest.mark.parametrize("args, needle", [
    (["--plan-only", "--budget", "lots"], "--budget 'lots'"),
    (["--plan-only", "--precision", "fp64"], "GPU kernels come in"),
    (["--plan-only", "--prepare"], "separate steps"),
    (["--batch", "1", "4"], "--batch takes one value here"),
    (["--arch", "87"], "--arch goes with --prepare"),
    (["--prepare", "--arch", "90"], "--sms"),
])
def test_usage_errors_exit_2(tiny_path, capsys, args, needle):
    assert cli.main(args + ["--weights", tiny_path]) == 2
    assert needle in capsys.readouterr().err


def test_prepare_cli_then_up_to_date(tiny_path, tmp_path, capsys, monkeypatch):
    from tests.helpers.cubin_fakes import fake_compiler
    log = []
    monkeypatch.setattr(aot, "pick_compiler", lambda which, **kw: fake_compiler(log))
    args = ["--prepare", "--weights", tiny_path, "--arch", "87", "--precision", "fp16", "--cache", str(tmp_path)]
    assert cli.main(args) == 0 and len(log) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"nvrtc 12.6 -> {tmp_path}/cubins/v1")
    assert "sm_87 fp16 (4/8 SMs, " in out, "one module serves both boards' tiles of this tiny model"
    assert cli.main(args) == 0 and len(log) == 1
    assert capsys.readouterr().out.count("up to date") == 1
    assert os.environ.get("JETSON_UNET_CACHE") != str(tmp_path), "--cache is scoped to the call"


def test_sampling_cli_shows_the_compile_notice_on_stderr(tiny_path, tmp_path, capsys, monkeypatch):
    """The loader's notices reach stderr through the CLI's log handler, one line each."""
    from jetson_unet.build import loader
    from jetson_unet.pipeline import Pipeline
    real = Pipeline.sample

    def sample(self, *a, **kw):
        loader.log.info(loader.compile_notice(87))      # what load_module says before compiling
        return real(self, *a, **kw)

    monkeypatch.setattr(Pipeline, "sample", sample)
    assert cli.main(["--weights", tiny_path, "--out", str(tmp_path / "g.png"), "--batch", "1", "--backend",
                     "numpy", "--steps", "2", "--sampler", "ddim"]) == 0
    err = capsys.readouterr().err
    assert "note: compiling GPU kernels for sm_87 (first run; `jetson-sample --prepare` does this ahead of time)" in err


@pytest.mark.parametrize("mode", ["gpu", "cpu"])
def test_sampler_refuses_before_building_and_counts_pinned_on_an_integrated_gpu(mode):
    """A Jetson's CPU and GPU share one DRAM: the sampler's peak (device + pinned) must fit the free
    memory there, its device bytes alone on a discrete GPU. Refused before any compile or allocation,
    with the --plan-only line and the largest batch that fits."""
    w = W(UNetConfig())
    est = memory.estimate(w, "fp16", 16, 8, mode, "host")
    free = est.device_bytes + est.pinned_bytes // 2          # the device part fits, the peak does not
    be = FakeBackend(free=free, sms=8, integrated=True)
    with pytest.raises(ArenaError) as ei:
        GpuSampler(w, "fp16", 16, mode=mode, backend=be)
    msg = str(ei.value)
    assert msg.startswith(f"batch 16 fp16 ({mode} mode): weights ") and "pinned host" in msg
    assert f"for the {est.peak_bytes} needed (device + pinned host" in msg
    fits = int(re.search(r"the largest batch that fits is (\d+) ", msg).group(1))
    assert 1 <= fits < 16 and memory.estimate(w, "fp16", fits, 8, mode, "host").peak_bytes <= free
    assert memory.estimate(w, "fp16", fits + 1, 8, mode, "host").peak_bytes > free
    assert be.compiled == [] and be.allocs == [], "refused before any compile or allocation"
    GpuSampler(w, "fp16", 16, mode=mode, backend=FakeBackend(free=free, sms=8)).close()   # discrete: fits
    with pytest.raises(ArenaError, match=r"\(on the device\)"):
        GpuSampler(w, "fp16", 16, mode=mode, backend=FakeBackend(free=est.device_bytes - 1, sms=8))


def test_executor_alone_counts_its_pinned_buffers_on_an_integrated_gpu():
    w = W(UNetConfig())
    ex = memory.estimate(w, "fp16", 4, 8, "gpu", "host")            # its executor part, less the sampler
    dev = ex.weights_bytes + ex.arena_bytes
    pinned = memory.executor_pinned(w.config, 4, ex.weights_bytes)
    with pytest.raises(ArenaError, match=r"device \+ pinned host, in the memory the CPU and GPU share"):
        GpuExecutor(w, "fp16", batch=4, backend=FakeBackend(free=dev + pinned // 2, sms=8, integrated=True))
    GpuExecutor(w, "fp16", batch=4, backend=FakeBackend(free=dev + pinned, sms=8, integrated=True)).close()
    GpuExecutor(w, "fp16", batch=4, backend=FakeBackend(free=dev, sms=8)).close()

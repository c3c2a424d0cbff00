"""CPU checks of `prepare` (jetson-sample --prepare): the module keys are exactly the executor's, the
targets and their SM counts, one build per distinct module then "up to date", one-line reports for
sm_72 and compile errors, the compiler choice; and, where nvcc is installed, the real module built
for sm_87 (test marked `slow`). No GPU needed."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cubin_fakes import (CubinBackend, FakeNvrtc, cupy_nvrtc, fake_compiler, hide_nvcc,
                         write_fake_nvcc)
from tests.helpers.fakes import FakeBackend

from jetson_unet.model.config import UNetConfig
from jetson_unet.errors import KernelCompileError, UsageError
from jetson_unet.build import aot
from jetson_unet.build import compilers
from jetson_unet.build import cache as cubins
from jetson_unet.executor.executor import GpuExecutor
from jetson_unet.build.loader import KernelSet
from jetson_unet.build.sources import module_source
from jetson_unet.ops import policy
from jetson_unet.ops.policy import KernelPolicy
from jetson_unet.model.weights import random_params

TINY = UNetConfig(image_size=16, dim=8, dim_mults=(1, 2), time_dim=32)


class W:
    def __init__(self, cfg, seed=0):
        self.config, self.params = cfg, random_params(cfg, seed)


@pytest.fixture(autouse=True)
def no_shipped_cubins(tmp_path, monkeypatch):
    """--prepare with no shipped cubins to skip (tests/host/test_shipped_cubins.py covers those)."""
    monkeypatch.setattr(aot, "shipped_cache", lambda: cubins.CubinCache(tmp_path / "no-shipped", read_only=True))


@pytest.mark.parametrize("cfg", [UNetConfig(), TINY], ids=["default", "tiny"])
@pytest.mark.parametrize("sms", [4, 8, 132])
def test_module_keys_are_what_the_executor_asks_for(cfg, sms, monkeypatch):
    monkeypatch.setattr(KernelSet, "_cache", {})
    w = W(cfg)
    for precision, batch in (("fp16", 1), ("fp32", 3), ("bf16", 100)):
        ex = GpuExecutor(w, precision, batch=batch, backend=FakeBackend(sms=sms))
        keys = aot.module_keys(w, precision, batch, sms)
        assert [k.symbol for k in keys] == ex.kernels.symbols and module_source(keys) == ex.kernels.source


def test_targets_and_batches():
    t87, t72 = aot.parse_targets(["87", "sm_72"])
    assert (t87.arch, t87.sms, t72.sms) == (87, (4, 8), (6, 8)) and "Orin Nano 4GB" in t87.label
    assert aot.parse_targets(["90"], sms=[132])[0].sms == (132,)
    assert aot.parse_targets(["native"], native=lambda: (90, 132, "H100"))[0] == \
        aot.Target(90, (132,), "sm_90 (native: H100, 132 SMs)", "H100")
    with pytest.raises(UsageError, match="--sms"):
        aot.parse_targets(["90"])
    with pytest.raises(UsageError, match="87, sm_87, or native"):
        aot.parse_targets(["orin"])
    assert aot.executor_batches([1, 5, 16]) == [1, 2, 3, 5, 8, 16]


def test_prepare_builds_each_module_once_then_is_up_to_date(tmp_path, monkeypatch):
    monkeypatch.setattr(KernelSet, "_cache", {})
    monkeypatch.setenv("JETSON_UNET_CACHE", str(tmp_path))
    w, lines, log = W(TINY), [], []
    cache = cubins.CubinCache()                          # $JETSON_UNET_CACHE/cubins/v1, as the runtime's
    targets = aot.parse_targets(["87", "72"], sms=[8])
    fails = aot.prepare(w, targets, ["fp16", "fp32"], [1, 4, 16], fake_compiler(log, unsupported={72}), cache,
                        lines.append)
    assert fails == 1 and log == [(87, "seed-unet.cu"), (87, "seed-unet.cu"), (72, "seed-unet.cu")]
    assert lines[0] == f"nvrtc 12.6 -> {tmp_path / 'cubins' / 'v1'}"
    assert sum("compiled in" in ln for ln in lines) == 2
    assert any(ln.startswith("sm_72: fp16/bf16 kernels need sm_80+") and ln.endswith("fp32 only") for ln in lines)
    assert any(ln.startswith("sm_72: skipped:") and "pip install nvidia-cuda-nvrtc-cu11" in ln for ln in lines)
    lines.clear()
    assert aot.prepare(w, targets[:1], ["fp16", "fp32"], [1], fake_compiler(log), cache, lines.append) == 0
    assert len(log) == 3 and sum("up to date" in ln for ln in lines) == 2
    nv = cupy_nvrtc(monkeypatch)                         # the runtime's own NVRTC (nvrtc 12.6) then only loads
    be = CubinBackend()
    ex = GpuExecutor(w, "fp16", batch=4, backend=be)
    assert nv.calls == [] and be.compiled == [] and len(be.loads) == 1 and ex.kernels.symbols


def _tuned_tiles_file(w, folder, device, sms, precision, batch):
    """A tuning file whose tiles differ from the built-in ones (each tunable op's last candidate)."""
    from jetson_unet.ops.common import Ctx
    from jetson_unet.ops import tuning
    from jetson_unet.model.arena import view_layout
    from jetson_unet.model.plan import build_plan
    plan = build_plan(w.config)
    ctx = Ctx(plan, w.params, precision, batch, sms, view_layout(plan))
    tiles = {op.out: tuning.candidates(op, ctx)[-1] for op in plan.ops if tuning.tunable(op, ctx)}
    path = Path(folder) / tuning.file_name(device, sms, precision, batch)
    tuning.dump_tiles(path, tiles, dict(device=device, sms=sms, precision=precision, batch=batch,
                                        config=w.config.to_dict()))
    assert aot.module_keys(w, precision, batch, sms, tiles, dirs=()) != \
        aot.module_keys(w, precision, batch, sms, dirs=())
    return path


def test_tuning_files_join_the_module_of_their_sm_count(tmp_path, monkeypatch):
    """Measured tiles (a tuning file) join the module of every run of that SM count and precision,
    whatever its device, batch or KernelPolicy: --prepare builds that one module, and a batch size
    with a file of its own, or running a neighbouring batch's, or the built-in tiles, loads it with
    no compile."""
    monkeypatch.setattr(KernelSet, "_cache", {})
    monkeypatch.setenv("JETSON_UNET_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("JETSON_UNET_TILES", str(tmp_path))
    w = W(TINY)
    _tuned_tiles_file(w, tmp_path, "fake", 8, "fp16", 1)
    _tuned_tiles_file(w, tmp_path, "other", 8, "fp16", 4)
    b1 = aot.module_keys(w, "fp16", 1, 8)
    assert b1 == aot.module_keys(w, "fp16", 16, 8) != aot.module_keys(w, "fp16", 1, 8, dirs=())
    log, lines = [], []
    native = aot.parse_targets(["native"], native=lambda: (87, 8, "fake"))
    assert aot.prepare(w, native, ["fp16"], [1, 4, 16], fake_compiler(log), cubins.CubinCache(), lines.append) == 0
    assert len(log) == 1, lines
    nv = cupy_nvrtc(monkeypatch)                              # what the runtime would compile with
    for batch, tiles in ((1, None), (4, None), (16, None), (2, "builtin"), (1, {})):
        KernelSet._cache.clear()                              # each a new process
        be = CubinBackend()                                   # device "fake", 8 SMs
        with GpuExecutor(w, "fp16", batch=batch, backend=be, policy=KernelPolicy(tiles=tiles)) as ex:
            found = tiles is None                              # "other"'s b4 file is not this device's;
            # its own b1 file stands in at every batch on 8 SMs (ops.tuning.neighbour_load)
            assert ex.tiles_from == (str(tmp_path / "tiles-fake-8sm-fp16-b1.json") if found else None)
            assert ex.tile_batch == (1 if found and batch != 1 else None)
            assert nv.calls == [] and be.compiled == [] and len(be.loads) == 1


def test_a_board_that_runs_another_sm_counts_files_gets_that_module(tmp_path, monkeypatch):
    """--prepare for the Orin Nanos plans the module each run loads: a 4-SM board's fp16 runs take the
    Orin's 8-SM files (ops.tuning.find_tiles), so the 8-SM module, the one GpuExecutor asks for on a
    4-SM GPU named Orin. Without the device named (tools.build_kernels' targets), the 4-SM module."""
    monkeypatch.setattr(KernelSet, "_cache", {})
    monkeypatch.setenv("JETSON_UNET_TILES", str(tmp_path))
    w = W(TINY)
    _tuned_tiles_file(w, tmp_path, "Orin", 8, "fp16", 2)
    (t,) = aot.parse_targets(["87"])
    (m,) = aot.plan_modules(w, t, "fp16", [1, 4])
    assert t.device == "Orin" and m.sms == (4, 8) and m.tile_sms == (8,)
    assert m.label.startswith("sm_87 fp16 (4/8 SMs, the 8-SM tiles, ")
    be = FakeBackend(sms=4)
    be.device_name = lambda: "Orin"
    for batch in (1, 4):
        ex = GpuExecutor(w, "fp16", batch=batch, backend=be)
        assert ex.tile_sms == 8 and ex.kernels.source == m.source
    assert [x.sms for x in aot.plan_modules(w, aot.Target(87, (4, 8), "sm_87"), "fp16", [1])] == [(4,), (8,)]
    assert aot.parse_targets(["native"], native=lambda: (87, 4, "Orin"))[0].device == "Orin"


def test_prepare_reports_compile_errors_in_one_line(tmp_path):
    def broken(src, name, options, arch):
        raise KernelCompileError(name, options, "warning: x\nseed-unet.cu(9): error: expected a ';'\n")
    lines = []
    fails = aot.prepare(W(TINY), aot.parse_targets(["87"], sms=[8]), ["fp32"], [1],
                        compilers.Compiler("nvcc", "nvcc: release 12.6", broken), cubins.CubinCache(tmp_path),
                        lines.append)
    assert fails == 1 and lines[-1].endswith("FAILED: seed-unet.cu(9): error: expected a ';'")


def test_pick_compiler(tmp_path, monkeypatch):
    monkeypatch.setattr(aot.nvrtc_lib, "pip_library", lambda: None)   # no pip NVRTC (tests/test_nvrtc_lib.py)
    monkeypatch.delenv(aot.nvrtc_lib.ENV, raising=False)
    assert aot.pick_compiler("auto", nvrtc=FakeNvrtc()).toolchain == "nvrtc 12.6"
    monkeypatch.setitem(sys.modules, "cupy", None)      # as on a machine without CuPy
    nvcc = write_fake_nvcc(tmp_path, b"")
    assert aot.pick_compiler("auto", nvcc=str(nvcc)).kind == "nvcc"
    with pytest.raises(UsageError, match="NVRTC is not usable here"):
        aot.pick_compiler("nvrtc")
    hide_nvcc(monkeypatch, tmp_path)
    with pytest.raises(UsageError, match="no CUDA compiler here"):
        aot.pick_compiler("auto")


# ---- the real toolchain ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_real_module_compiles_with_nvcc_for_sm87(tmp_path, monkeypatch):
    """Where nvcc is installed (no GPU needed): the executor's fp16 module of the shipped config for
    sm_87 (the tensor-core path), and fp32 for sm_72 where this nvcc still targets it (CUDA 13 does
    not: then a one-line skip and one failure). The module of an untuned board: the tuning files'
    tiles (a quarter of its kernels, ~20 s of CI) are in the shipped sm_87 cubins (tools.build_kernels
    compiles them) and among the candidates the sm_87 ptxas tests check."""
    nvcc = compilers.find_nvcc()
    if nvcc is None:
        pytest.skip("no nvcc")
    monkeypatch.setattr(policy, "tile_files", lambda *a, **k: [])
    lines = []
    comp = aot.pick_compiler("nvcc", nvcc=nvcc)
    cache = cubins.CubinCache(tmp_path)
    w = W(UNetConfig())
    untuned = aot.Target(87, (8,), "sm_87")   # no device: not the Orin's shipped files
    fails = aot.prepare(w, [untuned], ["fp16"], [1], comp, cache, lines.append)
    fails += aot.prepare(w, aot.parse_targets(["72"], sms=[8]), ["fp32"], [1], comp, cache, lines.append)
    sm72 = 72 in (compilers.nvcc_archs(nvcc) or (72,))
    assert fails == (0 if sm72 else 1), lines
    assert sm72 or lines[-1].startswith("sm_72: skipped: nvcc: ")
    built = sorted(cache.root.glob("*.cubin"))
    assert len(built) == (2 if sm72 else 1)
    for cub in built:
        data, meta = cub.read_bytes(), json.loads(cub.with_suffix(".json").read_text())
        assert data[:4] == b"\x7fELF" and cubins.elf_arch(data) == meta["arch"]
        assert cubins.check_cubin(data, meta["arch"], meta["symbols"]) is None
        cuobjdump = shutil.which("cuobjdump") or (os.path.join(os.path.dirname(nvcc), "cuobjdump"))
        if os.access(cuobjdump, os.X_OK):   # SASS of exactly sm_87 (no sm_90-only instruction can be in it)
            out = subprocess.run([cuobjdump, "--list-elf", str(cub)], capture_output=True, text=True).stdout
            assert f"sm_{meta['arch']}" in out and "sm_90" not in out, out

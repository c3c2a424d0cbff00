"""tools.lab.neighbour_tiles on a fake GPU: each named batch's tuning file runs as a run without a
file of its own would run it (at the file's batch), or as this batch's own where the neighbour rule
refuses it; all executors share one module."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.fakes import FakeBackend
from jetson_unet import tune
from jetson_unet.bench.timing import bench_weights
from jetson_unet.build.loader import KernelSet
from jetson_unet.model.arena import view_layout
from jetson_unet.model.plan import build_plan
from jetson_unet.ops.common import Ctx
from jetson_unet.ops.tuning import candidates, dump_tiles, file_name, tunable
from tools.lab import neighbour_tiles


def tuned_file(weights, folder: Path, sms: int, batch: int) -> str:
    """A tuning file of the fake GPU whose tiles are each op's last candidate."""
    plan = build_plan(weights.config)
    ctx = Ctx(plan, weights.params, "fp16", batch, sms, view_layout(plan))
    tiles = {op.out: candidates(op, ctx)[-1] for op in plan.ops if tunable(op, ctx)}
    name = file_name("fake", sms, "fp16", batch)
    dump_tiles(folder / name, tiles, dict(device="fake", sms=sms, precision="fp16", batch=batch,
                                          config=weights.config.to_dict()))
    return name


@pytest.mark.parametrize("sms, batch, files, labels", [
    (8, 2, ("1", "4"), ["built-in", "b1's file", "b4's file"]),
    (132, 4, ("16",), ["built-in", "b16's file as b4"]),
    (16, 2, ("1@8",), ["built-in", "b1@8 as b2"]),        # another SM count's file: as this batch's own
])
def test_each_file_runs_as_a_neighbour_or_as_this_batchs_own(tmp_path, monkeypatch, capsys, sms, batch, files, labels):
    monkeypatch.setenv("JETSON_UNET_TILES", str(tmp_path))
    monkeypatch.setattr(KernelSet, "_cache", {})
    weights, _ = bench_weights()
    at = {f: neighbour_tiles.file_arg(f) for f in files}
    names = {f: tuned_file(weights, tmp_path, s or sms, b) for f, (b, s) in at.items()}
    fake = FakeBackend(sms=sms)
    monkeypatch.setattr(neighbour_tiles, "cupy_backend", lambda tool, n: fake)
    monkeypatch.setattr(neighbour_tiles, "build_shards", lambda: 1)
    ran = []

    def graph_ms(ex, backend, x, iters=100):
        ran.append((ex.tiles_from and Path(ex.tiles_from).name, ex.tile_batch))
        return 1.0 + len(ran) % 3
    monkeypatch.setattr(tune, "graph_ms", graph_ms)
    assert neighbour_tiles.main(["--batch", str(batch), "--files", *files]) == 0
    runs = [(None, None)] + [(names[f], at[f][0]) if sms == 8 else ("given", None) for f in files]
    assert ran == runs * 3
    assert len(fake.compiled) == 1                                     # one module for every executor
    out = capsys.readouterr().out.splitlines()
    assert [line[2:26].strip() for line in out[1:]] == labels


def test_a_missing_file_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("JETSON_UNET_TILES", str(tmp_path))
    monkeypatch.setattr(neighbour_tiles, "cupy_backend", lambda tool, n: FakeBackend(sms=8))
    with pytest.raises(SystemExit, match="no tuning file for fake \\(8 SMs\\), fp16, batch 3"):
        neighbour_tiles.main(["--batch", "2", "--files", "3"])
    with pytest.raises(SystemExit, match="no tuning file for fake \\(4 SMs\\), fp16, batch 1"):
        neighbour_tiles.main(["--batch", "2", "--files", "1@4"])


def test_a_files_entry_is_a_batch_or_a_batch_at_an_sm_count():
    assert neighbour_tiles.file_arg("4") == (4, None)
    assert neighbour_tiles.file_arg("2@8") == (2, 8)
    with pytest.raises(Exception, match="B or B@S"):
        neighbour_tiles.file_arg("2@x")


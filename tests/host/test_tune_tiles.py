"""jetson-tune (jetson_unet.tune) on a recording fake GPU whose kernels cost what a fixed model says:
the tuner must pick each op's cheapest candidate, write a tuning file that load_tiles accepts for the
same (precision, batch, SMs) only, and GpuExecutor(policy=KernelPolicy(tiles=...)) must then launch
those tiles."""
from __future__ import annotations

import json
import os
import re
from typing import Any

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.helpers.fakes import FakeBackend
from tests.helpers.gpu import gemm_tiles, pipelined_symbols
from jetson_unet import tune
from jetson_unet.build.loader import KernelSet
from jetson_unet.errors import ConfigError
from jetson_unet.executor.executor import GpuExecutor
from jetson_unet.paths import shipped_tiles_dir
from jetson_unet.model.arena import view_layout
from jetson_unet.model.plan import build_plan
from jetson_unet.model.weights import load_weights
from jetson_unet.ops.common import SMEM_LIMIT, Ctx, TileChoice
from jetson_unet.ops.conv_halo import HALO_SMEM_LIMIT
from jetson_unet.ops.conv_pipe import PIPE_DEEP_LIMIT, PIPE_SCRATCH, deep_ring, pipe_ring_bytes
from jetson_unet.ops.keys import ConvKey
from jetson_unet.ops.policy import KernelPolicy
from jetson_unet.ops.specs import op_spec
from jetson_unet.ops.tuning import (SHIPPED, builtin_tiles, candidates, dump_tiles, k_segments, load_tiles,
                                    tunable, with_splits)


def cost_us(symbol: str, grid) -> float:
    """The fake's model: 64x32 tiles are the fastest, split-K costs a little per split."""
    base = 1.0 if "_64x32x" in symbol else 2.0
    return base + 0.01 * grid[0]


class Clock:
    t = 0.0


class Ev:
    def record(self, stream: Any) -> None:
        self.t = Clock.t

    def synchronize(self) -> None:
        pass

    def elapsed_ms(self, later: "Ev") -> float:
        return later.t - self.t


class Graph:
    def __init__(self, cost: float) -> None:
        self.cost = cost

    def launch(self, stream: Any) -> None:
        Clock.t += self.cost


class TimedFake(FakeBackend):
    def __init__(self, cost=cost_us) -> None:
        super().__init__(sms=8)
        self._mark, self.cost = 0, cost

    def event(self, timing: bool = True) -> Ev:
        return Ev()

    def capture_begin(self, stream: Any) -> None:
        self._mark = len(self.launches)

    def capture_end(self, stream: Any) -> Graph:
        cost = sum(self.cost(sym, grid) for sym, grid, *_ in self.launches[self._mark:]) / 1000.0
        return Graph(cost)


@pytest.fixture(autouse=True)
def fresh_kernel_cache():
    """The fakes' modules must not outlive these tests: KernelSet's process cache is keyed by
    backend name, and other tests read what their own fake compiled."""
    yield
    KernelSet._cache.clear()


@pytest.fixture(scope="module")
def weights():
    return load_weights(os.path.join(ROOT, "weights", "seed-unet-emoji64.safetensors"))


def test_tuner_picks_the_cheapest_tile_and_the_executor_uses_it(weights, tmp_path, monkeypatch):
    fake = TimedFake()
    monkeypatch.setattr(tune, "get_backend", lambda name, sms=None: fake)
    # no round compiles: every kernel a round runs was built before the rounds (a kernel knows its
    # op's split, and building one module set per split-K round took 15-30 s each on an H200)
    compiled, in_rounds, compile_source, time_rounds = [], [], fake.compile_source, tune.time_rounds
    monkeypatch.setattr(fake, "compile_source", lambda *a, **k: compiled.append(a[1]) or compile_source(*a, **k))

    def counted_rounds(*a, **k):
        before = len(compiled)
        seen = time_rounds(*a, **k)
        in_rounds.append(len(compiled) - before)
        return seen
    monkeypatch.setattr(tune, "time_rounds", counted_rounds)
    assert tune.main(["--precision", "fp16", "--batch", "2", "--out-dir", str(tmp_path)]) == 0
    assert in_rounds == [0, 0] and compiled
    path = tmp_path / "tiles-fake-8sm-fp16-b2.json"
    doc = json.loads(path.read_text())
    assert doc["device"] == "fake" and doc["sms"] == 8 and doc["batch"] == 2
    tiles = load_tiles(path, "fp16", 2, 8, weights.config)
    plan = build_plan(weights.config)
    ctx = Ctx(plan, weights.params, "fp16", 2, 8, view_layout(plan))
    tuned_ops = [op for op in plan.ops if tunable(op, ctx)]
    assert set(tiles) == {op.out for op in tuned_ops}
    for op in tuned_ops:
        has_64x32 = any((t.bm, t.bn) == (64, 32) for t in candidates(op, ctx))
        assert ((tiles[op.out].bm, tiles[op.out].bn) == (64, 32)) == has_64x32, op.out
        us = doc["op_us"][op.out]
        assert us["tuned"] <= us["heuristic"]
    monkeypatch.setenv("JETSON_UNET_TILES", str(tmp_path))   # found by name: device, SMs, precision, batch
    with GpuExecutor(weights, "fp16", batch=2, backend=FakeBackend(sms=8)) as ex:
        assert ex.tiles_from == str(path)
        launched = {L.name: L for L in ex.launches}
    with GpuExecutor(weights, "fp16", batch=3, backend=FakeBackend(sms=8)) as ex:
        assert ex.tiles_from == str(path) and ex.tile_batch == 2   # no file for batch 3: batch 2's, as at 2
        assert {L.name: L.fn.symbol for L in ex.launches} == {n: L.fn.symbol for n, L in launched.items()}
    for op in tuned_ops:
        t = tiles[op.out]
        assert f"_{t.bm}x{t.bn}x{t.bk}_{t.wm}x{t.wn}_" in launched[op.out].fn.symbol
        size = plan.tensors[op.inputs[1] if op.kind == "gate" else op.out].size
        assert launched[op.out].grid[0] == -(-size ** 2 // t.bm)   # one split: each costs more in the model


def test_executors_that_share_a_memo_pack_and_launch_what_fresh_ones_do(weights):
    """The tuner's rounds share one memo (each op's weights packed once per tile shape): an executor
    built after others with other tiles has the blobs, keys and module of one built alone."""
    plan = build_plan(weights.config)
    ctx = Ctx(plan, weights.params, "fp16", 2, 8, view_layout(plan))
    rounds = tune.as_rounds({op.out: candidates(op, ctx) for op in plan.ops if tunable(op, ctx)})
    memo: dict = {}
    for tiles in (rounds[1], rounds[2], rounds[1], {}):
        with GpuExecutor(weights, "fp16", batch=2, backend=FakeBackend(sms=8), policy=KernelPolicy(tiles=tiles),
                         memo=memo) as shared, \
                GpuExecutor(weights, "fp16", batch=2, backend=FakeBackend(sms=8), policy=KernelPolicy(tiles=tiles)) as alone:
            assert [s.key for s in shared.specs] == [s.key for s in alone.specs]
            assert shared.kernels.source == alone.kernels.source
            for a, b in zip(shared.specs, alone.specs):
                assert a.blobs.keys() == b.blobs.keys(), a.op.out
                for name in a.blobs:
                    assert np.array_equal(a.blobs[name], b.blobs[name]), (a.op.out, name)
    assert any(k[0] == "gemm_blobs" for k in memo) and any(k[0] == "all_tile_keys" for k in memo)


@pytest.mark.slow   # ~10-20 s of tuner rounds on the fake; the Python 3.8 run keeps the tuner's first test
def test_split_k_rounds_time_the_runner_up_tile_shapes_too(weights, tmp_path, monkeypatch):
    """A tile shape that loses at the built-in split can win at another (on an H100 at batch 16 a
    conv ran 9.41 -> 8.21 us as a 32x64 tile unsplit, where the 32x32 tile had won the tile round at
    the built-in split of two): the split-K rounds take each op's 3 fastest shapes, so here every op
    whose 32x32 tile can split in two takes it so."""
    def model(t):   # plain 64x32 fastest at the heuristic split; 32x32 second, and fastest of all split in 2
        if (t.bm, t.bn) == (32, 32):
            return 0.5 if t.splits == 2 else 1.5
        return 1.0 if (t.bm, t.bn, t.halo, t.ks) == (64, 32, 0, 1) else 2.0 + 0.01 * t.bm

    def fake_rounds(weights, precision, batch, backend, rounds, names, extra, shards=1, memo=None):
        seen = {n: [] for n in names}
        for tiles in rounds:
            for n, t in tiles.items():
                seen[n].append((model(t), t))
        return seen

    fake = TimedFake()   # one for both runs: its kernels are cached by backend name
    monkeypatch.setattr(tune, "time_rounds", fake_rounds)
    monkeypatch.setattr(tune, "time_calls", calls_timed({"built-in": 2.0, "tuned": 1.0, "in use": 3.0}))
    monkeypatch.setattr(tune, "get_backend", lambda name, sms=None: fake)
    assert tune.main(["--precision", "fp16", "--batch", "2", "--out-dir", str(tmp_path)]) == 0
    tiles = load_tiles(tmp_path / "tiles-fake-8sm-fp16-b2.json", "fp16", 2, 8, weights.config)
    plan = build_plan(weights.config)
    ctx = Ctx(plan, weights.params, "fp16", 2, 8, view_layout(plan))
    checked = 0
    for op in plan.ops:
        if not tunable(op, ctx):
            continue
        small = [t for t in candidates(op, ctx) if (t.bm, t.bn) == (32, 32)]
        shapes = {(t.bm, t.bn, t.wm, t.wn, t.halo, t.ks) for t in candidates(op, ctx)}
        if not small or len(shapes) < 2:
            continue
        t = tiles[op.out]
        if any(v.splits == 2 for v in with_splits(small[0], k_segments(op, ctx))):
            assert ((t.bm, t.bn), t.splits) == ((32, 32), 2), op.out
            checked += 1
        else:
            assert (t.bm, t.bn) != (32, 32), op.out
    assert checked > 5
    # with only the fastest shape timed over its splits, the 32x32 tile never gets its chance
    assert tune.main(["--precision", "fp16", "--batch", "2", "--split-top", "1", "--out-dir",
                            str(tmp_path)]) == 0
    tiles = load_tiles(tmp_path / "tiles-fake-8sm-fp16-b2.json", "fp16", 2, 8, weights.config)
    assert not any((t.bm, t.bn) == (32, 32) for t in tiles.values())


def test_the_json_report_lists_every_tile_timed_and_the_file_does_not(weights, tmp_path, monkeypatch):
    """--json: per op, every candidate and split variant timed, fastest first, labelled as printed,
    so a tile that lost can be told how far; the tuning file stays as it was (picks and figures)."""
    def fake_rounds(weights, precision, batch, backend, rounds, names, extra, shards=1, memo=None):
        seen = {n: [] for n in names}
        for tiles in rounds:
            for n, t in tiles.items():
                seen[n].append((1.0 + 0.01 * t.bm + 0.001 * t.bn + 0.1 * t.splits, t))
        return seen

    fake = TimedFake()
    monkeypatch.setattr(tune, "time_rounds", fake_rounds)
    monkeypatch.setattr(tune, "time_calls", calls_timed({"built-in": 2.0, "tuned": 1.0}))
    monkeypatch.setattr(tune, "get_backend", lambda name, sms=None: fake)
    report = tmp_path / "report.json"
    assert tune.main(["--precision", "fp16", "--batch", "2", "--out-dir", str(tmp_path), "--json", str(report),
                      "--quiet"]) == 0
    (rec,) = json.loads(report.read_text())
    doc = json.loads((tmp_path / "tiles-fake-8sm-fp16-b2.json").read_text())
    assert "candidate_us" not in doc and {k: v for k, v in rec.items() if k != "candidate_us"} == doc_meta(doc)
    plan = build_plan(weights.config)
    ctx = Ctx(plan, weights.params, "fp16", 2, 8, view_layout(plan))
    for op in plan.ops:
        if not tunable(op, ctx):
            continue
        timed = rec["candidate_us"][op.out]
        labels = [label for _, label in timed]
        assert [us for us, _ in timed] == sorted(us for us, _ in timed)
        assert {tune.tile_label(t) for t in candidates(op, ctx)} <= set(labels), op.out
        assert timed[0][0] == pytest.approx(rec["op_us"][op.out]["tuned"], abs=5e-4)


def doc_meta(doc):
    """A tuning file's fields but its tiles and format: what tune() recorded."""
    return {k: v for k, v in doc.items() if k not in ("tiles", "format")}


def calls_timed(ms):
    """A stand-in for tune.time_calls: the whole call's ms per tile set as given, eps all ones."""
    def fake(weights, precision, batch, backend, calls, *a, **k):
        return {c: ms[c] for c in calls}, {c: np.ones(4, np.float32) for c in calls}
    return fake


def test_the_whole_call_decides_what_the_tuning_file_holds(weights, tmp_path, monkeypatch, capsys):
    """Per-op picks can lose as a whole call (H200, batch 64: a re-tune whose 29 new tiles each timed
    faster alone ran the call 0.3% slower than the shipped file): the tuner times the call with the
    built-in tiles, the tuned ones and the tiles in use, and writes the fastest, or nothing."""
    fake = TimedFake()
    monkeypatch.setattr(tune, "get_backend", lambda name, sms=None: fake)
    path = tmp_path / "tiles-fake-8sm-fp16-b2.json"
    argv = ["--precision", "fp16", "--batch", "2", "--out-dir", str(tmp_path), "--quiet"]
    monkeypatch.setattr(tune, "time_calls", calls_timed({"built-in": 2.0, "tuned": 1.0}))
    assert tune.main(argv) == 0                  # no file yet: the tuned tiles win and are written
    first = path.read_text()
    doc = json.loads(first)
    assert doc["chosen"] == "tuned" and doc["graph_ms_tuned"] == 1.0 and "tiles_in_use" not in doc
    monkeypatch.setattr(tune, "time_calls", calls_timed({"built-in": 2.0, "tuned": 1.1, "in use": 1.0}))
    assert tune.main(argv) == 0                  # the file in use is faster: it stays, byte for byte
    out = capsys.readouterr().out
    assert path.read_text() == first and f"kept {path}" in out and "nothing written" in out
    monkeypatch.setattr(tune, "time_calls", calls_timed({"built-in": 0.9, "tuned": 1.1, "in use": 1.0}))
    assert tune.main(argv) == 0                  # the built-in tiles win: the file records them
    doc = json.loads(path.read_text())
    assert doc["chosen"] == "built-in" and doc["graph_ms_in_use"] == 1.0 and doc["tiles_in_use"] == str(path)
    plan = build_plan(weights.config)
    ctx = Ctx(plan, weights.params, "fp16", 2, 8, view_layout(plan))
    tiles = load_tiles(path, "fp16", 2, 8, weights.config)
    assert tiles == {op.out: candidates(op, ctx)[0] for op in plan.ops if tunable(op, ctx)}


def test_tiles_in_use_from_another_sm_count_bring_no_module_of_their_own(weights, tmp_path, monkeypatch, capsys):
    """On a 4-SM board whose tiles in use are the 8-SM files (twice its batch: ops.tuning.find_tiles),
    the tuner times them as the executor runs them, in the 8-SM module, whose kernels join the split
    rounds' build: the whole-call rounds compile nothing more (on a Jetson's CPU a module set takes
    minutes)."""
    from jetson_unet.ops.tuning import file_name
    fake = TimedFake()
    fake._sms = 4
    monkeypatch.setattr(tune, "get_backend", lambda name, sms=None: fake)
    monkeypatch.setattr(tune, "graph_ms", lambda ex, backend, x, iters=100: 1.0 + (ex.tile_sms or 0))
    shipped = json.loads((SHIPPED / "tiles-orin-8sm-fp16-b2.json").read_text())
    shipped.update(device="fake")
    (tmp_path / file_name("fake", 8, "fp16", 2)).write_text(json.dumps(shipped))
    builds = []
    settle = tune.settle_file
    monkeypatch.setattr(tune, "settle_file", lambda *a, **k: (builds.append(len(fake.compiled)), settle(*a, **k)))
    assert tune.main(["--batch", "1", "--out-dir", str(tmp_path), "--quiet", "--split-top", "1"]) == 0
    out = capsys.readouterr().out
    assert "tiles-fake-8sm-fp16-b2.json (the tiles of batch 2 on 8 SMs, which batch 1 runs without a file)" in out
    assert len(fake.compiled) == builds[0]                             # settle_file compiled nothing
    doc = json.loads((tmp_path / file_name("fake", 4, "fp16", 1)).read_text())
    assert doc["graph_ms_in_use"] == 9.0 and doc["chosen"] != "in use"


def test_whole_call_timings_alternate_fresh_executors(weights, monkeypatch):
    """time_calls: each tile set in turn, a fresh executor each round, the median per set."""
    fake, order = TimedFake(), []
    times = iter([3.0, 1.0, 2.0, 9.0, 1.2, 2.0, 3.0, 0.8, 2.0])

    def graph_ms(ex, backend, x, iters=100):
        order.append(ex.tiles_from)
        return next(times)
    monkeypatch.setattr(tune, "graph_ms", graph_ms)
    plan = build_plan(weights.config)
    ctx = Ctx(plan, weights.params, "fp16", 2, 8, view_layout(plan))
    builtin = {op.out: candidates(op, ctx)[0] for op in plan.ops if tunable(op, ctx)}
    calls = {"built-in": KernelPolicy(tiles="builtin"), "tuned": KernelPolicy(tiles=builtin),
             "in use": KernelPolicy(tiles=dict(builtin))}
    ms, eps = tune.time_calls(weights, "fp16", 2, fake, calls, [], 1, {}, rounds=3)
    assert order == [None, "given", "given"] * 3
    assert ms == {"built-in": 3.0, "tuned": 1.0, "in use": 2.0}
    assert set(eps) == set(calls) and all(e.shape == (2, 3, 64, 64) for e in eps.values())


def test_whole_call_timings_do_not_repeat_the_executors_tile_notice(weights, tmp_path, monkeypatch, notes):
    """Each round's executor would say which tiles it runs (here: none measured); the tuner says it
    once itself, so time_calls drops those notices, and only while it runs."""
    monkeypatch.setattr(tune, "graph_ms", lambda ex, backend, x, iters=100: 1.0)
    calls = {"in use": KernelPolicy(tile_dirs=[tmp_path])}
    tune.time_calls(weights, "fp16", 2, TimedFake(), calls, [], 1, {}, rounds=3)
    assert notes == []
    GpuExecutor(weights, "fp16", batch=2, backend=TimedFake(), policy=calls["in use"]).close()
    assert len(notes) == 1 and notes[0].startswith("no measured tiles for fake (8 SMs), fp16, batch 2")


def test_top_shapes_takes_the_fastest_variant_of_each_shape():
    a, a2 = TileChoice(32, 32, 2, 2, 64, 3), TileChoice(32, 32, 2, 2, 32, 4)
    b, c = TileChoice(64, 32, 2, 2, 64, 3), TileChoice(64, 32, 2, 2, 64, 3, halo=1)
    timings = [(3.0, a2), (1.0, b), (2.0, a), (4.0, c)]
    assert tune.top_shapes(timings, 2) == [b, a]
    assert tune.top_shapes(timings, 5) == [b, a, c]


def test_usage_errors_are_one_line_and_exit_2_before_any_gpu_work(capsys, monkeypatch):
    def no_gpu(name, sms=None):
        raise AssertionError("a usage error must come before the backend")

    monkeypatch.setattr(tune, "get_backend", no_gpu)
    for argv, msg in [(["--split-top", "0"], "--split-top must be >= 1, got 0"),
                      (["--batch", "0"], "--batch must be >= 1, got 0"),
                      (["--mt", "2"], "unrecognized arguments: --mt 2"),
                      (["--precision", "fp8"], "argument --precision: invalid choice")]:
        assert tune.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("jetson-tune: error: ") and msg in err and err.count("\n") == 1, err


def test_version_and_default_output_folder(capsys, monkeypatch, tmp_path):
    from jetson_unet import __version__
    with pytest.raises(SystemExit) as e:
        tune.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"jetson-tune {__version__}"
    monkeypatch.setenv("JETSON_UNET_TILES", str(tmp_path / "tiles"))   # where the executor looks
    seen = {}

    def stop(name, sms=None):
        seen["out_dir"] = (tmp_path / "tiles").is_dir()
        raise ConfigError("stop here")

    monkeypatch.setattr(tune, "get_backend", stop)
    assert tune.main(["--quiet"]) == 2 and seen == {"out_dir": True}


def test_variant_summary_says_where_a_kind_won_and_how_near_it_came():
    rec = {"a": {"without": 10.0, "best": 11.0}, "b": {"without": 10.0, "best": 9.0},
           "c": {"without": 20.0, "best": 21.0}}
    assert tune.variant_summary(16, "split-K", rec) == (
        "b16 split-K: faster on 1 of 3 ops; its best against the op's best without it: "
        "median +5.0% (-10.0% .. +10.0%)")


def test_a_tuning_file_with_several_m_tiles_per_cta_is_refused(tmp_path):
    """Kernels that ran several M tiles per CTA are gone: a tuning file from an older tuner that picked
    them ("mt" above 1) is refused in one line that says to tune again; "mt": 1 or none reads as before."""
    tile = TileChoice(64, 64, 2, 2, 32, 3, splits=1)
    path = tmp_path / "t.json"
    dump_tiles(path, {"downs.0.block1.conv1": tile}, {"device": "fake", "sms": 8, "precision": "fp16", "batch": 2})
    assert load_tiles(path, "fp16", 2, 8) == {"downs.0.block1.conv1": tile}
    doc = json.loads(path.read_text())
    doc["tiles"]["downs.0.block1.conv1"]["mt"] = 1
    path.write_text(json.dumps(doc))
    assert load_tiles(path, "fp16", 2, 8) == {"downs.0.block1.conv1": tile}
    doc["tiles"]["downs.0.block1.conv1"]["mt"] = 2
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=r"downs.0.block1.conv1 asks for several M tiles per CTA.*jetson-tune"):
        load_tiles(path, "fp16", 2, 8)


def test_a_tuning_file_for_other_conditions_or_a_bad_tile_is_refused(weights, tmp_path):
    fake = TimedFake()
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": 1, "device": "x", "sms": 8, "precision": "fp16", "batch": 1,
                                "tiles": {"downs.0.block1.conv1": {"bm": 48, "bn": 64, "wm": 2, "wn": 2, "bk": 64,
                                                      "stages": 3, "splits": 0}}}))
    with pytest.raises(ConfigError, match="batch 1 on 8 SMs, not fp16 batch 16"):
        load_tiles(path, "fp16", 16, 8)
    tiles = load_tiles(path, "fp16", 1, 8)
    with pytest.raises(ConfigError, match=r"downs.0.block1.conv1: tile .*48x64.* is not supported \(warp tile"):
        GpuExecutor(weights, "fp16", batch=1, backend=fake, policy=KernelPolicy(tiles=tiles))   # 48 rows over 2 warps: not 16k
    path.write_text("{}")
    with pytest.raises(ConfigError, match="not a tuning file"):
        load_tiles(path, "fp16", 1, 8)


def test_find_tiles_skips_a_file_of_another_config(weights, tmp_path):
    from jetson_unet.model.config import UNetConfig
    from jetson_unet.ops.tuning import Found, dump_tiles, file_name, find_tiles
    t = {"downs.0.block1.conv1": TileChoice(32, 32, 2, 2, 64, 3, 0)}
    meta = {"device": "fake", "sms": 8, "precision": "fp16", "batch": 1}
    path = tmp_path / file_name("fake", 8, "fp16", 1)
    dump_tiles(path, t, dict(meta, config=UNetConfig(dim=16).to_dict()))
    assert find_tiles(weights.config, "fake", 8, "fp16", 1, dirs=[tmp_path]) is None
    dump_tiles(path, t, dict(meta, config=weights.config.to_dict()))
    found = find_tiles(weights.config, "fake", 8, "fp16", 1, dirs=[tmp_path])
    assert found == Found(path, t, 1, 8)
    assert find_tiles(weights.config, "fake", 8, "bf16", 1, dirs=[tmp_path]) is None


@pytest.mark.parametrize("sms, measured, want", [
    # 8 SMs: every batch is compute-bound; the nearest in octaves, the larger on a tie
    (8, (1, 4), {1: 1, 2: 4, 3: 4, 8: 4, 16: 4, 128: 4}),
    (8, (1, 4, 16), {2: 4, 8: 16, 6: 4, 32: 16}),
    # 132 SMs: below 14 images a whole GPU is wave-bound and a neighbour's file lost (4, 8): none
    (132, (1, 16, 64), {1: 1, 2: None, 4: None, 8: None, 13: None, 14: 16, 24: 16, 32: 64, 128: 64}),
    (132, (1,), {2: None, 64: None}),
    (8, (), {1: None, 4: None}),
])
def test_a_batch_without_a_file_takes_its_nearest_neighbours_where_both_are_compute_bound(sms, measured, want):
    from jetson_unet.ops.tuning import neighbour_load
    near = {b: neighbour_load(b, sms, [(m, sms) for m in measured]) for b in want}
    assert {b: m and m[0] for b, m in near.items()} == want and all(m is None or m[1] == sms for m in near.values())


@pytest.mark.parametrize("sms, measured, want", [
    # an Orin Nano 4GB with the 8-SM files: the same images per SM (twice the batch), else the nearest
    # in octaves, the more images per SM on a tie
    (4, ((1, 8), (2, 8), (4, 8), (16, 8)), {1: (2, 8), 2: (4, 8), 3: (4, 8), 4: (16, 8), 8: (16, 8), 64: (16, 8)}),
    # an AGX Orin's 16 SMs: half the batch; batch 1 (one image per 16 SMs) is not compute-bound
    (16, ((1, 8), (2, 8), (4, 8), (16, 8)), {1: None, 2: (1, 8), 4: (2, 8), 8: (4, 8), 32: (16, 8)}),
    # the same images per SM at two SM counts: the larger count
    (4, ((2, 8), (4, 16)), {1: (4, 16)}),
])
def test_another_sm_counts_file_stands_in_at_the_nearest_images_per_sm(sms, measured, want):
    from jetson_unet.ops.tuning import neighbour_load
    assert {b: neighbour_load(b, sms, measured) for b in want} == want


def test_find_tiles_falls_back_to_a_neighbouring_batch_of_the_same_gpu(weights, tmp_path):
    """Another GPU's file never stands in; this GPU's own file does, from either folder, the first
    folder winning per file name; a file of another SM count of this GPU only where it has none for
    this SM count (at the nearest images per SM)."""
    from jetson_unet.ops.tuning import Found, dump_tiles, file_name, find_tiles
    t1 = {"downs.0.block1.conv1": TileChoice(32, 32, 2, 2, 64, 3, 0)}
    t4 = {"downs.0.block1.conv1": TileChoice(64, 32, 2, 2, 64, 3, 0)}
    user, shipped = tmp_path / "user", tmp_path / "shipped"
    for d in (user, shipped):
        d.mkdir()

    def put(folder, device, sms, batch, tiles):
        meta = {"device": device, "sms": sms, "precision": "fp16", "batch": batch, "config": weights.config.to_dict()}
        dump_tiles(folder / file_name(device, sms, "fp16", batch), tiles, meta)
        return folder / file_name(device, sms, "fp16", batch)

    def find(sms, batch):
        return find_tiles(weights.config, "fake", sms, "fp16", batch, dirs=[user, shipped])

    put(shipped, "other", 8, 4, t4)
    put(shipped, "fake-x", 8, 4, t4)               # another device, whose name begins with this one's
    assert find(8, 2) is None
    b4x16 = put(shipped, "fake", 16, 4, t4)        # another SM count of this GPU: 0.25 images per SM
    assert find(8, 2) == Found(b4x16, t4, 4, 16)
    assert find(8, 3) == Found(b4x16, t4, 4, 16)
    assert find(16, 1) is None                     # 16 SMs, batch 1: not compute-bound
    b1 = put(user, "fake", 8, 1, t1)               # a file for 8 SMs: only 8-SM files stand in now
    assert find(8, 2) == Found(b1, t1, 1, 8)
    b4 = put(shipped, "fake", 8, 4, t4)
    assert find(8, 2) == Found(b4, t4, 4, 8)
    assert find(8, 1) == Found(b1, t1, 1, 8)
    assert find(4, 1) == Found(b4x16, t4, 4, 16)   # 4 SMs, none of its own: 0.25 images per SM, as b4@16
    put(user, "fake", 8, 4, t1)                    # the user's batch-4 file comes first
    assert find(8, 16) == Found(user / b4.name, t1, 4, 8)


def test_shipped_tiles_are_valid_for_the_shipped_model(weights):
    """runtime/tiles/: every file loads for its own conditions and every tile passes check_key."""
    files = sorted(SHIPPED.glob("*.json"))
    assert files
    plan = build_plan(weights.config)
    for f in files:
        doc = json.loads(f.read_text())
        tiles = load_tiles(f, doc["precision"], doc["batch"], doc["sms"], weights.config)
        ctx = Ctx(plan, weights.params, doc["precision"], doc["batch"], doc["sms"], view_layout(plan), tiles=tiles)
        for op in plan.ops:
            if tunable(op, ctx):
                op_spec(op, ctx)   # raises ConfigError on an unsupported tile


def test_shipped_tiles_past_48_kb_launch_with_the_smem_opt_in(weights):
    """The batch-16 files pick kernels whose shared memory goes past the 48 KB (static + dynamic) that
    need no opt-in: the halo conv's row tiles (kernels/conv_halo.cu) and the cp.async conv with its
    ring in dynamic smem (deep_ring). The executor must raise each such kernel's limit first (the
    fake, like the driver, refuses a launch past it), and they stay within the budgets that leave two
    CTAs per sm_87 SM."""
    kinds = set()
    for path in sorted(SHIPPED.glob("tiles-*-b16.json")):
        sms = json.loads(path.read_text())["sms"]
        tiles = load_tiles(path, "fp16", 16, sms, weights.config)
        with GpuExecutor(weights, "fp16", batch=16, backend=FakeBackend(sms=sms),
                         policy=KernelPolicy(tiles=tiles)) as ex:
            launched = {L.name: L for L in ex.launches}
            src = ex.kernels.source
            ex.run(ex.stream)
            for s in ex.specs:
                k, L = s.key, launched[s.op.out]
                if not isinstance(k, ConvKey) or not (k.halo or deep_ring(k)):
                    continue
                kinds.add("halo" if k.halo else "deep")
                if k.halo:
                    kind = "CONV_HALO_ROWS_INSTANCE" if k.rows else "CONV_HALO_INSTANCE"
                    assert re.search(r"_(h3|r\d)(_f)?_x\w+$", L.fn.symbol) and f"{kind}({L.fn.symbol}," in src
                    assert L.smem <= HALO_SMEM_LIMIT, (path.name, s.op.out)
                else:
                    assert pipe_ring_bytes(k.bm, k.bn, k.bk, k.stages) < L.smem <= PIPE_DEEP_LIMIT
                    assert f"CONV_PIPE_INSTANCE({L.fn.symbol}," in src
                if L.smem + PIPE_SCRATCH > SMEM_LIMIT:
                    assert L.fn.opted_in >= L.smem, (path.name, s.op.out, L.smem)
    assert kinds == {"halo", "deep"}


@pytest.mark.parametrize("kind", ["halo", "k slices", "deep ring"])
def test_tile_variant_rounds_launch_the_kind_they_test(kind):
    """tests/gpu/test_gpu_tile_variants.py counts the launches of each round's kind by symbol
    suffix. The GroupNorm fold once added `_f` to those symbols and the pattern no longer matched, so
    the GPU test failed on the count while every op was right. Its rounds, on the fake backend: every
    tile a round gives is launched as that kind and found by the pattern."""
    from types import SimpleNamespace

    from tests.helpers import tile_rounds as tv
    from jetson_unet.model.config import UNetConfig
    from jetson_unet.model.weights import random_params
    weights = SimpleNamespace(config=UNetConfig(), params=random_params(UNetConfig(), 7))   # the GPU test's
    rounds, keys = tv.halo_rounds(weights, "fp16", 2, 132, kind)
    assert len(rounds) > 1
    found = []
    for tiles in (rounds[0], rounds[-1]):
        with GpuExecutor(weights, "fp16", batch=2, backend=FakeBackend(sms=132), policy=KernelPolicy(tiles=tiles),
                         extra_keys=keys) as ex:
            syms = tv.halo_symbols(ex, kind)
        assert len(syms) == len(tiles), (len(syms), len(tiles))
        found += syms
    assert any(re.search(r"_f_x\w+$", s) for s in found), "some launches of the kind are folded"



def test_a_gpu_without_measured_tiles_is_told_how_to_measure_them(weights, tmp_path, monkeypatch, notes):
    """The tile files are named after the GPU: one that has none (every Jetson until jetson-tune runs
    there) runs the built-in tiles, and the executor says so, with the command that measures them;
    with a file, nothing; with a neighbouring batch's file, which batch's tiles run."""
    from jetson_unet.ops.tuning import file_name

    monkeypatch.setenv("JETSON_UNET_TILES", str(tmp_path))
    said = notes
    ex = GpuExecutor(weights, "fp16", batch=2, backend=FakeBackend(sms=8))
    assert ex.tiles_from is None
    assert said == ["no measured tiles for fake (8 SMs), fp16, batch 2: built-in tiles; "
                    "`jetson-tune --precision fp16 --batch 2` measures them once (a few minutes)"]
    shipped = json.loads((SHIPPED / "tiles-nvidia-h200-132sm-fp16-b1.json").read_text())
    shipped.update(device="fake", sms=8, batch=2)
    (tmp_path / file_name("fake", 8, "fp16", 2)).write_text(json.dumps(shipped))
    said.clear()
    ex = GpuExecutor(weights, "fp16", batch=2, backend=FakeBackend(sms=8))
    assert ex.tiles_from == str(tmp_path / file_name("fake", 8, "fp16", 2)) and said == []
    ex = GpuExecutor(weights, "fp16", batch=3, backend=FakeBackend(sms=8))   # its neighbour's, said so
    assert ex.tiles_from == str(tmp_path / file_name("fake", 8, "fp16", 2)) and ex.tile_batch == 2
    assert said == ["no measured tiles for fake (8 SMs), fp16, batch 3: those of batch 2; "
                    "`jetson-tune --precision fp16 --batch 3` measures this batch's once (a few minutes)"]
    said.clear()
    ex = GpuExecutor(weights, "fp16", batch=1, backend=FakeBackend(sms=4))   # another SM count's: its module too
    assert (ex.tiles_from, ex.tile_batch, ex.tile_sms) == (str(tmp_path / file_name("fake", 8, "fp16", 2)), 2, 8)
    assert ex.kernels.symbols == GpuExecutor(weights, "fp16", batch=2, backend=FakeBackend(sms=8)).kernels.symbols
    assert said[0] == ("no measured tiles for fake (4 SMs), fp16, batch 1: those measured on 8 SMs at batch 2; "
                       "`jetson-tune --precision fp16 --batch 1` measures this batch's once (a few minutes)")


def heuristic(weights, batch: int, sms: int, precision: str = "fp16"):
    plan = build_plan(weights.config)
    ctx = Ctx(plan, weights.params, precision, batch, sms, view_layout(plan))
    return plan, ctx, {op.out: op_spec(op, ctx) for op in plan.ops if tunable(op, ctx)}


def test_builtin_tiles_follow_what_the_tuner_measured(weights):
    """The built-in rules taken from the shipped tuning files (H100 and H200, batch 1 and 16): gates
    wider than 128 split over 64-wide CTAs with BK 64, 128-wide ones one row of 4 warps; BN 32 where
    BN 64 leaves SMs idle (every batch-1 conv of a large GPU); the halo conv for conv1 and up2 convs
    only, and only where the grid fills every SM twice (never at batch 1 on 132 SMs)."""
    plan, _, b1 = heuristic(weights, 1, 132)
    _, _, b16 = heuristic(weights, 16, 132)
    for specs in (b1, b16):
        for name, spec in specs.items():
            op, k = spec.op, spec.key
            n = plan.tensors[op.x].channels if op.kind == "gate" else plan.tensors[op.out].channels
            if op.kind == "gate" and n > 128:
                assert (k.bm, k.bn, k.bk, k.wm, k.wn, k.nsplit) == (32, 64, 64, 2, 2, True), name
            elif op.kind == "gate" and n == 128:
                assert (k.bn, k.wm, k.wn, k.nsplit) == (128, 1, 4, False), name
            if k.halo:
                assert op.k == 3 and not (op.residual or op.residual_conv) and (op.norm or op.in_map == "up2"), name
                assert 16 * (plan.tensors[op.out].size ** 2 // k.bm) * (n // k.bn) >= 2 * 132 and specs is b16, name
    convs = [s.key for s in b1.values() if s.op.kind == "conv"]
    assert convs and all(k.bn == 32 and not k.halo for k in convs)
    assert b16["ups.3.block1.conv1"].key.symbol.startswith("conv3x3s1u1_f16_128x64x64_4x2_v8_h3_f_x")   # the tuned tile
    assert not b16["ups.3.block1"].key.halo and not b16["ups.3.up.conv"].key.halo
    _, _, f32 = heuristic(weights, 16, 132, "fp32")
    assert not any(getattr(s.key, "halo", False) or s.key.stages for s in f32.values())


@pytest.mark.parametrize("sms,batch", [(8, 1), (4, 1), (132, 16), (132, 1)])
def test_builtin_tiles_as_a_tile_mapping_launch_the_same_kernels(weights, sms, batch):
    """tuning.builtin_tiles: an untuned GPU's tiles (an Orin's, for the GPU test that runs them on the
    lent GPU) given as tiles give the same keys and grids, split-K included."""
    plan, ctx, specs = heuristic(weights, batch, sms)
    tiles = builtin_tiles(ctx)
    assert set(tiles) == set(specs)
    given = Ctx(plan, weights.params, "fp16", batch, sms, view_layout(plan), tiles=tiles)
    for name, spec in specs.items():
        again = op_spec(spec.op, given)
        assert (again.key, again.grid) == (spec.key, spec.grid), name
    assert any(t.splits > 1 for t in tiles.values()) == any(s.grid[0] > -(-plan.tensors[n].size ** 2 // s.key.bm)
                                                           for n, s in specs.items())


@pytest.mark.parametrize("sms,batch,rows", [(8, 1, True), (16, 4, True), (132, 1, False), (132, 16, False),
                                            (132, 33, True), (132, 64, True)])
def test_builtin_row_tiles_on_few_sms_or_from_a_sample_per_4_sms(weights, sms, batch, rows):
    """conv_halo.builtin_rows: the row tiles on GPUs of <= 16 SMs at any batch, on larger ones from one
    sample per 4 SMs (measured on 132 SMs: a win at batch 64, a loss at 16); only the 64x64 and 32x32
    levels' 3x3 convs (32- and 64-pixel rows)."""
    plan, _, specs = heuristic(weights, batch, sms)
    on = {n for n, s in specs.items() if getattr(s.key, "rows", False)}
    assert bool(on) == rows
    assert all(plan.tensors[n].size >= 32 for n in on)


@pytest.mark.parametrize("batch,sms", [(1, 8), (4, 8), (16, 8), (16, 132), (64, 132)])
def test_builtin_bm_is_below_twice_a_samples_rows(batch, sms):
    """The GEMM runs per sample: a 128-row tile at the 8x8 level (64 rows) would be half padding,
    which the rule once picked wherever the grid was deep (batch 4 on 8 SMs, 64 on 132)."""
    from jetson_unet.ops.tiles import choose_tile
    for m in (64, 256, 1024, 4096):
        for n in (32, 64, 128, 256, 512):
            bm = choose_tile("fp16", m, n, batch, sms, gate=False, k=9 * n, pipelined=True)[0]
            assert bm < 2 * m, (m, n, bm)
    assert choose_tile("fp16", 4096, 64, 64, 132, gate=False, k=576, pipelined=True)[0] == 128


@pytest.mark.parametrize("cpus, available, want", [(16, 64 << 30, 16), (64, 64 << 30, 16), (6, 2 << 30, 4),
                                                   (6, 100 << 20, 1), (2, None, 2), (1, 64 << 30, 1)])
def test_build_shards_follow_the_cores_and_the_memory(cpus, available, want):
    assert tune.build_shards(cpus, available) == want


SHIPPED_TILES = shipped_tiles_dir()


@pytest.mark.parametrize("name", sorted(p.name for p in SHIPPED_TILES.glob("*-fp16-b*.json")))
def test_shipped_tiles_map_to_conv_gemm_tiles(weights, name):
    """The GPU suite holds each shipped file's cp.async convs to conv_gemm on the same ops
    (tests/gpu/test_gpu_unet.py, through tests.helpers.gpu.gemm_tiles): every tile it maps them to
    must be one conv_gemm instantiates, and none may stay on the cp.async conv."""
    sms, batch = re.search(r"-(\d+)sm-fp16-b(\d+)\.json$", name).groups()
    be = FakeBackend(arch=90, sms=int(sms), free=64 << 30)
    policy = KernelPolicy(tiles=SHIPPED_TILES / name)
    with GpuExecutor(weights, "fp16", batch=int(batch), backend=be, policy=policy) as ex:
        tiles = gemm_tiles(ex)
    with GpuExecutor(weights, "fp16", batch=int(batch), backend=be, policy=KernelPolicy(tiles=tiles)) as ex:
        assert not pipelined_symbols(ex)


def test_every_round_launches_kernels_the_candidate_build_holds(weights):
    """A producer's output scale (feature o) follows its reader's tile (ops.conv.output_scale), which a
    round varies too: still no round's executor has a kernel outside the candidates' keys and the
    module grid (it would compile a module of its own). Every candidate of a normalized conv folds."""
    from jetson_unet.model.plan import CONV, GATE
    from jetson_unet.ops.specs import all_tile_keys, op_key
    plan = build_plan(weights.config)
    ctx = Ctx(plan, weights.params, "fp16", 4, 8, view_layout(plan), memo={})
    ops = {op.out: op for op in plan.ops if tunable(op, ctx)}
    cands = {n: candidates(op, ctx) for n, op in ops.items()}
    extra = {tune.tile_key(ops, ctx, n, t) for n, ts in cands.items() for t in ts}
    have = extra | set(all_tile_keys(ctx))
    rounds = tune.as_rounds(cands)
    assert len(rounds) > 3
    for tiles in rounds:
        rctx = Ctx(plan, weights.params, "fp16", 4, 8, view_layout(plan), tiles=tiles, memo={})
        own = {op_key(op, rctx) for op in plan.ops if op.kind in (CONV, GATE)}
        assert own <= have, sorted(k.symbol for k in own - have)[:3]

"""tools.bench_unet without a GPU: --sms reaches both sides of the comparison, ours (the backend of a
green context) and the torch peers (torch_slice), in their fresh processes; --shards reaches our
executor."""
from __future__ import annotations

import pytest

import tools.bench_unet as B


def test_sms_reaches_our_backend_and_the_torch_peers(monkeypatch, capsys):
    seen = {}

    def fresh(fn, *args):   # in_fresh_process, run here: record what each row was asked for
        seen.setdefault(fn.__name__, []).append(args[-2].sms if fn is B.ours_row else args[1].sms)
        return {"impl": fn.__name__, "batch": args[1] if fn is B.ours_row else args[0], "graph_ms": 1.0}

    monkeypatch.setattr(B, "in_fresh_process", fresh)
    monkeypatch.setattr(B, "get_backend", lambda name, sms=None: type("Bk", (), {"device_name": lambda self: "x"})())
    monkeypatch.setattr(B, "bench_weights", lambda: (None, "w"))
    assert B.main(["--precisions", "fp16", "--batches", "4", "--sms", "8"]) == 0
    assert seen["ours_row"] == [8] and seen["bench_torch"] == [8] * len(B.TORCH_PEERS)
    assert B.main(["--precisions", "fp16", "--batches", "1", "--no-torch"]) == 0
    assert seen["ours_row"] == [8, None]


def test_our_row_runs_on_the_backend_of_that_slice(monkeypatch):
    asked = []
    monkeypatch.setattr(B, "get_backend", lambda name, sms=None: asked.append((name, sms)) or "backend")
    monkeypatch.setattr(B, "bench_weights", lambda: ("weights", "w"))
    monkeypatch.setattr(B, "bench_ours", lambda w, p, b, args, backend, tiles: (w, p, b, backend, tiles))
    args = B.argparse.Namespace(sms=8)
    assert B.ours_row("fp16", 4, args, "builtin") == ("weights", "fp16", 4, "backend", "builtin")
    assert asked == [("cupy", 8)]


def test_shards_reach_our_executor_only_when_asked(monkeypatch):
    """--shards N (tools.lab.knockout's copies): our executor's kernels in N modules; 1, the default,
    passes nothing, so an older tree's executor (a knockout --ref) still builds."""
    made = []

    class Stop(Exception):
        pass

    def executor(*a, **kw):
        made.append(kw.get("shards"))
        raise Stop

    monkeypatch.setattr(B, "GpuExecutor", executor)
    for n in (4, 1):
        with pytest.raises(Stop):
            B.bench_ours(None, "fp16", 1, B.argparse.Namespace(shards=n), "backend")
    assert made == [4, None]


def test_shards_below_one_are_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        B.main(["--shards", "0", "--no-torch"])
    assert e.value.code == 2 and "--shards must be at least 1" in capsys.readouterr().err

"""tools.lab.graph_timeline on the host: the replay rows from profiled kernels, the report, and
its usage errors (the profiling itself needs a GPU and torch)."""
from __future__ import annotations

import pytest

from tools.lab import graph_timeline as gt

NAMES, SYMS = ["a", "b", "c"], ["k_a", "k_b", "k_c"]


def replays(durs, gaps, t0=0.0):
    out, t = [], t0
    for d, g in zip(durs, gaps):
        for j, name in enumerate(SYMS):
            t += g[j]
            out.append((t, d[j], "void " + name + "<2>(int)"))
            t += d[j]
    return out


def test_rows_are_medians_per_launch_in_order():
    ks = replays([[1, 2, 3], [1, 4, 3], [1, 2, 9]], [[5, 0.5, 1], [5, 0.5, 2], [5, 0.5, 3]])
    rows = gt.replay_rows(list(reversed(ks)), NAMES, SYMS)   # sorted by start time inside
    assert [r["op"] for r in rows] == NAMES
    assert [r["graph_us"] for r in rows] == [1, 2, 3]
    assert [r["gap_us"] for r in rows] == [0.0, 0.5, 2]


def test_rows_refuse_partial_replays_and_a_different_order():
    ks = replays([[1, 2, 3]], [[0, 0, 0]])
    with pytest.raises(ValueError, match="whole replays"):
        gt.replay_rows(ks[:-1], NAMES, SYMS)
    with pytest.raises(ValueError, match="order"):
        gt.replay_rows(ks, NAMES, ["k_a", "k_c", "k_b"])


def test_report_lists_what_the_graph_adds_first_and_sums():
    rows = gt.replay_rows(replays([[1, 5, 3]], [[0, 1, 1]]), NAMES, SYMS)
    lines = gt.report(rows, {"a": 1.0, "b": 2.0, "c": 3.0}, top=2)
    assert lines[1].split()[:4] == ["b", "5.0", "2.0", "3.0"] and len(lines) == 4
    assert lines[-1].split()[4:8] == ["9.0", "6.0", "3.0", "2.0"]


@pytest.mark.parametrize("argv", [["--batch", "0"], ["--replays", "0"], ["--warm", "-1"]])
def test_bad_arguments_exit_2_with_one_line(argv, capsys):
    assert gt.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("graph_timeline: ")

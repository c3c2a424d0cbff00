"""tools.lab.icache on the host: the straight-line kernels' source, the penalties from the rows'
times, the report and the usage errors (the timing itself needs a GPU)."""
from __future__ import annotations

import pytest

from tools.lab import icache


def test_a_kernel_of_s_kb_holds_s_kb_of_ffma_each_its_own():
    src = icache.straight_line_source("k", 4, seed=1)
    body = [line for line in src.splitlines() if "fmaf" in line]
    assert len(body) == 4 * 1024 // icache.FFMA_BYTES
    assert len(set(body)) == len(body)   # distinct immediates: nothing to fold
    assert src.startswith('extern "C" __global__ void k(') and src != icache.straight_line_source("k", 4, seed=2)


def test_penalties_are_per_launch_of_a_or_b():
    us = {"A": 5.0, "B": 5.5, "F": 40.0, "AB": 13.5, "ABF": 61.5}
    got = icache.penalties(us)
    assert got == {"hot_us": 5.0, "after_kernel_us": 1.5, "after_flush_us": 5.5}


def test_report_has_a_row_per_size():
    rows = [{"kb": 24, "hot_us": 1.5, "after_kernel_us": 1.34, "after_flush_us": 2.5}]
    lines = icache.report(rows)
    assert len(lines) == 2 and lines[1].split() == ["24", "1.50", "+1.34", "+2.50"]


@pytest.mark.parametrize("argv", [["--sizes", "12,x"], ["--sizes", "0"], ["--sizes", "600"],
                                  ["--repeats", "0"], ["--flush-mb", "0"], ["--sms", "0"]])
def test_bad_arguments_exit_2_with_one_line(argv, capsys):
    assert icache.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("icache: ")

"""tools.lab.mma_peak without a GPU: the FLOP count of a launch and the usage errors (the measurement
itself: tests/gpu/test_gpu_slice.py)."""
from __future__ import annotations

import pytest

import tools.lab.mma_peak as mp


def test_a_launch_counts_every_warps_mma():
    assert mp.MMA_FLOP == 4096
    assert mp.flops(ctas=16, iters=10, chains=8) == 16 * 8 * 10 * 8 * 4096


@pytest.mark.parametrize("argv", [["--ctas", "0"], ["--iters", "0"], ["--repeats", "0"], ["--sms", "0"]])
def test_usage_errors_are_one_line_and_exit_2(argv, capsys):
    assert mp.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mma_peak: ")


"""tools.lab.ring_stream without a GPU: which rings it runs, its usage errors, and its kernels built
for sm_87 (the measurement itself: tests/gpu/test_gpu_slice.py)."""
from __future__ import annotations

import subprocess

import pytest

from tools.lab import ring_stream as rs


def test_configs_keep_whole_slots_whole_vectors_and_the_smem_budget():
    assert rs.configs([1], [256], [8], [64]) == [(1, 256, 8 << 10, 9)]
    got = rs.configs([1, 2], [128, 256, 1024], [8, 16, 64], [32, 64, 128, 192])
    assert got and len(set(got)) == len(got)
    for per_sm, nt, stage, stages in got:
        assert stage % (16 * nt) == 0 and stages >= 2 and per_sm * stage * stages <= 220 << 10
    assert (1, 1024, 8 << 10, 5) not in got              # 8 KB is half a vector for each of 1024 threads
    assert (2, 128, 64 << 10, 3) not in got              # two 192 KB rings do not fit an SM
    assert rs.configs([1], [128], [64], [32]) == []      # less in flight than one slot


@pytest.mark.parametrize("argv", [["--sms", "0"], ["--repeats", "0"], ["--threads", "100"],
                                  ["--threads", "2048"], ["--stage-kb", "0"], ["--per-sm", "0"],
                                  ["--threads", "1024", "--stage-kb", "8", "--in-flight-kb", "8"]])
def test_usage_errors_are_one_line_and_exit_2(argv, capsys):
    assert rs.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ring_stream: ")


@pytest.mark.parametrize("consume", sorted(rs.KIND.values()))
def test_the_ring_builds_for_sm87_without_spills(consume, tmp_path):
    from jetson_unet.build.compilers import find_nvcc
    nvcc = find_nvcc()
    if nvcc is None:
        pytest.skip("no nvcc")
    src = tmp_path / "ring.cu"
    src.write_text(rs.SOURCE)
    done = subprocess.run([str(nvcc), "-cubin", "-arch=sm_87", "-std=c++17", "-DNT=256", "-DSTAGE=16384",
                           "-DSTAGES=5", f"-DCONSUME={consume}", "-Xptxas", "-v", str(src), "-o",
                           str(tmp_path / "ring.cubin")], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "0 bytes spill stores" in done.stderr and " spill stores" in done.stderr
    assert all(" 0 bytes spill" in line for line in done.stderr.splitlines() if "spill stores" in line)

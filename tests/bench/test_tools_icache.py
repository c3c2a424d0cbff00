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


def test_penalties_are_per_launch_of_a_or_b_and_of_the_cycle():
    us = {"A": 5.0, "B": 5.5, "F": 40.0, "AB": 13.5, "ABF": 61.5, "C": 40.0 + 5.0 + 5.5 + 2 * 5.25 + 4 * 7.0}
    got = icache.penalties(us, 4)
    assert got == {"hot_us": 5.0, "after_kernel_us": 1.5, "after_flush_us": 5.5, "from_memory_us": 7.0, "cycle": 4}


def test_the_cycle_holds_at_least_evict_kb_of_code_in_at_least_two_kernels():
    assert [icache.cycle_length(kb) for kb in (1, 12, 48, 96, 128, 160, 512)] == [256, 22, 6, 3, 2, 2, 2]
    assert all(icache.cycle_length(kb) * kb >= icache.EVICT_KB for kb in range(1, 513))


def test_report_has_a_row_per_size():
    rows = [{"kb": 24, "hot_us": 1.5, "after_kernel_us": 1.34, "after_flush_us": 2.5, "from_memory_us": 3.25,
             "cycle": 11}]
    lines = icache.report(rows)
    assert len(lines) == 2 and lines[1].split() == ["24", "1.50", "+1.34", "+2.50", "+3.25", "11"]


@pytest.mark.parametrize("argv", [["--sizes", "12,x"], ["--sizes", "0"], ["--sizes", "600"],
                                  ["--repeats", "0"], ["--flush-mb", "0"], ["--sms", "0"]])
def test_bad_arguments_exit_2_with_one_line(argv, capsys):
    assert icache.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("icache: ")


def test_measure_captures_each_row_in_order(monkeypatch):
    """The GPU path on the fake backend: each row a graph of ROUNDS rounds of its kernels in order,
    timed through bench.timing.timed (here: per launch, A 5 us, B 5.5, the cycle's others 5.25, the
    flush 40), the last a cycle of four 64 KB kernels and the flush."""
    import jetson_unet.backends as backends
    import jetson_unet.bench.timing as timing
    from tests.helpers.fakes import FakeBackend
    be = FakeBackend(sms=8)
    monkeypatch.setattr(backends, "get_backend", lambda name, sms=None: be)
    cost = {"icache_a": 5.0, "icache_b": 5.5, "icache_c2": 5.25, "icache_c3": 5.25, "flush_read": 40.0}

    def timed(backend, stream, fn, warmup, iters, repeats):
        before = len(backend.launches)
        fn()
        return sum(cost[e[0]] for e in backend.launches[before:]) / 1000.0
    monkeypatch.setattr(timing, "timed", timed)
    rows = icache.measure([64], None, 1, 1)
    assert rows == [{"kb": 64, "hot_us": 5.0, "after_kernel_us": 0.0, "after_flush_us": 0.0, "from_memory_us": 0.0,
                     "cycle": 4}]
    assert [e[0] for e in be.graphs[4].entries] == ["icache_a", "icache_b", "flush_read"] * icache.ROUNDS
    assert [e[0] for e in be.graphs[5].entries] == ["icache_a", "icache_b", "icache_c2", "icache_c3",
                                                    "flush_read"] * icache.ROUNDS
    assert be.graphs[0].entries[0][1] == (8,)   # one CTA per SM

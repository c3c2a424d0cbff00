"""Telemetry on a board without root: the sysfs reader (INA3221 rails, GPU devfreq clock and load,
thermal zones, nvpmodel mode, jetson_clocks) over the trees in tests/fixtures/sysfs/ (Orin Nano on
JetPack 5 and 6, Nano on JetPack 4), the clock unit rule, jtop's version mismatch and facts, and
which source `auto` picks as root, jtop and tegrastats come and go (`notes`: the package's log
lines, info and up). CPU only, no optional deps."""
from __future__ import annotations

import shutil
import sys
import time
import types
from pathlib import Path

import pytest

from jetson_unet.bench import sysfs
from jetson_unet.bench import telemetry as tm
from jetson_unet.bench.telemetry import open_telemetry, parse_tegrastats_line
from jetson_unet.bench.telemetry_parse import sample_from_jtop, to_mhz
from tests.bench.test_telemetry import INTERVAL, block_import, fake_jtop_module, fake_tegrastats, lines, wait_for

TREES = Path(__file__).resolve().parent.parent / "fixtures" / "sysfs"
# board -> (total W, rail, GPU MHz, GPU load, hottest C, nvpmodel (id, name), jetson_clocks)
BOARDS = {
    "orin_nano_jp6": (5.008 * 2.360, "VDD_IN", 1020.0, 0.962, 50.281, (2, "MAXN_SUPER"), True),
    "orin_nano_jp5": (5.064 * 1.731, "VDD_IN", 624.75, 0.990, 48.5, (0, "15W"), False),
    "nano_jp4": (2.5, "POM_5V_IN", 921.6, 0.0, 100.0, None, False),
}


def tree(board: str) -> str:
    return str(TREES / board)


@pytest.fixture
def board_copy(tmp_path):
    """A writable copy of a board tree, to take files away from."""
    def copy(board: str) -> Path:
        dst = tmp_path / board
        shutil.copytree(tree(board), dst)
        return dst
    return copy


@pytest.fixture
def sysfs_root(monkeypatch):
    """Point the sysfs source at a tree (None: an empty one, no board)."""
    def point(root) -> None:
        monkeypatch.setattr(tm._SysfsSource, "root", str(root))
    return point


# ---------------------------------------------------------------- the reader, per board
@pytest.mark.parametrize("board", sorted(BOARDS))
def test_reader_gives_power_clock_load_and_temperatures(board):
    watts, rail, mhz, load, hottest, _mode, _jc = BOARDS[board]
    s = sysfs.SysfsReader(tree(board)).read(t=1.0)
    assert s.t == 1.0 and s.power_w == pytest.approx(watts) and s.power_rail == rail
    assert s.rails[rail] == pytest.approx(watts) and len(s.rails) == 3
    assert (s.gpu_mhz, s.gpu_util) == (pytest.approx(mhz), pytest.approx(load))
    assert max(s.temps_c.values()) == pytest.approx(hottest)
    assert all(v > -200 for v in s.temps_c.values()) and not any(k.startswith("cv") for k in s.temps_c)


def test_orin_rails_are_v_times_i_and_channel_7_is_skipped():
    r = sysfs.SysfsReader(tree("orin_nano_jp6"))
    assert sorted(r.rails) == ["VDD_CPU_GPU_CV", "VDD_IN", "VDD_SOC"]     # not "sum of shunt voltages"
    assert r.read().rails == pytest.approx({"VDD_IN": 11.81888, "VDD_CPU_GPU_CV": 5.008, "VDD_SOC": 2.909648})
    assert r.read().temps_c == pytest.approx({"cpu": 47.187, "gpu": 50.281, "soc0": 46.843, "soc1": 47.031,
                                              "soc2": 46.125, "tj": 50.281})    # cv0-2 unreadable: dropped


@pytest.mark.parametrize("board", sorted(BOARDS))
def test_board_state_from_files_without_root(board):
    *_, mode, jc = BOARDS[board]
    st = sysfs.board_state(tree(board))
    got = st["power_mode"] and (st["power_mode"]["id"], st["power_mode"]["name"])
    assert got == mode and st["jetson_clocks"] is jc
    if mode:
        assert st["power_mode"]["source"] == "/var/lib/nvpmodel/status"


@pytest.mark.parametrize("query, want", [
    ("NV Power Mode: MAXN_SUPER\n2\n", (2, "MAXN_SUPER", "nvpmodel -q")),
    ("NVPM WARN: fan mode is not set!\nNV Power Mode: 15W\n0\n", (0, "15W", "nvpmodel -q")),
    ("NVPM ERROR: failed to read PARAM\n", (2, "MAXN_SUPER", "/var/lib/nvpmodel/status")),   # the file decides
])
def test_power_mode_prefers_nvpmodel_q_then_the_status_file(query, want):
    m = sysfs.power_mode(tree("orin_nano_jp6"), query)
    assert (m["id"], m["name"], m["source"]) == want


def test_gpu_clock_range_and_jetson_clocks_rule(board_copy, tmp_path):
    jp6 = sysfs.board_state(tree("orin_nano_jp6"))
    assert jp6["gpu_clock_mhz"] == {"min": 1020.0, "max": 1020.0, "cur": 1020.0}
    root = board_copy("orin_nano_jp6")
    policy = root / "sys/devices/system/cpu/cpufreq/policy4/scaling_min_freq"
    policy.write_text("729600\n")                      # one cluster let go: jetson_clocks is off
    assert sysfs.board_state(str(root))["jetson_clocks"] is False
    assert sysfs.board_state(str(tmp_path / "no_board")) == \
        {"power_mode": None, "jetson_clocks": None, "gpu_clock_mhz": None}


def test_unreadable_files_are_missing_figures(board_copy):
    root = board_copy("orin_nano_jp5")
    hw = root / "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon3"
    (hw / "curr3_input").unlink()                      # VDD_SOC cannot be read
    (root / "sys/devices/17000000.ga10b/load").unlink()
    r = sysfs.SysfsReader(str(root))
    s = r.read()
    assert sorted(s.rails) == ["VDD_CPU_GPU_CV", "VDD_IN"] and s.power_w == pytest.approx(8.765784)
    assert s.gpu_util is None and s.gpu_mhz == pytest.approx(624.75) and r.facts()["gpu_load"] is None
    for f in hw.glob("curr*_input"):
        f.unlink()
    with pytest.raises(FileNotFoundError, match="no readable INA3221 rail under .*sys/bus/i2c/drivers"):
        sysfs.SysfsReader(str(root))


# ---------------------------------------------------------------- clocks in MHz
@pytest.mark.parametrize("raw, mhz", [
    (1020000000, 1020.0),     # devfreq cur_freq: Hz
    (624750, 624.75),         # jetson-stats: kHz
    (1575, 1575.0),           # jetson-stats on Thor: MHz
    (76800, 76.8),            # Nano's lowest GPU clock in kHz
    (0, 0.0), (None, None), (True, None), ("1020", None),
])
def test_to_mhz_tells_units_apart_by_magnitude(raw, mhz):
    assert to_mhz(raw) == mhz


def test_jtop_gpu_clock_in_khz_and_thor_mhz_agree():
    orin = {"ga10b": {"freq": {"cur": 1020000}}}
    thor = {"thor": {"freq": {"cur": 1020, "max": 1575}}}
    assert sample_from_jtop({}, {}, gpu=orin).gpu_mhz == sample_from_jtop({}, {}, gpu=thor).gpu_mhz == 1020.0


# ---------------------------------------------------------------- the sources on a board
def test_sysfs_source_samples_and_summarizes(sysfs_root, notes):
    sysfs_root(tree("orin_nano_jp6"))
    with open_telemetry("sysfs", interval_s=INTERVAL) as tel:
        time.sleep(0.02)
        tel.mark("a")
        assert wait_for(lambda: len(tel.samples) >= 5)
        tel.mark("b")
    assert tel.source == "sysfs" and notes == ["telemetry: sysfs"]     # which source, in one line
    s = tel.summary("a", "b")
    assert s["mean_power_w"] == pytest.approx(11.81888) and s["power_rail"] == "VDD_IN"
    assert (s["max_gpu_mhz"], s["mean_gpu_util"]) == (1020.0, pytest.approx(0.962))
    assert s["energy_j"] == pytest.approx(11.81888 * s["duration_s"])
    assert tel.facts["rails"] == ["VDD_CPU_GPU_CV", "VDD_IN", "VDD_SOC"] and tel.facts["root"] == tree("orin_nano_jp6")
    got = tm.interval_stats(tel.samples)
    assert got["n"] == len(tel.samples) and INTERVAL * 0.5 < got["median_s"] <= got["max_s"]


def test_interval_stats_of_few_samples():
    assert tm.interval_stats([]) == {"n": 0, "median_s": None, "max_s": None}
    three = [tm.Sample(t=t) for t in (0.0, 0.5, 0.7)]
    assert tm.interval_stats(three) == {"n": 3, "median_s": pytest.approx(0.35), "max_s": 0.5}


def test_auto_without_jtop_takes_sysfs_in_one_line(monkeypatch, sysfs_root, notes):
    block_import(monkeypatch, "jtop")
    sysfs_root(tree("orin_nano_jp5"))
    with open_telemetry("auto", interval_s=INTERVAL) as tel:
        assert wait_for(lambda: len(tel.samples) >= 2)
    assert tel.source == "sysfs" and len(notes) == 1
    assert notes[0].startswith("telemetry: jtop unavailable (ModuleNotFoundError") and notes[0].endswith("using sysfs")


def test_jtop_version_mismatch_says_both_versions_and_falls_back(monkeypatch, sysfs_root, notes):
    msg = ("Mismatch version jtop service: [4.2.7] and client: [4.3.1]. Please run:\n\n"
           "sudo systemctl restart jtop.service")
    monkeypatch.setitem(sys.modules, "jtop", fake_jtop_module(enter_error=msg, version="4.3.1"))
    sysfs_root(tree("orin_nano_jp6"))
    tel = open_telemetry("auto", interval_s=INTERVAL)
    tel.stop()
    assert tel.source == "sysfs"
    assert notes == [("telemetry: jtop unavailable (JtopVersionMismatch: jtop.service is 4.2.7, this "
                      "environment's jetson-stats 4.3.1: use the board's own jetson-stats (docs/jetson.md)), "
                      "using sysfs")]


def test_jtop_facts_record_the_service_interval_and_the_board_state(monkeypatch):
    """The service samples at its own interval (another client's), not the one asked for: both the
    service's figure and the gaps achieved are recorded. Thor's GPU clock comes in MHz."""
    nvp = types.SimpleNamespace(name="MAXN_SUPER", id=2)
    fake = fake_jtop_module(stats={"GPU": 50.0}, power={"rail": {}, "tot": {"power": 9000, "name": "VDD_IN"}},
                            version="4.3.2", jetson_clocks=True, nvpmodel=nvp, interval=0.05,
                            gpu={"thor": {"freq": {"cur": 1575}}})
    monkeypatch.setitem(sys.modules, "jtop", fake)
    with open_telemetry("jtop", interval_s=INTERVAL) as tel:
        assert wait_for(lambda: len(tel.samples) >= 3)
    assert tel.facts == {"jetson_stats": "4.3.2", "service_interval_s": 0.05, "jetson_clocks": True,
                         "nvpmodel": "MAXN_SUPER"}
    assert tm.interval_stats(tel.samples)["median_s"] >= 0.045 and tel.samples[-1].gpu_mhz == 1575.0


def test_without_root_tegrastats_lacks_the_gpu_clock_that_sysfs_reads():
    user = parse_tegrastats_line(lines("orin_nano_jp6.txt")[2])
    root = parse_tegrastats_line(lines("orin_nano_jp6_sudo.txt")[1])
    assert user["gpu_mhz"] is None and user["mem_mhz"] is None and root["gpu_mhz"] == 1020
    assert sysfs.SysfsReader(tree("orin_nano_jp6")).read().gpu_mhz == root["gpu_mhz"]


def test_auto_takes_tegrastats_when_no_rail_is_readable(monkeypatch, tmp_path, board_copy, sysfs_root, notes):
    block_import(monkeypatch, "jtop")
    root = board_copy("orin_nano_jp6")
    for f in root.glob("sys/bus/i2c/drivers/ina3221/*/hwmon/*/curr*_input"):
        f.unlink()
    sysfs_root(root)
    fake_tegrastats(monkeypatch, tmp_path, lines("orin_nano_jp6.txt"))
    with open_telemetry("auto", interval_s=INTERVAL) as tel:
        assert wait_for(lambda: len(tel.samples) >= 2)
    assert tel.source == "tegrastats" and len(notes) == 1
    assert "sysfs unavailable (FileNotFoundError: no readable INA3221 rail under " in notes[0]
    assert notes[0].endswith("using tegrastats")


# ---------------------------------------------------------------- what the report records
def test_report_records_the_board_state_and_the_interval_achieved(monkeypatch, sysfs_root):
    from jetson_unet.bench import report
    real = sysfs.board_state
    monkeypatch.setattr(report.sysfs, "board_state", lambda root, query: real(tree("orin_nano_jp5"), query))
    monkeypatch.setattr(report, "_command", lambda cmd: "NV Power Mode: 15W\n0" if cmd[0] == "nvpmodel" else None)
    jet = report.jetson_info()
    assert jet["nvpmodel"] == "NV Power Mode: 15W\n0" and jet["jetson_clocks"] is False
    assert jet["power_mode"] == {"id": 0, "name": "15W", "source": "nvpmodel -q"}
    assert jet["gpu_clock_mhz"] == {"min": 306.0, "max": 624.75, "cur": 624.75}
    sysfs_root(tree("orin_nano_jp5"))
    with open_telemetry("sysfs", interval_s=INTERVAL) as tel:
        assert wait_for(lambda: len(tel.samples) >= 3)
    doc = report.telemetry_doc(tel, origin=0.0)
    assert doc["interval_achieved"]["n"] == len(doc["samples"]) and doc["interval_achieved"]["median_s"] > 0
    assert doc["facts"]["rails"] == ["VDD_CPU_GPU_CV", "VDD_IN", "VDD_SOC"]
    line = report.describe({"system": {"gpu": {"name": "Orin"}, "jetson": jet}, "telemetry": doc})
    assert line == "Orin, nvpmodel 15W, jetson_clocks off, telemetry sysfs"

"""Telemetry: the tegrastats parser on recorded formats, the jtop adapter, the summary math,
and every fallback path with fake jtop / tegrastats / pynvml. The sysfs source reads an empty
tree here (no board); tests/bench/test_telemetry_sysfs.py reads board trees. CPU only, no
optional deps."""
from __future__ import annotations

import logging
import stat
import sys
import time
import types
from pathlib import Path

import pytest

from jetson_unet import logs
from jetson_unet.bench import telemetry as tm
from jetson_unet.bench.telemetry import Sample, open_telemetry, parse_tegrastats_line, sample_from_jtop

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "tegrastats"
GOOD = ["orin_nano_jp6.txt", "orin_nano_jp6_sudo.txt", "orin_nano_jp5.txt", "jetpack4.txt",
        "agx_orin.txt", "three_values.txt"]
INTERVAL = 0.02     # fast enough that every sampler test stays well under a second


def lines(name: str) -> list:
    """Fixture lines, '#' comments dropped (blank lines kept: they are test input)."""
    return [l.rstrip("\n") for l in (FIXTURES / name).read_text().splitlines(True)
            if not l.startswith("#")]


def parsed(name: str, i: int = 0) -> dict:
    d = parse_tegrastats_line(lines(name)[i])
    assert d is not None, "%s line %d did not parse" % (name, i)
    return d


# ---------------------------------------------------------------- parser, per format
def test_orin_nano_jp6_exact_line_from_platform_notes():
    d = parsed("orin_nano_jp6.txt")
    assert d["timestamp"] == "05-05-2025 06:05:39"
    assert d["power_w"] == pytest.approx(5.263) and d["power_rail"] == "VDD_IN"
    assert d["rails"] == pytest.approx({"VDD_IN": 5.263, "VDD_CPU_GPU_CV": 0.717, "VDD_SOC": 1.794})
    assert d["temps_c"]["gpu"] == pytest.approx(45.968) and d["temps_c"]["tj"] == pytest.approx(45.968)
    assert d["gpu_util"] == 0.0 and d["gpu_mhz"] is None     # no clock without sudo
    assert (d["ram_used_mb"], d["ram_total_mb"], d["swap_total_mb"]) == (2639, 7620, 3810)
    assert d["cpu_util"] == pytest.approx((1 + 4 + 8 + 4 + 5 + 4) / 6 / 100) and d["cpu_mhz"] == 729
    d2 = parsed("orin_nano_jp6.txt", 1)
    assert d2["gpu_util"] == pytest.approx(0.87) and d2["rails_avg"]["VDD_IN"] == pytest.approx(7.195)


def test_sudo_line_has_emc_and_bracketed_gr3d_clock():
    d = parsed("orin_nano_jp6_sudo.txt")
    assert (d["emc_util"], d["mem_mhz"], d["gpu_util"], d["gpu_mhz"]) == (0.0, 204, 0.0, 305)
    assert "APE" not in d["rails"] and d["power_w"] == pytest.approx(5.421)
    d2 = parsed("orin_nano_jp6_sudo.txt", 1)
    assert (d2["gpu_util"], d2["gpu_mhz"], d2["emc_util"]) == (pytest.approx(0.96), 1020, pytest.approx(0.23))


def test_jetpack5_uppercase_sensors_and_off_sensors_dropped():
    d = parsed("orin_nano_jp5.txt")
    assert d["gpu_mhz"] == 611 and d["gpu_util"] == 0.0
    assert d["temps_c"]["cpu"] == pytest.approx(45.968)        # "CPU@" lowercased
    assert "gpu" not in d["temps_c"] and "cv0" not in d["temps_c"]    # GPU@-256C, CV0@-256C
    assert all(v > -200 for v in d["temps_c"].values())
    assert d["cpu_util"] == pytest.approx(1 / 4 / 100)          # two "off" cores are not zeros
    d2 = parsed("orin_nano_jp5.txt", 1)                         # no timestamp on this one
    assert d2["timestamp"] is None and d2["temps_c"]["gpu"] == pytest.approx(48.5)


def test_jetpack4_rails_without_mw():
    nano, tx2, nx = (parsed("jetpack4.txt", i) for i in range(3))
    assert nano["power_w"] == pytest.approx(2.5) and nano["power_rail"] == "POM_5V_IN"
    assert nano["rails"]["POM_5V_CPU"] == pytest.approx(0.542) and "IRAM" not in nano["rails"]
    assert nano["temps_c"]["cpu"] == pytest.approx(45.5) and nano["gpu_mhz"] == 921
    assert tx2["power_w"] == pytest.approx(1.904) and tx2["power_rail"] == "VDD_IN"
    assert tx2["temps_c"]["tdiode"] == pytest.approx(27.75)
    assert nx["power_w"] == pytest.approx(4.455) and nx["timestamp"] is None


def test_agx_orin_total_is_the_sum_of_its_rails():
    d = parsed("agx_orin.txt")
    assert "VDD_IN" not in d["rails"] and d["power_rail"] == "sum"
    assert d["power_w"] == pytest.approx(3.181 + 0.795 + 3.325 + 0.403)
    assert d["gpu_mhz"] == 305                                  # "0%@[305,305]", one per GPC
    assert parsed("agx_orin.txt", 1)["power_w"] == pytest.approx(14.62 + 1.988 + 4.41 + 1.502)


def test_three_values_per_rail_take_the_first():
    d = parsed("three_values.txt")
    assert d["power_w"] == pytest.approx(6.12) and d["rails_avg"]["VDD_IN"] == pytest.approx(5.263)
    assert d["temps_c"]["cpu"] == 50.0 and d["temps_c"]["gpu"] == pytest.approx(51.75)
    jp7 = parsed("three_values.txt", 1)
    assert (jp7["gpu_util"], jp7["gpu_mhz"]) == (pytest.approx(0.12), 1300)
    assert jp7["power_w"] == pytest.approx(5.139 + 3.268 + 5.5)
    thor = parsed("three_values.txt", 2)
    assert thor["gpu_util"] is None and thor["gpu_mhz"] == 1000


@pytest.mark.parametrize("name", GOOD)
def test_every_recorded_line_gives_power_and_temperatures(name):
    for i, line in enumerate(lines(name)):
        d = parse_tegrastats_line(line)
        assert d is not None, "%s line %d" % (name, i)
        assert d["power_w"] > 0 and d["power_rail"] in ("VDD_IN", "POM_5V_IN", "sum")
        assert d["temps_c"] and all(k == k.lower() for k in d["temps_c"])
        assert d["ram_used_mb"] > 0


def test_malformed_lines_give_none_without_raising():
    bad = lines("malformed.txt")
    assert len(bad) >= 6
    for line in bad + [None, 42, b"\xff\xfe garbage", "x" * 10000, "GR3D_FREQ"]:
        assert parse_tegrastats_line(line) is None, repr(line)[:60]


def test_truncated_lines_give_what_they_hold():
    cut_swap, cut_rail = (parse_tegrastats_line(l) for l in lines("truncated.txt"))
    assert cut_swap["ram_used_mb"] == 2639 and cut_swap["swap_used_mb"] is None
    assert cut_swap["power_w"] is None and cut_swap["rails"] == {}
    assert cut_rail["power_w"] == pytest.approx(5.263) and cut_rail["temps_c"]["tj"] == pytest.approx(45.968)


# ---------------------------------------------------------------- jtop adapter
def test_sample_from_jtop_orin_nano():
    stats = {"time": None, "CPU1": 10, "CPU2": 30, "CPU3": "OFF", "GPU": 37.0, "EMC": 12,
             "Temp CPU": 45.1, "Temp GPU": 47.5, "Temp tj": 48, "Temp CV0": -256, "Power TOT": 5263}
    power = {"rail": {"VDD_CPU_GPU_CV": {"power": 717, "avg": 700}, "VDD_SOC": {"power": 1794}},
             "tot": {"power": 5263, "avg": 5100, "name": "VDD_IN"}}
    memory = {"RAM": {"used": 2048 * 1024, "tot": 7620 * 1024}, "EMC": {"cur": 2133000}}
    gpu = {"gpu": {"status": {"load": 37.0}, "freq": {"cur": 624750}}}
    s = sample_from_jtop(stats, power, t=1.5, memory=memory, gpu=gpu)
    assert s.t == 1.5 and s.power_w == pytest.approx(5.263) and s.power_rail == "VDD_IN"
    assert s.rails == pytest.approx({"VDD_CPU_GPU_CV": 0.717, "VDD_SOC": 1.794, "VDD_IN": 5.263})
    assert s.temps_c == {"cpu": 45.1, "gpu": 47.5, "tj": 48.0}   # case folded, CV0 (off) dropped
    assert s.gpu_util == pytest.approx(0.37) and s.cpu_util == pytest.approx(0.2)
    assert (s.gpu_mhz, s.mem_mhz, s.ram_used_mb) == (pytest.approx(624.75), 2133.0, 2048.0)


def test_sample_from_jtop_agx_sum_and_missing_fields():
    power = {"rail": {"VDD_GPU_SOC": {"power": 3181}, "VDD_CPU_CV": {"power": 795}},
             "tot": {"power": 3976, "avg": 3976}}
    s = sample_from_jtop({"Temp gpu": 43.9}, power)
    assert s.power_w == pytest.approx(3.976) and s.power_rail == "sum"
    assert s.temps_c == {"gpu": 43.9} and s.gpu_util is None and s.ram_used_mb is None
    empty = sample_from_jtop({}, {})
    assert empty.power_w is None and empty.power_rail is None and empty.rails == {}


# ---------------------------------------------------------------- summary math
def test_summary_trapezoid_interpolates_the_window_ends():
    samples = [Sample(t=0.0, power_w=2.0), Sample(t=1.0, power_w=4.0), Sample(t=2.0, power_w=4.0)]
    full = tm.summarize(samples, 0.0, 2.0, "x")
    assert full["energy_j"] == pytest.approx(3.0 + 4.0) and full["energy_method"] == "trapezoid"
    assert full["mean_power_w"] == pytest.approx(3.5) and full["peak_power_w"] == 4.0
    part = tm.summarize(samples, 0.5, 1.0, "x")          # p(0.5) = 3 by interpolation
    assert part["energy_j"] == pytest.approx((3.0 + 4.0) / 2 * 0.5) and part["n"] == 1


def test_summary_prefers_the_energy_counter():
    samples = [Sample(t=float(i), power_w=100.0, energy_j=1000.0 + 80.0 * i) for i in range(5)]
    s = tm.summarize(samples, 1.0, 3.0, "nvml")
    assert s["energy_method"] == "counter" and s["energy_j"] == pytest.approx(160.0)
    assert s["mean_power_w"] == pytest.approx(80.0) and s["peak_power_w"] == 100.0


# ---------------------------------------------------------------- fallbacks and sources
@pytest.fixture(autouse=True)
def no_board(monkeypatch, tmp_path):
    """The sysfs source reads an empty tree: no INA3221, as on a machine that is no Jetson."""
    root = tmp_path / "no_board"
    root.mkdir()
    monkeypatch.setattr(tm._SysfsSource, "root", str(root))
    return root


NO_RAIL = "sysfs unavailable (FileNotFoundError: no readable INA3221 rail under "


@pytest.fixture
def notes():
    """The warnings the package logs during the test (telemetry says each fallback in one)."""
    with logs.captured(level=logging.WARNING) as lines:
        yield lines


def block_import(monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)    # import raises ImportError


def empty_path(monkeypatch, tmp_path):
    d = tmp_path / "empty_bin"
    d.mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", str(d))


def fake_tegrastats(monkeypatch, tmp_path, out_lines, count=10 ** 6, rc=0):
    """An executable `tegrastats` on PATH printing out_lines in a loop at --interval."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    exe = bindir / "tegrastats"
    exe.write_text(
        "#!%s\nimport sys, time\nargs = sys.argv[1:]\nms = int(args[args.index('--interval') + 1])\n"
        "open(%r, 'w').write(' '.join(args))\nlines = %r\n"
        "for i in range(%d):\n    print(lines[i %% len(lines)], flush=True)\n    time.sleep(ms / 1000.0)\n"
        "sys.exit(%d)\n" % (sys.executable, str(tmp_path / "argv.txt"), list(out_lines), count, rc))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bindir))
    return tmp_path / "argv.txt"


def wait_for(cond, timeout=3.0):
    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        time.sleep(0.01)
    return cond()


def fake_jtop_module(enter_error=None, stats=None, power=None, version="4.3.2", **attrs):
    """A jetson-stats module whose jtop client reads `stats` and `power`; `attrs` become attributes of
    the client (gpu, memory, jetson_clocks, nvpmodel, interval: the service's)."""
    mod = types.ModuleType("jtop")
    mod.__version__ = version

    class JtopException(Exception):
        pass

    class jtop:
        def __init__(self, interval=0.5):
            self.interval = interval
            self.stats, self.power = stats or {}, power or {}
            self.__dict__.update(attrs)

        def __enter__(self):
            if enter_error:
                raise JtopException(enter_error)
            return self

        def __exit__(self, *exc):
            return False

        def ok(self):
            time.sleep(self.interval)
            return True

    mod.jtop, mod.JtopException = jtop, JtopException
    return mod


def test_jtop_absent_falls_back_with_one_notice(monkeypatch, notes):
    block_import(monkeypatch, "jtop")
    with open_telemetry("jtop", interval_s=INTERVAL) as tel:
        assert tel.source == "none"
    assert len(notes) == 1
    assert notes[0].startswith("telemetry: jtop unavailable (ModuleNotFoundError")
    assert notes[0].endswith("using none")
    assert "\n" not in notes[0]


def test_auto_with_nothing_available_gives_one_notice_naming_each(monkeypatch, tmp_path, notes):
    block_import(monkeypatch, "jtop")
    block_import(monkeypatch, "pynvml")
    empty_path(monkeypatch, tmp_path)
    tel = open_telemetry("auto", interval_s=INTERVAL)
    tel.stop()
    assert tel.source == "none" and len(notes) == 1
    for part in ("jtop unavailable", NO_RAIL, "tegrastats unavailable (FileNotFoundError",
                 "nvml unavailable (ModuleNotFoundError", "using none"):
        assert part in notes[0]


def test_jtop_service_down_falls_back_to_tegrastats(monkeypatch, tmp_path, notes):
    msg = "The jtop.service is not active. Please run:\nsudo systemctl restart jtop.service"
    monkeypatch.setitem(sys.modules, "jtop", fake_jtop_module(enter_error=msg))
    fake_tegrastats(monkeypatch, tmp_path, lines("orin_nano_jp6.txt"))
    with open_telemetry("auto", interval_s=INTERVAL) as tel:
        assert tel.source == "tegrastats"
    assert len(notes) == 1
    assert notes[0].startswith("telemetry: jtop unavailable (JtopException: The jtop.service is not active. "
                               "Please run:), " + NO_RAIL)
    assert notes[0].endswith("), using tegrastats")


def test_jtop_present_samples_through_the_adapter(monkeypatch, notes):
    power = {"rail": {}, "tot": {"power": 6000, "name": "VDD_IN"}}
    fake = fake_jtop_module(stats={"Temp gpu": 50.0, "GPU": 80}, power=power)
    monkeypatch.setitem(sys.modules, "jtop", fake)
    with open_telemetry("auto", interval_s=INTERVAL) as tel:
        assert wait_for(lambda: len(tel.samples) >= 3)
    assert tel.source == "jtop" and notes == []
    s = tel.summary()
    assert s["mean_power_w"] == pytest.approx(6.0) and s["max_temps_c"] == {"gpu": 50.0}
    assert s["mean_gpu_util"] == pytest.approx(0.8) and s["power_rail"] == "VDD_IN"


def test_tegrastats_missing_falls_back(monkeypatch, tmp_path, notes):
    empty_path(monkeypatch, tmp_path)
    with open_telemetry("tegrastats", interval_s=INTERVAL) as tel:
        pass
    assert tel.source == "none" and len(notes) == 1
    assert "tegrastats unavailable (FileNotFoundError: tegrastats not found on PATH)" in notes[0]


def test_fake_tegrastats_samples_and_summary(monkeypatch, tmp_path, notes):
    line = lines("orin_nano_jp6.txt")[0].replace("5263mW/5263mW", "5000mW/5000mW")
    argv = fake_tegrastats(monkeypatch, tmp_path, [line])
    with open_telemetry("tegrastats", interval_s=INTERVAL) as tel:
        time.sleep(0.05)
        t_a = tel.mark("denoise")
        time.sleep(0.15)
        t_b = tel.mark("done")
        time.sleep(0.05)
    assert notes == [] and tel.source == "tegrastats"
    assert argv.read_text() == "--interval 20"
    assert len(tel.samples) >= 5 and all(s.power_w == 5.0 for s in tel.samples)
    assert tel.samples[-1].temps_c["gpu"] == pytest.approx(45.968)
    s = tel.summary("denoise", "done")
    assert s["source"] == "tegrastats" and s["n"] >= 3 and s["mean_power_w"] == pytest.approx(5.0)
    assert s["energy_j"] == pytest.approx(5.0 * (t_b - t_a)) and s["energy_j"] > 0
    assert s["max_temps_c"]["tj"] == pytest.approx(45.968) and s["power_rail"] == "VDD_IN"
    assert tel.summary()["duration_s"] > t_b - t_a                # default: start() to stop()


def test_tegrastats_exiting_mid_run_degrades_once(monkeypatch, tmp_path, notes):
    block_import(monkeypatch, "pynvml")
    fake_tegrastats(monkeypatch, tmp_path, lines("agx_orin.txt"), count=4, rc=3)
    with open_telemetry("tegrastats", interval_s=INTERVAL) as tel:
        assert wait_for(lambda: tel.source == "none")
    assert len(notes) == 1 and notes[0] == ("telemetry: tegrastats failed "
                                            "(RuntimeError: exited with code 3), using none")
    assert tel.samples and tel.samples[0].power_rail == "sum"


def test_tegrastats_unparseable_output_falls_back_at_open(monkeypatch, tmp_path, notes):
    fake_tegrastats(monkeypatch, tmp_path, ["Error: Permission denied"])
    tel = open_telemetry("tegrastats", interval_s=INTERVAL)
    tel.stop()
    assert tel.source == "none" and len(notes) == 1
    assert "tegrastats unavailable (ValueError: cannot parse 'Error: Permission denied')" in notes[0]


def test_isolated_bad_lines_are_skipped(monkeypatch, tmp_path, notes):
    good = lines("orin_nano_jp5.txt")[0]
    fake_tegrastats(monkeypatch, tmp_path, [good, "garbled ###", good])
    with open_telemetry("tegrastats", interval_s=INTERVAL) as tel:
        assert wait_for(lambda: len(tel.samples) >= 4)
    assert notes == [] and tel.source == "tegrastats"
    assert all(s.power_w == pytest.approx(4.872) for s in tel.samples)


def test_nvml_absent_falls_back(monkeypatch, notes):
    block_import(monkeypatch, "pynvml")
    with open_telemetry("nvml", interval_s=INTERVAL) as tel:
        pass
    assert tel.source == "none" and len(notes) == 1
    assert notes[0].startswith("telemetry: nvml unavailable (ModuleNotFoundError")


def fake_pynvml(init_error=False, instant=True):
    nv = types.ModuleType("pynvml")
    t0 = time.perf_counter()

    class NVMLError(Exception):
        pass

    def init():
        if init_error:
            raise NVMLError("Driver Not Loaded")

    nv.NVMLError, nv.nvmlInit, nv.nvmlShutdown = NVMLError, init, lambda: None
    nv.NVML_TEMPERATURE_GPU, nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM = 0, 1, 2
    nv.nvmlDeviceGetHandleByIndex = lambda i: "gpu%d" % i
    nv.nvmlDeviceGetPowerUsage = lambda h: 250000                          # 250 W, 1 s average
    if instant:     # newer bindings and drivers: the instantaneous field is preferred
        nv.NVML_SUCCESS, nv.NVML_FI_DEV_POWER_INSTANT = 0, 186
        field = types.SimpleNamespace(nvmlReturn=0, value=types.SimpleNamespace(uiVal=300000))
        nv.nvmlDeviceGetFieldValues = lambda h, ids: [field] if ids == [186] else None
    # the counter runs at 200 W so a summary that used it is told apart from the trapezoid
    nv.nvmlDeviceGetTotalEnergyConsumption = lambda h: 5e6 + 200e3 * (time.perf_counter() - t0)
    nv.nvmlDeviceGetTemperature = lambda h, kind: 61
    nv.nvmlDeviceGetClockInfo = lambda h, kind: {1: 1980, 2: 2619}[kind]
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=3 * 2 ** 30)
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=87, memory=40)
    return nv


def test_nvml_init_error_falls_back(monkeypatch, notes):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error=True))
    tel = open_telemetry("nvml", interval_s=INTERVAL)
    tel.stop()
    assert tel.source == "none"
    assert notes == ["telemetry: nvml unavailable (NVMLError: Driver Not Loaded), using none"]


@pytest.mark.parametrize("instant, watts", [(True, 300.0), (False, 250.0)])
def test_nvml_samples_and_prefers_energy_counter(monkeypatch, instant, watts):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(instant=instant))
    with open_telemetry("nvml", interval_s=INTERVAL) as tel:
        time.sleep(0.05)
        t_a = tel.mark("a")
        time.sleep(0.1)
        t_b = tel.mark("b")
        time.sleep(0.05)
    s0 = tel.samples[-1]
    assert tel.source == "nvml" and s0.power_w == watts and s0.power_rail == "board"
    assert (s0.temps_c, s0.gpu_mhz, s0.mem_mhz, s0.ram_used_mb) == ({"gpu": 61.0}, 1980, 2619, 3072.0)
    assert (s0.gpu_util, s0.emc_util) == (pytest.approx(0.87), pytest.approx(0.40))
    s = tel.summary("a", "b")
    # 2%: the counter (200 W) apart from the trapezoid (250 / 300 W), with room for a loaded host's
    # skew between a sample's time stamp and its counter read (1e-3 failed once under load)
    assert s["energy_method"] == "counter" and s["energy_j"] == pytest.approx(200.0 * (t_b - t_a), rel=2e-2)
    assert s["peak_power_w"] == watts


def test_kind_none_gives_an_empty_valid_summary(notes):
    with open_telemetry("none", interval_s=INTERVAL) as tel:
        tel.mark("x")
    s = tel.summary()
    assert notes == [] and tel.source == "none" and tel.samples == []
    assert s["source"] == "none" and s["n"] == 0 and s["duration_s"] >= 0
    assert s["mean_power_w"] is None and s["energy_j"] is None and s["max_temps_c"] == {}
    assert [m[0] for m in tel.marks] == ["x"]


def test_bad_arguments_raise_with_the_choices():
    with pytest.raises(ValueError, match="auto, jtop, sysfs, tegrastats, nvml, none"):
        open_telemetry("tegra")
    with pytest.raises(ValueError, match="interval_s"):
        open_telemetry("none", interval_s=0)


def test_restart_after_stop_reopens_the_source(monkeypatch):
    power = {"rail": {}, "tot": {"power": 4000, "name": "VDD_IN"}}
    monkeypatch.setitem(sys.modules, "jtop", fake_jtop_module(stats={}, power=power))
    tel = open_telemetry("jtop", interval_s=INTERVAL)
    with tel:
        assert wait_for(lambda: len(tel.samples) >= 2)
    first = len(tel.samples)
    time.sleep(3 * INTERVAL)
    assert len(tel.samples) == first                    # nothing recorded while stopped
    with tel:
        assert wait_for(lambda: len(tel.samples) >= first + 2)
    assert tel.source == "jtop" and tel.summary()["mean_power_w"] == pytest.approx(4.0)

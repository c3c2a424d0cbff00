"""Jetson telemetry without root or jtop, and the board's power state, read from files under `root`
("/" on a board; a copied tree in the tests):

- power: the INA3221 monitors. JetPack 5 and later (hwmon):
  `sys/bus/i2c/drivers/ina3221/<bus-addr>/hwmon/hwmon*/in<N>_label`, `in<N>_input` (mV) and
  `curr<N>_input` (mA), power = V x I; channel 7 (the sum of shunt voltages) and rails labelled
  `NC` are skipped. JetPack 4 (iio): `sys/bus/i2c/drivers/ina3221x/<bus-addr>/iio:device*/
  rail_name_<N>` and `in_power<N>_input` (mW). The total is VDD_IN (POM_5V_IN), else the sum.
- GPU: the devfreq node named `*.gpu` (Orin, JetPack 6), `*.ga10b` (Orin, JetPack 5), `*.gv11b`,
  `*.gp10b` or `gpu-gpc-*` (Thor): `cur_freq`, `min_freq`, `max_freq`; the load (per mille) from
  its device's `load`, else `sys/devices/platform/gpu.0/load` or `sys/devices/gpu.0/load`.
- temperatures: `sys/class/thermal/thermal_zone*/type` and `temp` (m°C; Orin's cv* zones cannot be
  read on JetPack 6 and read -256 C on JetPack 5: both dropped).
- nvpmodel: the output of `nvpmodel -q` when given, else `var/lib/nvpmodel/status` (`pmode:NNNN`,
  what nvpmodel writes) named through `etc/nvpmodel.conf` (`< POWER_MODEL ID=N NAME=... >`).
- jetson_clocks: on when every CPU cluster's `scaling_min_freq` equals its `scaling_max_freq` and
  the GPU's `min_freq` its `max_freq` (jetson_clocks pins them; jtop's rule, less its check of the
  current clocks).

All of these are world-readable on JetPack 5 and 6. Symlinks are followed, so a copy made with
`cp -rL` reads the same as the board. A file that cannot be read (missing, no permission, EAGAIN from
a powered-off sensor) is a missing figure, never an error.
"""
from __future__ import annotations

import glob
import os
import re
import time

from jetson_unet.bench.telemetry_parse import _OFF_BELOW_C, Sample, _scaled, _total_power, to_mhz

_HWMON = "sys/bus/i2c/drivers/ina3221*/*/hwmon/hwmon*"
_IIO = "sys/bus/i2c/drivers/ina3221*/*/iio:device*"
_DEVFREQ = ("sys/class/devfreq/*", "sys/devices/platform/bus@0/*/devfreq/*",
            "sys/devices/platform/*/devfreq/*", "sys/devices/*/devfreq/*")
_GPU_NODES = ("gpu", "ga10b", "gv11b", "gp10b")
_DEVICE_LOADS = ("device/load", "../../load", "load")     # relative to the devfreq folder
_GPU0_LOADS = ("sys/devices/platform/gpu.0/load", "sys/devices/gpu.0/load")
_PM_QUERY = re.compile(r"NV Power Mode:\s*(.+?)\s*\n\s*(\d+)")
_PM_STATUS = re.compile(r"pmode:\s*(\d+)")
_PM_CONF = re.compile(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)")


def read_text(path: str | None) -> str | None:
    """The stripped text of `path`; None when there is no such file or it cannot be read."""
    if path is None:
        return None
    try:
        with open(path, errors="replace") as f:
            return f.read().strip()
    except (OSError, TypeError):    # TypeError: a zone that opens but yields nothing (Orin's cv*)
        return None


def read_int(path: str | None) -> int | None:
    """The first integer in `path` (`curr1_max` holds e.g. "32760 ma"), else None."""
    try:
        return int(read_text(path).split()[0])
    except (AttributeError, IndexError, ValueError):
        return None


def _under(root: str, pattern: str) -> list:
    return sorted(glob.glob(os.path.join(root, pattern)))


# ---------------------------------------------------------------- power rails
def find_rails(root: str = "/") -> dict[str, tuple[str, ...]]:
    """Rail name -> its files: (mV, mA) from hwmon, (mW,) from iio."""
    rails: dict[str, tuple[str, ...]] = {}
    for d in _under(root, _HWMON):
        for label in _under(d, "in*_label"):
            n, name = os.path.basename(label)[2:-len("_label")], read_text(label)
            if name and name != "NC" and n != "7":
                rails.setdefault(name, (os.path.join(d, f"in{n}_input"), os.path.join(d, f"curr{n}_input")))
    for d in _under(root, _IIO):
        for label in _under(d, "rail_name_*"):
            name = read_text(label)
            if name:
                rails.setdefault(name, (os.path.join(d, f"in_power{label.rsplit('_', 1)[1]}_input"),))
    return rails


def rail_watts(files: tuple[str, ...]) -> float | None:
    """One rail's power now (W), None when a file cannot be read."""
    vals = [read_int(p) for p in files]
    if None in vals:
        return None
    return vals[0] / 1e3 if len(vals) == 1 else vals[0] * vals[1] / 1e6


# ---------------------------------------------------------------- GPU and temperatures
def gpu_devfreq(root: str = "/") -> str | None:
    """The GPU's devfreq folder, None off a Jetson."""
    for pattern in _DEVFREQ:
        for d in _under(root, pattern):
            name = os.path.basename(d)
            if (name.rsplit(".", 1)[-1] in _GPU_NODES or name.startswith("gpu-gpc")) \
                    and os.path.isfile(os.path.join(d, "cur_freq")):
                return d
    return None


def gpu_load_file(root: str, devfreq: str | None) -> str | None:
    """The first readable GPU load file (per mille) for `devfreq`, else None."""
    near = [os.path.join(devfreq, p) for p in _DEVICE_LOADS] if devfreq else []
    return next((p for p in near + [os.path.join(root, p) for p in _GPU0_LOADS] if read_int(p) is not None), None)


def thermal_zones(root: str = "/") -> dict[str, str]:
    """Sensor ("cpu", "gpu", "tj", ...: the zone's type, lowercase, without "-thermal" (JetPack 6)
    or "-therm" (JetPack 5)) -> its temp file."""
    zones: dict[str, str] = {}
    for d in _under(root, "sys/class/thermal/thermal_zone*"):
        kind = read_text(os.path.join(d, "type"))
        if kind:
            zones.setdefault(re.sub(r"-therm(al)?$", "", kind.lower()), os.path.join(d, "temp"))
    return zones


def read_temps(zones: dict[str, str]) -> dict[str, float]:
    """C per readable zone; powered-off sensors (-256 C) dropped."""
    temps = {name: read_int(path) for name, path in zones.items()}
    return {name: v / 1e3 for name, v in temps.items() if v is not None and v / 1e3 > _OFF_BELOW_C}


# ---------------------------------------------------------------- power state
def power_mode(root: str = "/", query: str | None = None) -> dict | None:
    """The active nvpmodel mode as {id, name, source}: from `query` (the output of `nvpmodel -q`)
    when it names one, else from the status file; None when neither does."""
    m = _PM_QUERY.search(query or "")
    if m:
        return {"id": int(m.group(2)), "name": m.group(1), "source": "nvpmodel -q"}
    m = _PM_STATUS.search(read_text(os.path.join(root, "var/lib/nvpmodel/status")) or "")
    if m is None:
        return None
    names = dict(_PM_CONF.findall(read_text(os.path.join(root, "etc/nvpmodel.conf")) or ""))
    return {"id": int(m.group(1)), "name": names.get(str(int(m.group(1)))), "source": "/var/lib/nvpmodel/status"}


def jetson_clocks(root: str = "/", devfreq: str | None = None) -> bool | None:
    """Whether jetson_clocks pins the clocks (the module docstring's rule); None without a Jetson
    GPU (`devfreq`) or when no min/max pair is readable."""
    if devfreq is None:
        return None
    dirs = _under(root, "sys/devices/system/cpu/cpufreq/policy*")
    pairs = [(os.path.join(d, "scaling_min_freq"), os.path.join(d, "scaling_max_freq")) for d in dirs]
    pairs.append((os.path.join(devfreq, "min_freq"), os.path.join(devfreq, "max_freq")))
    known = [(read_int(lo), read_int(hi)) for lo, hi in pairs]
    same = [lo == hi for lo, hi in known if lo is not None and hi is not None]
    return all(same) if same else None


def board_state(root: str = "/", query: str | None = None) -> dict:
    """`power_mode`, `jetson_clocks` and the GPU's clocks (`gpu_clock_mhz`: min, max, cur) of the
    board under `root`; nulls off a Jetson."""
    dev = gpu_devfreq(root)
    clocks = {k: to_mhz(read_int(os.path.join(dev, k + "_freq"))) for k in ("min", "max", "cur")} if dev else None
    return {"power_mode": power_mode(root, query), "jetson_clocks": jetson_clocks(root, dev),
            "gpu_clock_mhz": clocks}


# ---------------------------------------------------------------- the reader
class SysfsReader:
    """The readable INA3221 rails, the GPU clock and load and the thermal zones under `root`, found
    once; read() samples them. FileNotFoundError when no rail can be read: power is its purpose."""

    def __init__(self, root: str = "/"):
        self.rails = {name: f for name, f in find_rails(root).items() if rail_watts(f) is not None}
        if not self.rails:
            raise FileNotFoundError(f"no readable INA3221 rail under {os.path.join(root, 'sys/bus/i2c/drivers')}")
        self.devfreq = gpu_devfreq(root)
        self.clock = os.path.join(self.devfreq, "cur_freq") if self.devfreq else None
        self.load = gpu_load_file(root, self.devfreq)
        self.zones = thermal_zones(root)

    def facts(self) -> dict:
        return {"rails": sorted(self.rails), "gpu_devfreq": self.devfreq, "gpu_load": self.load}

    def read(self, t: float | None = None) -> Sample:
        t = time.perf_counter() if t is None else t     # stamped before the reads, as NVML's
        rails = {name: rail_watts(f) for name, f in self.rails.items()}
        rails = {name: w for name, w in rails.items() if w is not None}
        power, rail = _total_power(rails)
        return Sample(t=t, power_w=power, power_rail=rail, rails=rails, temps_c=read_temps(self.zones),
                      gpu_mhz=to_mhz(read_int(self.clock)), gpu_util=_scaled(read_int(self.load), 1e-3))

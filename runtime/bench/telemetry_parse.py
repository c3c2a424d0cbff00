"""Pure parsers of Jetson telemetry: `tegrastats` lines (every format from JetPack 4 to the newest,
Orin Nano and AGX rail names) and jetson-stats (`jtop`) readings, into one `Sample` type, and the
rule that puts every clock in MHz (`to_mhz`).

No I/O and no optional imports here: the sources that run tegrastats, jtop or NVML live in
`jetson_unet.bench.telemetry`, which re-exports these names.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

_OFF_BELOW_C = -200.0       # Jetson reports a powered-off sensor as -256 C


@dataclass(frozen=True)
class Sample:
    """One reading. Units: perf_counter seconds, W, C, MHz, MB, utilizations as 0..1."""

    t: float
    power_w: float | None = None      # VDD_IN / POM_5V_IN; summed rails where absent; NVML board
    power_rail: str | None = None     # which of those: "VDD_IN", "POM_5V_IN", "sum", "board"
    rails: dict = field(default_factory=dict)     # rail -> W, current value (not the average)
    temps_c: dict = field(default_factory=dict)   # lowercase sensor -> C, off sensors dropped
    gpu_util: float | None = None
    gpu_mhz: float | None = None
    cpu_util: float | None = None     # mean over online cores
    cpu_mhz: float | None = None
    emc_util: float | None = None     # EMC bandwidth on Jetson; NVML memory utilization
    mem_mhz: float | None = None      # EMC clock on Jetson; memory clock on NVML
    ram_used_mb: float | None = None  # shared DRAM on Jetson; GPU memory on NVML
    energy_j: float | None = None     # NVML cumulative energy counter



# ---------------------------------------------------------------- tegrastats line parser
_NUM = r"(\d+(?:\.\d+)?)"
_TS_RE = re.compile(r"^\s*(\d{2}-\d{2}-\d{4} \d{2}:\d{2}:\d{2})\s*")
_MEM_RE = re.compile(r"\b(RAM|SWAP) (\d+)/(\d+)([kKMG])B")
_CPU_RE = re.compile(r"\bCPU \[([^\]]*)\](?:@(\d+))?")
_CORE_RE = re.compile(r"^\s*(\d+)%(?:@(\d+))?\s*$")
# "NAME cur/avg", "NAME cur[mW]/avg[mW]" or a third value; the look-ahead rejects
# "RAM 2639/7620MB" so memory fields never pass as rails.
_RAIL_RE = re.compile(r"\b([A-Z][A-Z0-9_]*) %s(?:mW)?/%s(?:mW)?(?:/%s(?:mW)?)?(?![\w/.])"
                      % (_NUM, _NUM, _NUM))
_TEMP_RE = re.compile(r"\b([A-Za-z]\w*)@(-?\d+(?:\.\d+)?)C(?:/-?\d+(?:\.\d+)?C)?\b")
_TO_MB = {"k": 1.0 / 1024, "K": 1.0 / 1024, "M": 1.0, "G": 1024.0}
_NOT_RAILS = ("RAM", "SWAP", "IRAM")
_TOTAL_RAILS = ("VDD_IN", "POM_5V_IN")   # module input power: Orin/Xavier, Nano/TX


def parse_tegrastats_line(line) -> dict | None:
    """One tegrastats line -> dict, or None when no known field is in it. Never raises.

    A truncated line gives a dict with what it holds (missing fields None or empty), so a
    cut-off rail list still yields RAM and temperatures. Keys: timestamp, ram_used_mb,
    ram_total_mb, swap_used_mb, swap_total_mb, cpu_util, cpu_mhz, gpu_util, gpu_mhz, emc_util,
    mem_mhz, temps_c, rails (W, first value), rails_avg (W, second value), power_w, power_rail.
    """
    try:
        return _parse(line)
    except Exception:   # odd input means "no sample", never a dead sampler thread
        return None


def _parse(line) -> dict | None:
    if isinstance(line, bytes):
        line = line.decode("utf-8", "replace")
    if not isinstance(line, str):
        return None
    ts = _TS_RE.match(line)
    text = line[ts.end():] if ts else line
    mem = {m[0]: (int(m[1]) * _TO_MB[m[3]], int(m[2]) * _TO_MB[m[3]]) for m in _MEM_RE.findall(text)}
    ram, swap = mem.get("RAM", (None, None)), mem.get("SWAP", (None, None))
    out = {"timestamp": ts.group(1) if ts else None,
           "ram_used_mb": ram[0], "ram_total_mb": ram[1],
           "swap_used_mb": swap[0], "swap_total_mb": swap[1]}
    out["cpu_util"], out["cpu_mhz"] = _parse_cpus(text)
    out["gpu_util"], out["gpu_mhz"] = _util_mhz(text, "GR3D_FREQ")
    out["emc_util"], out["mem_mhz"] = _util_mhz(text, "EMC_FREQ")
    temps = ((name.lower(), float(v)) for name, v in _TEMP_RE.findall(text))
    out["temps_c"] = {name: v for name, v in temps if v > _OFF_BELOW_C}
    rails, avg = {}, {}
    for name, cur, average, _third in _RAIL_RE.findall(text):
        if name not in _NOT_RAILS:
            rails[name], avg[name] = float(cur) / 1000.0, float(average) / 1000.0
    out["rails"], out["rails_avg"] = rails, avg
    out["power_w"], out["power_rail"] = _total_power(rails)
    found = [v for k, v in out.items() if k != "timestamp" and v not in (None, {})]
    return out if found else None


def _parse_cpus(text: str):
    m = _CPU_RE.search(text)
    if m is None:
        return None, None
    loads, clocks = [], []
    for item in m.group(1).split(","):
        core = _CORE_RE.match(item)
        if core is None:        # "off": a parked core carries no load
            continue
        loads.append(int(core.group(1)))
        mhz = core.group(2) or m.group(2)     # old format: "CPU [5%,3%]@1734"
        if mhz:
            clocks.append(int(mhz))
    if not loads:
        return None, None
    return sum(loads) / len(loads) / 100.0, (max(clocks) if clocks else None)


def _util_mhz(text: str, name: str):
    """'NAME 12%', 'NAME 12%@611', 'NAME 0%@[305,305]' (per GPC) or 'NAME @[1000]' (Thor)."""
    m = re.search(r"\b%s (?:(\d+)%%)?(?:@\[?(\d+(?:,\d+)*)\]?)?(?=\s|$)" % name, text)
    if m is None or (m.group(1) is None and m.group(2) is None):
        return None, None
    util = int(m.group(1)) / 100.0 if m.group(1) is not None else None
    mhz = max(int(f) for f in m.group(2).split(",")) if m.group(2) else None
    return util, mhz


def _total_power(rails: dict):
    for name in _TOTAL_RAILS:
        if name in rails:
            return rails[name], name
    # AGX Orin / Xavier have no input rail; jtop reports the sum of the rails, so do we
    return (sum(rails.values()), "sum") if rails else (None, None)


def sample_from_tegrastats(parsed: dict, t: float) -> Sample:
    keys = ("power_w", "power_rail", "rails", "temps_c", "gpu_util", "gpu_mhz", "cpu_util",
            "cpu_mhz", "emc_util", "mem_mhz", "ram_used_mb")
    return Sample(t=t, **{k: parsed[k] for k in keys})


# ---------------------------------------------------------------- jtop stats adapter
def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _scaled(v, scale: float) -> float | None:
    x = _num(v)
    return None if x is None else x * scale


def to_mhz(v) -> float | None:
    """A clock in Hz, kHz or MHz -> MHz, told apart by magnitude. Every Jetson GPU, CPU and EMC
    clock lies between 10 MHz and 10 GHz, so a reading of 10^7 or more is Hz (devfreq's cur_freq),
    of 10^4 or more kHz (jetson-stats), anything smaller MHz (jetson-stats on Thor); 0 stays 0."""
    x = _num(v)
    if x is None:
        return None
    return x / 1e6 if x >= 1e7 else x / 1e3 if x >= 1e4 else x


def sample_from_jtop(stats: dict, power: dict, t: float | None = None,
                     memory=None, gpu=None) -> Sample:
    """jtop's `jetson.stats` / `jetson.power` (mW) -> Sample. `memory` (jetson.memory, KB)
    and `gpu` (jetson.gpu) are optional: stats holds RAM only as a fraction. Clocks: `to_mhz`."""
    power = power or {}
    rails = {n: r["power"] / 1000.0 for n, r in (power.get("rail") or {}).items()
             if isinstance(r, dict) and _num(r.get("power")) is not None}
    tot = power.get("tot") or {}
    power_w = _scaled(tot.get("power"), 1e-3)
    rail = None
    if power_w is not None:
        rail = tot.get("name") or "sum"     # jtop names the total only when it is VDD_IN/POM_5V_IN
        if tot.get("name"):
            rails.setdefault(tot["name"], power_w)
    temps = {}
    for key, val in stats.items():
        if isinstance(key, str) and key.lower().startswith("temp "):
            v = _num(val)
            if v is not None and v > _OFF_BELOW_C:
                temps[key[5:].strip().lower()] = v
    cores = [_num(v) for k, v in stats.items() if re.match(r"CPU\d+$", str(k))]
    cores = [c for c in cores if c is not None]     # 'OFF' cores drop out
    return Sample(
        t=time.perf_counter() if t is None else t, power_w=power_w, power_rail=rail,
        rails=rails, temps_c=temps, gpu_util=_scaled(stats.get("GPU"), 0.01),
        cpu_util=sum(cores) / len(cores) / 100.0 if cores else None,
        emc_util=_scaled(stats.get("EMC"), 0.01), gpu_mhz=_jtop_gpu_mhz(gpu),
        mem_mhz=to_mhz(_jtop_get(memory, "EMC", "cur", scale=1.0)),
        ram_used_mb=_jtop_get(memory, "RAM", "used", scale=1.0 / 1024))


def _jtop_get(obj, key: str, sub: str, scale: float) -> float | None:
    try:
        return _scaled(obj[key][sub], scale)
    except Exception:   # absent on this board or an older jetson-stats: leave it empty
        return None


def _jtop_gpu_mhz(gpu) -> float | None:
    try:
        return to_mhz(next(iter(gpu.values()))["freq"]["cur"])
    except Exception:
        return None

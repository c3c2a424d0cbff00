"""Power, thermal and clock telemetry behind one interface: jtop, tegrastats, NVML or none.

    tel = open_telemetry("auto", interval_s=0.1)    # never raises for a missing source
    with tel:                                       # start() ... stop()
        tel.mark("denoise")
        run()
        tel.mark("done")
    print(tel.source, tel.summary("denoise", "done"))

"auto" tries jtop, tegrastats, nvml, none in that order; an explicit kind is tried alone and
degrades to "none", so a comparison between sources never silently measures another one.
Every failure (module missing, jtop.service down, binary missing, unparseable output, NVML
init error), at open or later while sampling, moves on to the next source and says so in ONE
line through `notice`. Sampling runs in a daemon thread from open to stop(); the caller's
thread only takes a lock to append a mark, so the measured run is not slowed.
"""
from __future__ import annotations

import bisect
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

KINDS = ("auto", "jtop", "tegrastats", "nvml", "none")
AUTO_ORDER = ("jtop", "tegrastats", "nvml", "none")
_OFF_BELOW_C = -200.0       # Jetson reports a powered-off sensor as -256 C
_BAD_LINES_IN_A_ROW = 3     # one garbled line is noise; three in a row is a format we cannot read


def print_to_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


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


def sample_from_jtop(stats: dict, power: dict, t: float | None = None,
                     memory=None, gpu=None) -> Sample:
    """jtop's `jetson.stats` / `jetson.power` (mW) -> Sample. `memory` (jetson.memory, KB)
    and `gpu` (jetson.gpu, kHz) are optional: stats holds RAM only as a fraction."""
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
        mem_mhz=_jtop_get(memory, "EMC", "cur", scale=1e-3),
        ram_used_mb=_jtop_get(memory, "RAM", "used", scale=1.0 / 1024))


def _jtop_get(obj, key: str, sub: str, scale: float) -> float | None:
    try:
        return _scaled(obj[key][sub], scale)
    except Exception:   # absent on this board or an older jetson-stats: leave it empty
        return None


def _jtop_gpu_mhz(gpu) -> float | None:
    try:
        return _scaled(next(iter(gpu.values()))["freq"]["cur"], 1e-3)
    except Exception:
        return None


# ---------------------------------------------------------------- sources
class _Source:
    """open() probes and may raise; run() samples until `stop` and raises on failure."""

    name = "none"

    def __init__(self, interval_s: float, device: int = 0):
        self.interval_s, self.device = interval_s, device

    def open(self) -> None:
        pass

    def run(self, emit, stop: threading.Event) -> None:
        stop.wait()

    def interrupt(self) -> None:
        """Unblock run() from another thread (a blocking read)."""

    def close(self) -> None:
        """Release the source; safe to call twice."""


class _JtopSource(_Source):
    name = "jtop"
    _ctx = None

    def open(self) -> None:
        from jtop import jtop   # jetson-stats, a client of jtop.service
        self._ctx = jtop(interval=self.interval_s)
        self._jetson = self._ctx.__enter__()   # JtopException when the service is not running

    def run(self, emit, stop):
        j = self._jetson
        while not stop.is_set():
            if not j.ok():      # blocks until the service's next update
                raise RuntimeError("jtop connection closed")
            emit(sample_from_jtop(j.stats, j.power, t=time.perf_counter(),
                                  memory=getattr(j, "memory", None), gpu=getattr(j, "gpu", None)))

    def close(self):
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            ctx.__exit__(None, None, None)


class _TegrastatsSource(_Source):
    name = "tegrastats"
    _proc = None

    def open(self) -> None:
        exe = shutil.which("tegrastats")
        if exe is None:
            raise FileNotFoundError("tegrastats not found on PATH")
        ms = max(1, int(round(self.interval_s * 1000)))
        self._proc = subprocess.Popen(
            [exe, "--interval", str(ms)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, universal_newlines=True, bufsize=1, errors="replace")
        # The first line proves the binary runs and prints a format we read; the timer
        # kills a tegrastats that hangs silent so open() cannot block for ever.
        wait_s = max(2.0, 5 * self.interval_s)
        timer = threading.Timer(wait_s, self._proc.kill)
        timer.daemon = True
        timer.start()
        try:
            first = self._proc.stdout.readline()
        finally:
            timer.cancel()
        if not first:
            rc = self._proc.wait(timeout=2.0)
            if rc == -9:    # our timer's kill
                raise RuntimeError("printed nothing within %.1f s" % wait_s)
            raise RuntimeError("exited with code %s before printing a line" % rc)
        if parse_tegrastats_line(first) is None:
            raise ValueError("cannot parse %r" % first.strip()[:80])

    def run(self, emit, stop):
        bad, last = 0, ""
        for line in iter(self._proc.stdout.readline, ""):
            t = time.perf_counter()     # stamped at read: the line is printed when sampled
            if stop.is_set():
                return
            parsed = parse_tegrastats_line(line)
            if parsed is None:
                bad, last = bad + 1, line.strip()[:80]
                if bad >= _BAD_LINES_IN_A_ROW:
                    raise ValueError("%d unparseable lines, last %r" % (bad, last))
                continue
            bad = 0
            emit(sample_from_tegrastats(parsed, t))
        if not stop.is_set():
            raise RuntimeError("exited with code %s" % self._proc.wait(timeout=2.0))

    def interrupt(self):
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()

    def close(self):
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=2.0)
        proc.stdout.close()


class _NvmlSource(_Source):
    name = "nvml"
    _nv = None

    def open(self) -> None:
        import pynvml   # nvidia-ml-py; NVML is absent on Jetson
        pynvml.nvmlInit()
        self._nv = pynvml
        self._h = pynvml.nvmlDeviceGetHandleByIndex(self.device)   # NVML index, PCI order
        self._energy = self._query(pynvml.nvmlDeviceGetTotalEnergyConsumption) is not None
        self._instant = self._instant_mw() is not None
        first = self.read()
        if first.power_w is None and not first.temps_c:
            raise RuntimeError("device %d reports neither power nor temperature" % self.device)

    def _query(self, fn, *args):
        try:
            return fn(self._h, *args)
        except self._nv.NVMLError:      # NotSupported on this GPU: that field stays empty
            return None

    def _instant_mw(self):
        # nvmlDeviceGetPowerUsage is a 1 s average on Ampere and newer (on an H200 it still read
        # 520 W after a burst had ended): the instantaneous field keeps plots and edges honest.
        nv = self._nv
        try:
            v = nv.nvmlDeviceGetFieldValues(self._h, [nv.NVML_FI_DEV_POWER_INSTANT])[0]
        except Exception:   # old bindings or driver: no such field
            return None
        return v.value.uiVal if v.nvmlReturn == nv.NVML_SUCCESS else None

    def read(self) -> Sample:
        nv, t = self._nv, time.perf_counter()    # stamped next to the counter, the exact one
        mj = self._query(nv.nvmlDeviceGetTotalEnergyConsumption) if self._energy else None
        mw = self._instant_mw() if self._instant else self._query(nv.nvmlDeviceGetPowerUsage)
        temp = self._query(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)
        mem = self._query(nv.nvmlDeviceGetMemoryInfo)
        util = self._query(nv.nvmlDeviceGetUtilizationRates)
        return Sample(
            t=t, power_w=_scaled(mw, 1e-3), power_rail="board" if mw is not None else None,
            temps_c={"gpu": float(temp)} if temp is not None else {},
            gpu_util=_scaled(getattr(util, "gpu", None), 0.01),
            emc_util=_scaled(getattr(util, "memory", None), 0.01),
            gpu_mhz=_num(self._query(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM)),
            mem_mhz=_num(self._query(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM)),
            ram_used_mb=_scaled(getattr(mem, "used", None), 1.0 / 2**20),
            energy_j=_scaled(mj, 1e-3))

    def run(self, emit, stop):
        while True:
            emit(self.read())
            if stop.wait(self.interval_s):
                return

    def close(self):
        nv, self._nv = self._nv, None
        if nv is not None:
            nv.nvmlShutdown()


_SOURCES = {"jtop": _JtopSource, "tegrastats": _TegrastatsSource, "nvml": _NvmlSource,
            "none": _Source}


def _describe(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    text = type(e).__name__ + (": " + lines[0].strip() if lines else "")
    return text[:160]


def _quietly(fn) -> None:
    try:
        fn()
    except Exception:   # cleanup of a source that already failed: nothing more to report
        pass


# ---------------------------------------------------------------- summary math
def _interp(pts: list, x: float) -> float:
    """Linear between samples, held flat beyond the first and the last."""
    i = bisect.bisect_left([p[0] for p in pts], x)
    if i == 0:
        return pts[0][1]
    if i == len(pts):
        return pts[-1][1]
    (ta, va), (tb, vb) = pts[i - 1], pts[i]
    return va if tb == ta else va + (vb - va) * (x - ta) / (tb - ta)


def _trapezoid(pts: list, a: float, b: float) -> float:
    """Integral over exactly [a, b]: the ends are interpolated, not the nearest samples,
    so a 2 s run sampled at 10 Hz is not off by up to a tenth at each end."""
    if b <= a or not pts:
        return 0.0
    xs = [(a, _interp(pts, a))] + [p for p in pts if a < p[0] < b] + [(b, _interp(pts, b))]
    return sum((t1 - t0) * (v0 + v1) / 2.0 for (t0, v0), (t1, v1) in zip(xs, xs[1:]))


def _energy(samples: list, a: float, b: float):
    pts = [(s.t, s.power_w) for s in samples if s.power_w is not None]
    ctr = [(s.t, s.energy_j) for s in samples if s.energy_j is not None]
    if len(ctr) >= 2:
        lo, hi = max(a, ctr[0][0]), min(b, ctr[-1][0])
        if hi > lo:     # the counter where it covers [a, b], power samples for the ends
            e = _interp(ctr, hi) - _interp(ctr, lo) + _trapezoid(pts, a, lo) + _trapezoid(pts, hi, b)
            return e, "counter"
    return (_trapezoid(pts, a, b), "trapezoid") if pts else (None, None)


def summarize(samples: list, t0: float | None, t1: float | None, source: str = "none") -> dict:
    """Mean/peak power (W), energy (J), max temperature per sensor over [t0, t1]."""
    out = {"source": source, "t0": t0, "t1": t1, "duration_s": None, "n": 0,
           "mean_power_w": None, "peak_power_w": None, "energy_j": None, "energy_method": None,
           "power_rail": None, "max_temps_c": {}, "mean_gpu_util": None, "max_gpu_mhz": None}
    if t0 is None or t1 is None:
        return out
    samples = sorted(samples, key=lambda s: s.t)
    win = [s for s in samples if t0 <= s.t <= t1]
    dur = max(0.0, t1 - t0)
    out.update(duration_s=dur, n=len(win))
    energy, method = _energy(samples, t0, t1)
    if energy is not None:
        pts = [(s.t, s.power_w) for s in samples if s.power_w is not None]
        peaks = [s.power_w for s in win if s.power_w is not None]
        out.update(energy_j=energy, energy_method=method,
                   mean_power_w=energy / dur if dur > 0 else _interp(pts, t0),
                   peak_power_w=max(peaks or [_interp(pts, t0), _interp(pts, t1)]),
                   power_rail=next((s.power_rail for s in reversed(samples) if s.power_rail), None))
    for s in win:
        for name, c in s.temps_c.items():
            out["max_temps_c"][name] = max(c, out["max_temps_c"].get(name, c))
    utils = [s.gpu_util for s in win if s.gpu_util is not None]
    clocks = [s.gpu_mhz for s in win if s.gpu_mhz is not None]
    out["mean_gpu_util"] = sum(utils) / len(utils) if utils else None
    out["max_gpu_mhz"] = max(clocks) if clocks else None
    return out


# ---------------------------------------------------------------- the sampler
class TelemetrySampler:
    """Samples in a daemon thread from construction to stop(); keeps what falls between
    start() and stop() plus the one reading just before start(), so the window's first
    edge is interpolated rather than held. Use open_telemetry() to build one."""

    def __init__(self, order=("none",), interval_s: float = 0.1, notice=print_to_stderr,
                 device: int = 0):
        self.interval_s, self._order, self._notice, self._device = interval_s, tuple(order), notice, device
        self._lock = threading.Lock()
        self._samples, self._marks, self._idle = [], [], None
        self._recording, self._t_start, self._t_stop = False, None, None
        self._stop, self._thread, self._src, self._idx = threading.Event(), None, None, 0
        self.source = "none"
        self._launch(0)

    # -- source lifecycle (worker thread and start/stop only; never the measured thread)
    def _open_from(self, idx: int, failures: list) -> _Source:
        for i in range(idx, len(self._order)):
            src = _SOURCES[self._order[i]](self.interval_s, self._device)
            try:
                src.open()
                break
            except Exception as e:  # any failure: telemetry must never stop the run it measures
                failures.append("%s unavailable (%s)" % (src.name, _describe(e)))
                _quietly(src.close)
        else:                       # the order did not end in "none": fall back to it anyway
            i, src = len(self._order), _Source(self.interval_s)
        self._idx, self._src, self.source = i, src, src.name
        if failures:
            self._say("telemetry: %s, using %s" % (", ".join(failures), src.name))
        return src

    def _launch(self, idx: int) -> None:
        self._stop = threading.Event()
        src = self._open_from(idx, [])
        self._thread = threading.Thread(target=self._worker, args=(src, self._stop),
                                         name="telemetry", daemon=True)
        self._thread.start()

    def _worker(self, src: _Source, stop: threading.Event) -> None:
        while True:
            try:
                src.run(self._emit, stop)
                why = "stopped sampling"
            except Exception as e:
                why = _describe(e)
            if stop.is_set():
                return
            _quietly(src.close)
            src = self._open_from(self._idx + 1, ["%s failed (%s)" % (src.name, why)])
            if stop.is_set():       # stop() came while we opened the next one
                _quietly(src.close)
                return

    def _say(self, msg: str) -> None:
        try:
            if self._notice is not None:
                self._notice(msg)
        except Exception:   # a broken notice callback must not take telemetry down
            pass

    def _emit(self, sample: Sample) -> None:
        with self._lock:
            if self._recording:
                self._samples.append(sample)
            else:
                self._idle = sample

    # -- public API
    def start(self) -> "TelemetrySampler":
        if self._stop.is_set():     # restarted after stop(): reopen the source in use
            self._launch(self._idx)
        with self._lock:
            if not self._recording:
                if self._idle is not None:
                    self._samples.append(self._idle)
                self._recording, self._t_start, self._t_stop = True, time.perf_counter(), None
        return self

    def stop(self) -> None:
        with self._lock:
            if self._recording:
                self._recording, self._t_stop = False, time.perf_counter()
            self._idle = None
        if self._stop.is_set():
            return
        self._stop.set()
        _quietly(self._src.interrupt)
        self._thread.join(timeout=3 * self.interval_s + 2.0)
        _quietly(self._src.close)

    close = stop

    def __enter__(self) -> "TelemetrySampler":
        return self.start()

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    def mark(self, label: str) -> float:
        """Record a named phase boundary (time.perf_counter()); returns the time."""
        t = time.perf_counter()
        with self._lock:
            self._marks.append((str(label), t))
        return t

    @property
    def marks(self) -> list:
        with self._lock:
            return list(self._marks)

    @property
    def samples(self) -> list:
        with self._lock:
            return list(self._samples)

    def _time_of(self, x, default: float | None) -> float | None:
        if x is None:
            return default
        if isinstance(x, str):
            times = [t for label, t in self.marks if label == x]
            if not times:
                raise ValueError("no mark %r; marks: %s" % (x, sorted({m[0] for m in self.marks})))
            return times[-1]
        return float(x)

    def summary(self, t0=None, t1=None) -> dict:
        """Over [t0, t1]: perf_counter times or mark labels; defaults start() and stop()
        (or the last sample while running). See summarize() for the keys."""
        samples = self.samples
        a = self._time_of(t0, self._t_start if self._t_start is not None
                          else (samples[0].t if samples else None))
        b = self._time_of(t1, self._t_stop if self._t_stop is not None
                          else (samples[-1].t if samples else None))
        return summarize(samples, a, b, self.source)


def open_telemetry(kind: str = "auto", interval_s: float = 0.1, notice=print_to_stderr,
                   device: int = 0) -> TelemetrySampler:
    """The sampler for `kind` (see KINDS); `device` is the NVML index. Raises ValueError only
    for a bad argument: an unavailable source degrades with one notice instead."""
    if kind not in KINDS:
        raise ValueError("telemetry kind %r: choose one of %s" % (kind, ", ".join(KINDS)))
    if not interval_s > 0:
        raise ValueError("interval_s must be > 0, got %r" % (interval_s,))
    order = AUTO_ORDER if kind == "auto" else ((kind,) if kind == "none" else (kind, "none"))
    return TelemetrySampler(order, interval_s, notice, device)

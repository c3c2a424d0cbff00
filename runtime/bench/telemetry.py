"""Power, thermal and clock telemetry behind one interface: jtop, sysfs, tegrastats, NVML or none.

    tel = open_telemetry("auto", interval_s=0.1)    # never raises for a missing source
    with tel:                                       # start() ... stop()
        tel.mark("denoise")
        run()
        tel.mark("done")
    print(tel.source, tel.summary("denoise", "done"))

"auto" tries jtop, sysfs (the INA3221 rails and GPU clock, no root: `jetson_unet.bench.sysfs`),
tegrastats, nvml, none in that order; an explicit kind is tried alone and degrades to "none", so a
comparison between sources never silently measures another one. Every failure (module missing,
jtop.service down or of another jetson-stats version, no readable rail, binary missing,
unparseable output, NVML init error), at open or later while sampling, moves on to the next source
and says so in ONE line to the `jetson_unet` logger (a warning; an info line names the source when
nothing failed). Sampling runs in a daemon thread from open to stop(); the caller's thread only
takes a lock to append a mark, so the measured run is not slowed. `facts` holds what the source
says of itself and the board; `interval_stats` the sampling interval achieved.
"""
from __future__ import annotations

import bisect
import logging
import re
import shutil
import statistics
import subprocess
import threading
import time
from jetson_unet.bench.sysfs import SysfsReader
from jetson_unet.bench.telemetry_parse import (Sample, _num, _scaled, parse_tegrastats_line,  # noqa: F401 (re-exported)
                                             sample_from_jtop, sample_from_tegrastats)

log = logging.getLogger(__name__)
KINDS = ("auto", "jtop", "sysfs", "tegrastats", "nvml", "none")
AUTO_ORDER = ("jtop", "sysfs", "tegrastats", "nvml", "none")
_BAD_LINES_IN_A_ROW = 3     # one garbled line is noise; three in a row is a format we cannot read


# ---------------------------------------------------------------- sources
class _Source:
    """open() probes and may raise; run() samples until `stop` and raises on failure."""

    name = "none"
    facts: dict = {}    # what the source says of itself and the board, set by open()

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


class _PolledSource(_Source):
    """A source read on demand: read() every interval_s from open to stop."""

    def read(self) -> Sample:
        raise NotImplementedError

    def run(self, emit, stop):
        while True:
            emit(self.read())
            if stop.wait(self.interval_s):
                return


class JtopVersionMismatch(RuntimeError):
    """This environment's jetson-stats is another version than the board's jtop.service."""


_MISMATCH = re.compile(r"Mismatch version jtop service: \[([^\]]*)\] and client: \[([^\]]*)\]")


def _jtop_error(e: Exception) -> Exception:
    m = _MISMATCH.search(str(e))
    if m is None:
        return e
    return JtopVersionMismatch("jtop.service is %s, this environment's jetson-stats %s: use the board's "
                               "own jetson-stats (docs/jetson.md)" % m.groups())


def _attr(obj, name: str):
    try:
        return getattr(obj, name, None)
    except Exception:   # a property of a half-started client: that fact stays empty
        return None


def _jtop_facts(jetson, version) -> dict:
    """jetson-stats' version, the service's own sampling interval (the first client's sets it),
    jetson_clocks and the nvpmodel mode, as jtop reports them."""
    jc, nvp = _attr(jetson, "jetson_clocks"), _attr(jetson, "nvpmodel")
    return {"jetson_stats": version, "service_interval_s": _num(_attr(jetson, "interval")),
            "jetson_clocks": None if jc is None else bool(jc),
            "nvpmodel": None if nvp is None else str(_attr(nvp, "name") or nvp)}


class _JtopSource(_Source):
    name = "jtop"
    _ctx = None

    def open(self) -> None:
        import jtop     # jetson-stats, a client of jtop.service: the board's own (docs/jetson.md)
        self._ctx = jtop.jtop(interval=self.interval_s)
        try:
            self._jetson = self._ctx.__enter__()   # JtopException: service down, or another version
        except Exception as e:
            raise _jtop_error(e)
        self.facts = _jtop_facts(self._jetson, getattr(jtop, "__version__", None))

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


class _SysfsSource(_PolledSource):
    name = "sysfs"
    root = "/"      # the tree read (a copied one in the tests)

    def open(self) -> None:
        self._reader = SysfsReader(self.root)
        self.facts = dict(self._reader.facts(), root=self.root)

    def read(self) -> Sample:
        return self._reader.read()


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


class _NvmlSource(_PolledSource):
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

    def close(self):
        nv, self._nv = self._nv, None
        if nv is not None:
            nv.nvmlShutdown()


_SOURCES = {"jtop": _JtopSource, "sysfs": _SysfsSource, "tegrastats": _TegrastatsSource,
            "nvml": _NvmlSource, "none": _Source}


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


def interval_stats(samples: list) -> dict:
    """The sampling interval achieved: `n` samples, the median and the largest gap between
    consecutive sample times (s; None below two samples)."""
    ts = sorted(s.t for s in samples)
    gaps = [b - a for a, b in zip(ts, ts[1:])]
    return {"n": len(ts), "median_s": statistics.median(gaps) if gaps else None,
            "max_s": max(gaps) if gaps else None}


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

    def __init__(self, order=("none",), interval_s: float = 0.1, device: int = 0):
        self.interval_s, self._order, self._device = interval_s, tuple(order), device
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
        else:
            log.info("telemetry: %s", src.name)
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
        log.warning(msg)

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

    @property
    def facts(self) -> dict:
        """What the source in use says of itself and the board (jtop: jetson-stats version,
        service interval, jetson_clocks, nvpmodel; sysfs: root, rails, GPU files)."""
        return dict(self._src.facts)

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


def open_telemetry(kind: str = "auto", interval_s: float = 0.1,
                   device: int = 0) -> TelemetrySampler:
    """The sampler for `kind` (see KINDS); `device` is the NVML index. Raises ValueError only
    for a bad argument: an unavailable source degrades with one logged warning instead."""
    if kind not in KINDS:
        raise ValueError("telemetry kind %r: choose one of %s" % (kind, ", ".join(KINDS)))
    if not interval_s > 0:
        raise ValueError("interval_s must be > 0, got %r" % (interval_s,))
    order = AUTO_ORDER if kind == "auto" else ((kind,) if kind == "none" else (kind, "none"))
    return TelemetrySampler(order, interval_s, device)

"""A Chrome/Perfetto timeline (`--trace trace.json`): one track per stream plus the CPU.

GPU spans come from CUDA event pairs (elapsed time against one origin event); CPU spans from
`time.perf_counter`, aligned to the origin by synchronizing on it once. Open the file in
https://ui.perfetto.dev or chrome://tracing. NVTX ranges (for Nsight Systems on a Jetson) are
emitted by the pipeline through the backend, not here.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from jetson_unet.files import atomic_open


@dataclass
class Timeline:
    backend: Any
    origin: Any = None                    # timing event recorded at the start
    origin_host: float = 0.0              # perf_counter when the origin event completed
    gpu: List[Tuple[str, str, Any, Any]] = field(default_factory=list)   # (track, name, ev0, ev1)
    cpu: List[Tuple[str, str, float, float]] = field(default_factory=list)
    enabled: bool = True

    def start(self, stream: Any) -> None:
        if not self.enabled:
            return
        self.origin = self.backend.event()
        self.origin.record(stream)
        self.origin.synchronize()
        self.origin_host = time.perf_counter()

    def gpu_span(self, track: str, name: str, stream: Any) -> Tuple[Any, Any]:
        """Record the start event now; the caller records the returned end event after the work."""
        if not self.enabled:
            return None, None
        e0, e1 = self.backend.event(), self.backend.event()
        e0.record(stream)
        self.gpu.append((track, name, e0, e1))
        return e0, e1

    def cpu_span(self, name: str, t0: float, t1: float, track: str = "CPU") -> None:
        if self.enabled:
            self.cpu.append((track, name, t0, t1))

    def events(self) -> List[Dict[str, Any]]:
        """Trace events in microseconds since the origin (call after the work has finished)."""
        out: List[Dict[str, Any]] = []
        tracks: Dict[str, int] = {}
        for track, name, e0, e1 in self.gpu:
            t0 = self.origin.elapsed_ms(e0) * 1e3
            out.append(_x(tracks, track, name, t0, e0.elapsed_ms(e1) * 1e3))
        for track, name, t0, t1 in self.cpu:
            out.append(_x(tracks, track, name, (t0 - self.origin_host) * 1e6, (t1 - t0) * 1e6))
        meta = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": tr}}
                for tr, tid in tracks.items()]
        return meta + sorted(out, key=lambda e: e["ts"])

    def write(self, path: Path, extra: Optional[Dict[str, Any]] = None) -> None:
        doc = {"traceEvents": self.events(), "displayTimeUnit": "ms", "otherData": extra or {}}
        path = Path(path)
        with atomic_open(path, "w") as f:
            json.dump(doc, f)


def _x(tracks: Dict[str, int], track: str, name: str, ts: float, dur: float) -> Dict[str, Any]:
    tid = tracks.setdefault(track, len(tracks) + 1)
    return {"name": name, "ph": "X", "pid": 1, "tid": tid, "ts": round(ts, 3), "dur": round(max(dur, 0.0), 3)}

"""A backend that records instead of running: drives the executor's host code without a GPU."""
from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import numpy as np
import pytest

from jetson_unet.build.loader import KernelSet


@pytest.fixture(autouse=True)
def own_module_cache():
    """KernelSet caches modules per (backend name, source), so a fake module (bound to the backend
    that compiled it) would log a later test's launches to an earlier backend. Imported into a test
    module, this gives each of its tests an empty cache and leaves other tests the cache as it was
    (test_gpu_cpu_parts reads what its FakeBackend compiled)."""
    saved = dict(KernelSet._cache)
    KernelSet._cache.clear()
    yield
    KernelSet._cache.clear()
    KernelSet._cache.update(saved)


class FakeBuffer:
    def __init__(self, ptr: int, nbytes: int) -> None:
        self.ptr, self.nbytes = ptr, nbytes

    def free(self) -> None:
        self.ptr = 0


class FakeFunction:
    def __init__(self, log: List[Any], symbol: str, backend: Any = None) -> None:
        self.log, self.symbol, self.backend = log, symbol, backend
        self.max_dynamic_shared = 48 * 1024
        self.opted_in = 0   # the largest limit asked for (the driver needs it where static + dynamic > 48 KB)

    def set_max_dynamic_shared(self, nbytes: int) -> None:
        self.max_dynamic_shared = max(self.max_dynamic_shared, int(nbytes))
        self.opted_in = max(self.opted_in, int(nbytes))

    def launch(self, grid: Tuple[int, ...], block: Tuple[int, ...], args: Tuple[Any, ...],
               shared_mem: int = 0, stream: Any = None, kind: str = "plain") -> None:
        if shared_mem > self.max_dynamic_shared:   # as the driver: no launch past the opt-in
            raise RuntimeError(f"{self.symbol}: {shared_mem} B of dynamic smem > {self.max_dynamic_shared}")
        entry = (self.symbol, grid, block, args, shared_mem)
        be = self.backend
        if be is not None and stream in be.capturing:   # captured: logged when the graph is launched
            be.capturing[stream].append(entry)
            return
        self.log.append(entry)
        if be is not None:
            be.launch_streams.append((stream, kind))



class FakeGraph:
    """A captured sequence of launches: each launch logs them again, on the stream it is launched on."""

    def __init__(self, backend: "FakeBackend", entries: List[Any]) -> None:
        self.backend, self.entries = backend, entries

    def launch(self, stream: Any) -> None:
        self.backend.launches.extend(self.entries)
        self.backend.launch_streams.extend((stream, "graph") for _ in self.entries)


class FakeModule:
    def __init__(self, log: List[Any], backend: Any = None) -> None:
        self.log, self.backend = log, backend

    def get(self, symbol: str) -> FakeFunction:
        return FakeFunction(self.log, symbol, self.backend)


class FakeStream:
    def synchronize(self) -> None:
        pass


class FakeEvent:
    stream: Any = None

    def record(self, stream: Any) -> None:
        self.stream = stream

    def synchronize(self) -> None:
        pass


class FakeBackend:
    """jetson_unet.backends.base.Backend over host memory that does not exist: addresses are numbers,
    launches are logged, modules come from compile_source (no cubins: compiler None)."""
    name = "fake"
    supports_graphs = True
    compiler = None

    def __init__(self, free: int = 8 << 30, arch: int = 87, sms: int = 8, integrated: bool = False) -> None:
        self.free, self._arch, self._sms, self._integrated = free, arch, sms, integrated
        self.launches: List[Any] = []
        self.compiled: List[Tuple[str, Tuple[str, ...], Sequence[str]]] = []
        self._next = 1 << 32
        self.allocs: List[FakeBuffer] = []
        self.copies: List[Tuple[int, int]] = []
        self.waits: List[Any] = []
        self.launch_streams: List[Tuple[Any, str]] = []   # per entry of launches: (stream, "plain" | "graph")
        self.capturing: dict = {}                         # stream -> launches captured so far
        self.graphs: List[FakeGraph] = []
        self.trims = 0                                    # trim_pinned calls

    def arch(self) -> int:
        return self._arch

    def sm_count(self) -> int:
        return self._sms

    def device_name(self) -> str:
        return "fake"

    def mem_info(self) -> Tuple[int, int]:
        return self.free, self.free

    def integrated(self) -> bool:
        return self._integrated

    def alloc(self, nbytes: int) -> FakeBuffer:
        b = FakeBuffer(self._next, nbytes)
        self._next += (nbytes + (1 << 20)) // 256 * 256
        self.allocs.append(b)
        return b

    def trim_pinned(self) -> None:
        self.trims += 1

    def pinned(self, shape: Sequence[int], dtype: Any) -> np.ndarray:
        return np.zeros(tuple(shape), dtype=dtype)

    def stream(self) -> FakeStream:
        return FakeStream()

    def h2d(self, dst: int, host: np.ndarray, stream: Any) -> None:
        self.copies.append((dst, host.nbytes))

    def event(self, timing: bool = True) -> FakeEvent:
        return FakeEvent()

    def wait(self, stream: Any, event: FakeEvent) -> None:
        self.waits.append(event)
        if getattr(event, "stream", None) in self.capturing:   # a fork: the waiting stream joins the capture, as in CUDA
            self.capturing[stream] = self.capturing[event.stream]

    def d2h(self, host: np.ndarray, src: int, stream: Any) -> None:
        pass

    def nvtx_push(self, name: str) -> None:
        pass

    def nvtx_pop(self) -> None:
        pass

    def load_cubin(self, path: Any, symbols: Sequence[str] = ()) -> FakeModule:
        raise AssertionError("a backend without a compiler is never handed a cubin")

    def compile_source(self, source: str, name: str, options: Tuple[str, ...],
                       symbols: Sequence[str] = ()) -> FakeModule:
        self.compiled.append((source, options, tuple(symbols)))
        return FakeModule(self.launches, self)

    def capture_begin(self, stream: Any) -> None:
        assert stream not in self.capturing, "a stream captured twice at once"
        self.capturing[stream] = []

    def capture_end(self, stream: Any) -> FakeGraph:
        entries = self.capturing.pop(stream)
        for joined in [k for k, v in self.capturing.items() if v is entries]:
            del self.capturing[joined]
        g = FakeGraph(self, entries)
        self.graphs.append(g)
        return g

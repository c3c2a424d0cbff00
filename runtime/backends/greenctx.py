"""An SM slice of the GPU: a CUDA green context of N SMs and streams inside it.

Work enqueued on a slice's streams (kernels, copies, CUDA graphs captured on them) runs on the
slice's SMs only, so a large GPU measures the regime of a small one (an Orin Nano has 8 SMs). Made
with the driver API through the CUDA Python bindings (`cuda-bindings` / `cuda-python`):

    cuDeviceGetDevResource(SM) -> cuDevSmResourceSplitByCount(1 group, >= N SMs)
    -> cuDevResourceGenerateDesc -> cuGreenCtxCreate -> cuGreenCtxStreamCreate (per stream)

Green contexts need a CUDA 12.4+ driver. The driver rounds the request up to its granularity (8 SMs
on an H100): `sm_count` is what the slice has, and `confinement` launches a kernel that records
%smid from many blocks to show the work stays there. Making the green context current is not
enough: CuPy's launches follow the stream they are given, so every stream of a run must come from
the slice.
"""
from __future__ import annotations

from typing import Any, List

from jetson_unet.errors import BackendUnavailable

MIN_DRIVER = 12040
SMID_SOURCE = r"""
extern "C" __global__ void smid_probe(unsigned int* out, long long spin) {
    unsigned int sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    long long t0 = clock64();
    while (clock64() - t0 < spin) { }
    if (threadIdx.x == 0) out[blockIdx.x] = sm;
}
"""
PROBE_BLOCKS = 1024     # several waves on any GPU: blocks land wherever the scheduler may put them
PROBE_SPIN = 20000      # clocks per block, so that blocks overlap and spread over the SMs allowed


def _driver() -> Any:
    try:
        from cuda.bindings import driver   # cuda-bindings 12.6+
        return driver
    except ImportError:
        pass
    try:
        from cuda import cuda as driver    # cuda-python 12.x
        return driver
    except ImportError:
        raise BackendUnavailable("an SM slice needs the CUDA Python driver bindings: pip install cuda-python") from None


def _check(drv: Any, result: Any, what: str) -> Any:
    """The values of a binding call's (err, *values) tuple; an error as one BackendUnavailable line."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        _, name = drv.cuGetErrorName(err)
        raise BackendUnavailable(f"cannot make an SM slice: {what} failed ({name.decode() if name else int(err)})")
    return values[0] if len(values) == 1 else values


class SmSlice:
    """A green context of at least `sms` SMs of device `device`; `stream()` gives raw handles in it."""

    def __init__(self, sms: int, device: int = 0) -> None:
        drv = self._drv = _driver()
        _check(drv, drv.cuInit(0), "cuInit")
        version = _check(drv, drv.cuDriverGetVersion(), "cuDriverGetVersion")
        if version < MIN_DRIVER:
            raise BackendUnavailable(f"an SM slice needs a CUDA 12.4+ driver (green contexts); this driver is "
                                     f"CUDA {version // 1000}.{version % 1000 // 10}")
        if not hasattr(drv, "cuGreenCtxCreate"):
            raise BackendUnavailable("an SM slice needs CUDA Python bindings 12.4+ (green contexts); "
                                     "pip install -U cuda-python")
        dev = _check(drv, drv.cuDeviceGet(device), "cuDeviceGet")
        whole = _check(drv, drv.cuDeviceGetDevResource(dev, drv.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM),
                       "cuDeviceGetDevResource")
        self.device_sms = int(whole.sm.smCount)
        if sms > self.device_sms:
            raise BackendUnavailable(f"--sms {sms}: the GPU has {self.device_sms} SMs")
        groups, count, _rest = _check(drv, drv.cuDevSmResourceSplitByCount(1, whole, 0, int(sms)),
                                      "cuDevSmResourceSplitByCount")
        if int(count) < 1:
            raise BackendUnavailable(f"cannot make an SM slice: the driver cannot split off {sms} SMs")
        self.requested, self.sm_count = int(sms), int(groups[0].sm.smCount)
        desc = _check(drv, drv.cuDevResourceGenerateDesc([groups[0]], 1), "cuDevResourceGenerateDesc")
        flags = drv.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM
        self._ctx = _check(drv, drv.cuGreenCtxCreate(desc, dev, flags), "cuGreenCtxCreate")
        self._streams: List[Any] = []

    def stream(self) -> int:
        """A new non-blocking stream of the slice (its raw CUstream handle); destroyed by close()."""
        drv = self._drv
        flags = int(drv.CUstream_flags.CU_STREAM_NON_BLOCKING)
        s = _check(drv, drv.cuGreenCtxStreamCreate(self._ctx, flags, 0), "cuGreenCtxStreamCreate")
        self._streams.append(s)
        return int(s)

    def describe(self) -> str:
        asked = f" ({self.requested} asked, the driver's granularity)" if self.requested != self.sm_count else ""
        return f"{self.sm_count} of {self.device_sms} SMs{asked}"

    def close(self) -> None:
        drv = self._drv
        for s in self._streams:
            drv.cuStreamDestroy(s)
        self._streams = []
        if self._ctx is not None:
            drv.cuGreenCtxDestroy(self._ctx)
            self._ctx = None


def confinement(backend: Any) -> int:
    """How many distinct SMs ran PROBE_BLOCKS blocks launched on one of `backend`'s streams."""
    import numpy as np
    mod = backend.compile_source(SMID_SOURCE, "smid_probe.cu", ("--std=c++17",), ("smid_probe",))
    buf = backend.alloc(4 * PROBE_BLOCKS)
    stream = backend.stream()
    mod.get("smid_probe").launch((PROBE_BLOCKS,), (32,), (np.uint64(buf.ptr), np.int64(PROBE_SPIN)), 0, stream)
    host = np.zeros(PROBE_BLOCKS, np.uint32)
    backend.d2h(host, buf.ptr, stream)
    stream.synchronize()
    buf.free()
    return len(set(host.tolist()))

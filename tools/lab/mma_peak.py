#!/usr/bin/env python3
"""The tensor-core ceiling that sm_80-class code can reach: `mma.sync.m16n8k16` (fp16 in, fp32
accumulate, the instruction every 16-bit GEMM kernel of this runtime issues) back to back from
registers, on the whole GPU or on a slice of N SMs, next to a cuBLAS fp16 matmul of the same run
(which on Hopper uses `wgmma`, an instruction sm_87 does not have).

    python -m tools.lab.mma_peak                  # whole GPU
    python -m tools.lab.mma_peak --sms 8          # the Orin Nano's SM count (a CUDA green context)

Each warp runs `--chains` independent accumulator chains (one `mma` each per trip, so a chain's
next `mma` waits only on its own previous one) for `--iters` trips; CTAs of 8 warps, `--ctas` per
SM. Nothing is loaded from memory: this is the issue rate of the tensor pipe, an upper bound no
kernel with loads, address arithmetic and an epilogue reaches. Timed with CUDA events, the median
of `--repeats` launches after one warm-up.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, List, Optional

import numpy as np

from jetson_unet.bench.timing import timed
from tools.lab import cupy_backend

WARPS = 8
MMA_FLOP = 2 * 16 * 8 * 16   # one m16n8k16: 2048 multiply-adds

SOURCE = r"""
template <int CHAINS>
__device__ __forceinline__ void mma_loop(float *out, int iters) {
    unsigned a0 = threadIdx.x * 0x00010001u, a1 = a0 ^ 0x3c003c00u, a2 = a0 + 7u, a3 = a1 + 3u;
    unsigned b0 = a0 ^ 0x38003800u, b1 = a2 ^ 0x34003400u;
    float acc[CHAINS][4];
#pragma unroll
    for (int j = 0; j < CHAINS; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int j = 0; j < CHAINS; ++j)
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                "{%0,%1,%2,%3};\n"
                : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
                : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < CHAINS; ++j) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
    if (s == 1234.5f) out[blockIdx.x] = s;   // never true in practice; keeps the chains live
}
extern "C" __global__ void __launch_bounds__(256) mma_peak_4(float *out, int iters) { mma_loop<4>(out, iters); }
extern "C" __global__ void __launch_bounds__(256) mma_peak_8(float *out, int iters) { mma_loop<8>(out, iters); }
extern "C" __global__ void __launch_bounds__(256) mma_peak_16(float *out, int iters) { mma_loop<16>(out, iters); }
"""
CHAINS = (4, 8, 16)


def flops(ctas: int, iters: int, chains: int) -> float:
    """FLOPs of one launch: every warp of every CTA issues chains x iters m16n8k16."""
    return float(ctas) * WARPS * iters * chains * MMA_FLOP


def measure(backend: Any, sms: int, ctas_per_sm: int, iters: int, repeats: int) -> Dict[str, Any]:
    cp = backend.cp
    stream = backend.stream()
    mod = cp.RawModule(code=SOURCE, options=("-std=c++17",))
    out = cp.zeros(sms * ctas_per_sm, dtype=cp.float32)
    ctas = sms * ctas_per_sm
    rows: List[Dict[str, Any]] = []
    for chains in CHAINS:
        kern = mod.get_function(f"mma_peak_{chains}")
        launch = lambda: kern((ctas,), (32 * WARPS,), (out, np.int32(iters)), stream=stream)   # noqa: E731
        t = timed(backend, stream, launch, 1, 1, repeats) * 1e-3   # one warm-up, the median of single launches
        rows.append({"chains": chains, "s": t, "tflops": flops(ctas, iters, chains) / t / 1e12})
    return {"sms": sms, "ctas_per_sm": ctas_per_sm, "iters": iters, "rows": rows}


def cublas_tflops(backend: Any) -> float:
    from tools.lab.roofline import matmul_rate
    return matmul_rate(backend, backend.stream(), 8192, np.float16) / 1e12


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sms", type=int, default=None, help="run on a slice of N SMs (default: the whole GPU)")
    ap.add_argument("--ctas", type=int, default=2, help="CTAs of 8 warps per SM (default: 2)")
    ap.add_argument("--iters", type=int, default=20000, help="trips of the mma loop (default: 20000)")
    ap.add_argument("--repeats", type=int, default=5, help="timed launches; the median is kept (default: 5)")
    return ap


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if min(args.ctas, args.iters, args.repeats) < 1 or (args.sms is not None and args.sms < 1):
        print("mma_peak: --sms, --ctas, --iters and --repeats must be >= 1", file=sys.stderr)
        return 2
    backend = cupy_backend("mma_peak", args.sms)
    if backend is None:
        return 2
    sms = backend.sm_count()
    res = measure(backend, sms, args.ctas, args.iters, args.repeats)
    hz = clock_hz(backend)
    print(f"{backend.device_name()}, {sms} SMs, {args.ctas} CTAs x {WARPS} warps per SM, mma.sync.m16n8k16 f16 -> f32")
    for r in res["rows"]:
        per_clk = f", {r['tflops'] * 1e12 / sms / hz:.0f} FLOP/clock/SM at {hz / 1e6:.0f} MHz" if hz else ""
        print(f"  {r['chains']:>2} chains per warp: {r['tflops']:8.1f} TFLOP/s{per_clk}")
    print(f"  cuBLAS fp16 8192^3 matmul, same run: {cublas_tflops(backend):8.1f} TFLOP/s")
    return 0


def clock_hz(backend: Any) -> Optional[float]:
    """The SM clock NVML reports now (nvidia-ml-py, where installed), to print FLOP per clock; else None."""
    try:
        import pynvml   # nvidia-ml-py, where installed
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(backend.device.id)
        return float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)) * 1e6
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())

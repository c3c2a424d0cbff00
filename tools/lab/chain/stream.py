"""Read bandwidth of an SM slice: CTAs of 1024 threads reading a buffer with 16-byte loads, 8 in
flight per thread (L2-resident: a 24 MB buffer read again and again; HBM: 2 GB), against the
device-to-device memcpy the roofline's floor uses.

    python -m tools.lab.chain.stream [--sms 8]
"""
import argparse
import statistics

import numpy as np

from jetson_unet.backends import get_backend

SRC = r'''
__device__ __forceinline__ uint4 ldcg(const uint4 *p) {
    uint4 r;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}
extern "C" __global__ void rd(const uint4 *p, unsigned long long n, unsigned long long reps, uint4 *sink) {
    uint4 acc = make_uint4(0, 0, 0, 0);
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long r = 0; r < reps; ++r)
        for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += 8 * stride) {
            uint4 v[8];
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const unsigned long long j = i + k * stride;
                v[k] = j < n ? ldcg(p + j) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int k = 0; k < 8; ++k) { acc.x ^= v[k].x; acc.y ^= v[k].y; acc.z ^= v[k].z; acc.w ^= v[k].w; }
        }
    if (acc.x == 0x12345678u) sink[0] = acc;
}
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sms", type=int, default=8)
    a = ap.parse_args()
    be = get_backend("cupy", a.sms or None)
    cp = be.cp
    s = be.stream()
    fn = cp.RawModule(code=SRC).get_function("rd")
    sink = cp.zeros(4, cp.uint32)
    for label, nbytes, reps in (("L2 (24 MB, 8 passes)", 24 << 20, 8), ("HBM (2 GB)", 2 << 30, 1)):
        with s:
            buf = cp.ones(nbytes // 4, cp.uint32)
        n = nbytes // 16
        for ctas in (a.sms or 132, 2 * (a.sms or 132), 4 * (a.sms or 132)):
            ts = []
            for _ in range(5):
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record(s)
                fn((ctas,), (1024,), (buf, np.uint64(n), np.uint64(reps), sink), stream=s)
                e1.record(s)
                e1.synchronize()
                ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1e-3)
            t = statistics.median(ts[1:])
            print(f"sms={a.sms} {label}: {ctas} CTAs of 1024 threads: {nbytes * reps / t / 1e9:.0f} GB/s")
        with s:
            dst = cp.empty_like(buf)
        ts = []
        for _ in range(5):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(s)
            cp.cuda.runtime.memcpyAsync(dst.data.ptr, buf.data.ptr, nbytes, 3, s.ptr)
            e1.record(s)
            e1.synchronize()
            ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1e-3)
        print(f"sms={a.sms} {label}: device-to-device memcpy, read + written: {2 * nbytes / statistics.median(ts[1:]) / 1e9:.0f} GB/s")
        del buf, dst


if __name__ == "__main__":
    main()

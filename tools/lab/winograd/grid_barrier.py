"""Kernel boundary vs grid barrier on an SM slice: is a persistent kernel worth it?"""
import sys, numpy as np, cupy as cp
from jetson_unet.backends.cupy import CupyBackend
sms = int(sys.argv[1]) if len(sys.argv) > 1 else 8
be = CupyBackend(sms=sms) if sms else CupyBackend()
src = r'''
extern "C" __global__ void step(unsigned* buf, int i) {
    // dependent chain: read what the previous kernel wrote, write the next
    if (threadIdx.x == 0) { unsigned v = ((volatile unsigned*)buf)[blockIdx.x]; buf[gridDim.x + blockIdx.x] = v + 1; buf[blockIdx.x] = v + 1; }
}
extern "C" __global__ void empty(unsigned* buf, int i) { }
extern "C" __global__ void barriers(unsigned* ctr, unsigned* buf, int n) {
    __shared__ unsigned v;
    for (int k = 0; k < n; ++k) {
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned x = ((volatile unsigned*)buf)[(blockIdx.x + 1) % gridDim.x];
            buf[gridDim.x + blockIdx.x] = x + 1;
            __threadfence();
            atomicAdd(ctr, 1u);
            unsigned target = (unsigned)(k + 1) * gridDim.x;
            while (((volatile unsigned*)ctr)[0] < target) { }
            __threadfence();
        }
        __syncthreads();
    }
}
'''
mod = be.compile_source(src, "bar.cu", ("--std=c++17",), ("step", "empty", "barriers"))
s = be.stream()
N = 400
def t(fn, reps=5):
    ts = []
    for _ in range(reps):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(s); fn(); e1.record(s); e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
    return sorted(ts)[len(ts) // 2]
for ctas in (8, 16, 32):
    buf = cp.zeros(4 * ctas, cp.uint32); ctr = cp.zeros(1, cp.uint32)
    for name in ("empty", "step"):
        k = mod.get(name)
        def launches():
            for i in range(N):
                k.launch((ctas,), (256,), (np.uint64(buf.data.ptr), np.int32(i)), 0, s)
        s.begin_capture()
        launches()
        g = s.end_capture()
        g.launch(s); s.synchronize()
        print(f"sms={sms} ctas={ctas} graph of {N} '{name}' kernels: {t(lambda: g.launch(s)) / N:.3f} us each")
    kb = mod.get("barriers")
    def bars():
        with s: ctr.fill(0)
        kb.launch((ctas,), (256,), (np.uint64(ctr.data.ptr), np.uint64(buf.data.ptr), np.int32(N)), 0, s)
    bars(); s.synchronize()
    base = t(lambda: (s.__enter__(), ctr.fill(0), s.__exit__(None, None, None), kb.launch((ctas,), (256,), (np.uint64(ctr.data.ptr), np.uint64(buf.data.ptr), np.int32(1)), 0, s)))
    print(f"sms={sms} ctas={ctas} grid barrier: {(t(bars) - base) / (N - 1):.3f} us each")

// common.cuh: helpers shared by every kernel file of the runtime.
//
// Element types without any CUDA header (NVRTC with pip-installed headers cannot open
// <cuda_fp16.h>/<mma.h> everywhere): fp16/bf16 are stored as raw 16-bit words and converted with
// inline PTX (cvt.*, sm_80+). Tensor cores through inline PTX `mma.sync.m16n8k16` + `ldmatrix`.
// GroupNorm(1) statistics travel between kernels as per-CTA partials (count, sum, M2 about the
// tile mean); the consumer merges them in double with Chan's formula (no atomics, deterministic).
#ifndef SEED_COMMON_CUH
#define SEED_COMMON_CUH

typedef unsigned short u16;
typedef unsigned int u32;

// ---- element types ------------------------------------------------------------------------------
struct F32 {
    typedef float S;
    static const bool TC = false;   // fp32: FFMA path
    static __device__ __forceinline__ float to_f(float v) { return v; }
    static __device__ __forceinline__ float from_f(float v) { return v; }
};

struct F16 {
    typedef u16 S;
    static const bool TC = true;    // tensor cores
    static __device__ __forceinline__ float to_f(u16 v) {
        float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v)); return f;
    }
    static __device__ __forceinline__ u16 from_f(float f) {
        u16 v; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(v) : "f"(f)); return v;
    }
    // packed / scalar fused multiply-add, one rounding (the GroupNorm of a conv's A operand)
    static __device__ __forceinline__ u32 fma2(u32 a, u32 b, u32 c) {
        u32 d; asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c)); return d;
    }
    static __device__ __forceinline__ u16 fma1(u16 a, u16 b, u16 c) {
        u16 d; asm("fma.rn.f16 %0, %1, %2, %3;" : "=h"(d) : "h"(a), "h"(b), "h"(c)); return d;
    }
    static const u32 ONE2 = 0x3C003C00u;   // (1.0, 1.0)
    static __device__ __forceinline__ void mma(float c[4], const u32 a[4], const u32 b[2]) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

struct BF16 {
    typedef u16 S;
    static const bool TC = true;
    static __device__ __forceinline__ float to_f(u16 v) { return __uint_as_float(((u32)v) << 16); }
    static __device__ __forceinline__ u16 from_f(float f) {
        u16 v; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(v) : "f"(f)); return v;
    }
    static __device__ __forceinline__ u32 fma2(u32 a, u32 b, u32 c) {   // sm_80+, as the bf16 mma
        u32 d; asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c)); return d;
    }
    static __device__ __forceinline__ u16 fma1(u16 a, u16 b, u16 c) {
        u16 d; asm("fma.rn.bf16 %0, %1, %2, %3;" : "=h"(d) : "h"(a), "h"(b), "h"(c)); return d;
    }
    static const u32 ONE2 = 0x3F803F80u;   // (1.0, 1.0)
    static __device__ __forceinline__ void mma(float c[4], const u32 a[4], const u32 b[2]) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

// ---- vectors of N elements, loaded/stored with one instruction when N*sizeof(S) is 16/8/4 bytes ----
template <typename S, int N> struct Vec { S v[N]; };

template <typename S, int N>
__device__ __forceinline__ Vec<S, N> vload(const S* p) {
    Vec<S, N> r;
    if constexpr (sizeof(S) * N == 16) {
        union { uint4 u; Vec<S, N> x; } c; c.u = *reinterpret_cast<const uint4*>(p); r = c.x;
    } else if constexpr (sizeof(S) * N == 8) {
        union { uint2 u; Vec<S, N> x; } c; c.u = *reinterpret_cast<const uint2*>(p); r = c.x;
    } else if constexpr (sizeof(S) * N == 4) {
        union { u32 u; Vec<S, N> x; } c; c.u = *reinterpret_cast<const u32*>(p); r = c.x;
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) r.v[i] = p[i];
    }
    return r;
}

template <typename S, int N>
__device__ __forceinline__ void vstore(S* p, const Vec<S, N>& r) {
    if constexpr (sizeof(S) * N == 16) {
        union { uint4 u; Vec<S, N> x; } c; c.x = r; *reinterpret_cast<uint4*>(p) = c.u;
    } else if constexpr (sizeof(S) * N == 8) {
        union { uint2 u; Vec<S, N> x; } c; c.x = r; *reinterpret_cast<uint2*>(p) = c.u;
    } else if constexpr (sizeof(S) * N == 4) {
        union { u32 u; Vec<S, N> x; } c; c.x = r; *reinterpret_cast<u32*>(p) = c.u;
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) p[i] = r.v[i];
    }
}

template <typename S, int N>
__device__ __forceinline__ Vec<S, N> vzero() {
    Vec<S, N> r;
#pragma unroll
    for (int i = 0; i < N; ++i) r.v[i] = S(0);   // 0.0f and the 16-bit word 0 are both +0
    return r;
}

// Keeps a value computed before a loop in a register: the compiler cannot see through the empty asm,
// so it cannot rematerialize the value inside the loop (it does, for cheap-looking address
// arithmetic, even with registers to spare: measured on sm_87 and sm_90 SASS).
template <class T> __device__ __forceinline__ void pin(T &v) {
#ifdef __CUDA_ARCH__
    if constexpr (sizeof(T) == 8) asm volatile("" : "+l"(v));
    else asm volatile("" : "+r"(v));
#endif
}

// ---- shared-memory matrix fragments -------------------------------------------------------------
// Shared memory addressed as 32-bit .shared-window offsets (`saddr`): kernels convert their arrays'
// generic pointers once and keep per-lane offsets outside their loops (each generic -> shared
// conversion costs instructions, on sm_90 also a read of the CTA's cluster id).
typedef u32 saddr;

__device__ __forceinline__ saddr smem_u32(const void* p) {
    return (saddr)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void ldmatrix_x4(u32 r[4], saddr a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

// ---- math ---------------------------------------------------------------------------------------
__device__ __forceinline__ float gelu_f(float v) {   // exact erf form, as the spec
    return 0.5f * v * (1.0f + erff(v * 0.70710678118654752440f));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the whole CTA, returned to every thread; `scratch` holds >= 33 floats. Deterministic.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();                       // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < nw ? scratch[lane] : 0.0f;
        t = warp_sum(t);
        if (lane == 0) scratch[32] = t;
    }
    __syncthreads();
    return scratch[32];
}

// ---- GroupNorm(1) statistics as per-CTA partials ---------------------------------------------
// Producer: every thread passes the sum of its values and a function to revisit them; the CTA
// writes {count, sum, M2 about the tile mean, 0}. Two passes over registers: no cancellation.
struct StatPartial { float n, sum, m2, pad; };

// Consumer: merge the P partials of one sample in double over the whole CTA (one pass, a few
// independent loads per thread: this sits in front of every normalized conv, so its latency
// counts): N = sum n_i, S = sum s_i, Q = sum (m2_i + s_i^2 / n_i); M2 = Q - S^2 / N (Chan et al.,
// exact in double for any realistic mean/std ratio). Writes mean, rstd; `dred` holds 3*32 doubles.
__device__ __forceinline__ void gn_merge(const float4* part, int P, float eps, float* mean_rstd, double* dred) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    double n = 0.0, s = 0.0, q = 0.0;
    for (int i = threadIdx.x; i < P; i += blockDim.x) {
        const float4 v = part[i];
        n += v.x;
        s += v.y;
        if (v.x > 0.0f) q += (double)v.z + (double)v.y * v.y / v.x;
    }
    n = warp_sum_d(n); s = warp_sum_d(s); q = warp_sum_d(q);
    if (lane == 0) { dred[warp] = n; dred[32 + warp] = s; dred[64 + warp] = q; }
    __syncthreads();
    if (threadIdx.x == 0) {
        double tn = 0.0, ts = 0.0, tq = 0.0;
        for (int w = 0; w < nw; ++w) { tn += dred[w]; ts += dred[32 + w]; tq += dred[64 + w]; }
        const double mean = ts / tn, var = fmax((tq - ts * ts / tn) / tn, 0.0);
        mean_rstd[0] = (float)mean;
        mean_rstd[1] = (float)(1.0 / sqrt(var + (double)eps));
    }
}

#endif  // SEED_COMMON_CUH

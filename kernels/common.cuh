// common.cuh: helpers shared by every kernel file of the runtime.
//
// Element types without any CUDA header (NVRTC with pip-installed headers cannot open
// <cuda_fp16.h>/<mma.h> everywhere): fp16/bf16 are stored as raw 16-bit words and converted with
// inline PTX (cvt.*, sm_80+). Tensor cores through inline PTX `mma.sync.m16n8k16` + `ldmatrix`.
// GroupNorm(1) statistics travel between kernels as per-CTA partials (count, sum, M2 about the
// tile mean); the consumer merges them in fp32 in two passes (no atomics, deterministic).
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

// Two matrices: lanes 0..7 and 8..15 give their row addresses (the others' are not read).
__device__ __forceinline__ void ldmatrix_x2(u32 r[2], saddr a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}

// ---- math ---------------------------------------------------------------------------------------
// a / d for 0 <= a < 2^22 and d >= 1, through the fp32 reciprocal: the estimate is within 0.75 of
// a / d (rcp.approx and the product err by < 1.5 * 2^-23 relative), so its truncation is off by at
// most one, which one remainder test corrects: exact. ~9 instructions where a signed int division
// compiles to ~25 and an unsigned one to ~14; a batch-1 conv's set-up (tile coordinates, split
// ranges, pixel rows, the tap of a k position) is a serial chain of them, ~1/3 of its ~370 set-up
// instructions (Nsight Compute). The host keeps every dividend under
// 2^22 (ops.kernel_kind: pixels per sample, K).
__device__ __forceinline__ int div_small(int a, int d) {
    int q = __float2int_rz(__fdividef((float)a, (float)d));
    const int r = a - q * d;
    q += (r >= d) - (r < 0);
    return q;
}

__device__ __forceinline__ float gelu_f(float v) {   // exact erf form, as the spec
    return 0.5f * v * (1.0f + erff(v * 0.70710678118654752440f));
}

__device__ __forceinline__ float warp_sum(float v) {
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

// Consumer: merge the P partials (count n_i, sum s_i, M2 m_i about the tile mean) of one sample into
// (mean, rstd). Each warp merges all P partials on its own, with shuffles only (no shared memory, no
// barrier): lane l takes partials l, l + 32, ...; every warp runs the same operations on the same data,
// so every thread returns the same bits. In fp32, about a shift K (partial 0's mean):
// 1. the mean, as a sum of deviations from K: d = sum (s_i - n_i K), mean = K + d / n, which keeps
//    the mean within about one rounding of itself where a plain S / N lost a few roundings to S's
//    magnitude; in the same pass M2 about K, q_K = sum (m_i + n_i (s_i / n_i - K)^2), and M2 =
//    q_K - d^2 / n where that difference cancels little (d^2 / n <= 8 M2: the shift within ~2.8
//    standard deviations of the mean, the common case for a tile mean);
// 2. otherwise (partial 0 far from the rest) a second pass: M2 = sum (m_i + n_i
//    (s_i / n_i - mean)^2), non-negative terms about the merged mean, so nothing cancels whatever
//    the mean/std ratio or the spread of the tile means (Chan et al.). One pass instead of two
//    took a batch-1 U-Net call ~6 us faster on the H100.
// Divisions and the square root are the approximate forms (__fdividef, rsqrtf: within 2 ulp, far
// inside the tests' 5e-6): an IEEE division's slow path is a subroutine call, and its register saves
// made ptxas spill at the 128-register cap in half a dozen tiles.
// The lane's first partial is loaded at the kernel's entry (GnPrefetch), so its latency overlaps the
// kernel's set-up and first copies; partials past the first 32 are loaded here (and reloaded by a
// second pass: L1 hits). Four per lane at entry (P <= 128) measured slower at batch 16 and held
// registers that the 128-register tiles spilled for.
// History: a one-pass merge in double (a DDIV per partial in every thread: the Orin has FP64 at 1/64
// of FP32), then the same two passes over the whole CTA (per-warp sums, a barrier, every thread
// summing the warps' sums from smem, twice). The per-warp merge took a batch-1 U-Net call 0.438 ->
// 0.431 ms and batch 16 1.189 -> 1.170 ms (H100).
struct GnPrefetch {   // a load only: nothing here waits for it
    float4 v;         // partial (lane) if lane < P, else zeros
    __device__ __forceinline__ GnPrefetch(const float4* part, int P) {
        const int lane = threadIdx.x & 31;
        v = (part && lane < P) ? part[lane] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
};

__device__ __forceinline__ float2 gn_merge(const float4* part, int P, const GnPrefetch& pre, float eps) {
    const int lane = threadIdx.x & 31;
    const float kn = __shfl_sync(0xffffffffu, pre.v.x, 0), ks = __shfl_sync(0xffffffffu, pre.v.y, 0);
    const float K = kn > 0.0f ? __fdividef(ks, kn) : 0.0f;   // any shift near the mean will do
    // n_i (s_i / n_i - c)^2 + m_i = e^2 / n_i + m_i, e = s_i - n_i c (one rounding)
    auto m2 = [](const float4& v, float c) {
        const float e = fmaf(-v.x, c, v.y);
        return v.x > 0.0f ? fmaf(e, __fdividef(e, v.x), v.z) : 0.0f;
    };
    float n = pre.v.x, d = fmaf(-pre.v.x, K, pre.v.y), qk = m2(pre.v, K);
    // Partials past the first 32 in batches of 4 per lane, all loaded before any is used (past P:
    // partial P - 1 again, counted as zeros): one memory latency per batch. A plain loop compiled to
    // an unrolled body of 4 and a remainder loop of one dependent load per trip (at P = 128, three
    // round trips in a row; P reaches 256 at batch 1). Batching pass 2's reloads too held registers
    // that ptxas spilled for in a gate tile on sm_87; they hit L1 anyway.
    constexpr int NB = 4;
    for (int i = lane + 32; i < P; i += 32 * NB) {
        float4 v[NB];
#pragma unroll
        for (int u = 0; u < NB; ++u) v[u] = part[min(i + 32 * u, P - 1)];   // no branch around a load
#pragma unroll
        for (int u = 0; u < NB; ++u)
            if (i + 32 * u >= P) v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int u = 0; u < NB; ++u) {
            n += v[u].x;
            d += fmaf(-v[u].x, K, v[u].y);
            qk += m2(v[u], K);
        }
    }
    n = warp_sum(n);
    d = warp_sum(d);
    qk = warp_sum(qk);
    const float dn = __fdividef(d, n), mean = K + dn;
    // M2 about the mean is M2 about K less n (mean - K)^2 = d^2 / n: accurate in one pass where that
    // term is small against M2 (rounding error ~(1 + 2 c) ulp of M2, c = d^2 / n / M2 <= 8), which
    // the tile means near the sample's make the common case. Otherwise (a far partial 0, an M2
    // lost to rounding, NaN) pass 2: M2 as a sum of non-negative terms about the merged mean.
    float q = fmaf(-d, dn, qk);
    if (!(d * dn <= 8.0f * q)) {
        q = m2(pre.v, mean);
        for (int i = lane + 32; i < P; i += 32) q += m2(part[i], mean);
        q = warp_sum(q);
    }
    return make_float2(mean, rsqrtf(__fdividef(q, n) + eps));
}

// The split-K ticket: an atomic add with acquire-release semantics at GPU scope (PTX ISA 6.0,
// sm_70+). Its release half orders the partial-tile stores that a CTA barrier ordered before it
// (release is cumulative); its acquire half, followed by a CTA barrier, orders the last CTA's reads
// of the other splits' partials after their stores (the pattern of CUTLASS's semaphore). It
// replaces __threadfence + atomicAdd by thread 0 and a __threadfence in every thread of the last
// CTA: __threadfence is a sequentially consistent fence (fence.sc.gpu), stronger than needed.
__device__ __forceinline__ int atomic_add_acq_rel(int* p, int v) {
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

#endif  // SEED_COMMON_CUH

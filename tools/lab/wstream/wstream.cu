// Prototype: a weight-streaming 3x3 conv for the low-resolution levels at small batch.
// Weights are the mma's A operand (16 output channels x 16 k), packed host-side in fragment order:
// one 16-byte load per lane per k16 step, straight into a register ring of depth D, no smem and no
// barrier in the k loop. The GroupNorm'd, zero-padded input patch of the CTA's samples sits in smem
// (loaded once), the B operand by ldmatrix at im2col addresses. A CTA = 16*MT output channels x all
// pixels, its NW warps split K; they meet in smem for bias, GELU, statistics and 16-byte stores.
// Compile-time: CIN, COUT, HH, WW (map), NS (samples per CTA), MT, NW, D.
#include <cuda_fp16.h>

#ifndef FOLD
#define FOLD 0
#endif
#ifndef HH
#define HH 8
#endif
#ifndef WW
#define WW 8
#endif
#define PW (WW + 2)
#define PP ((HH + 2) * PW)          // padded pixels per sample
#define RS (CIN + 8)                // patch row stride in halves (+16 bytes: conflict-free ldmatrix)
#define NPIX (HH * WW)              // pixels per sample
#define MPIX (NS * NPIX)            // pixels per CTA (the mma's N)
#define NT (MPIX / 8 / NWP)         // n8 tiles per warp
#define NW (NWK * NWP)
#define TPR (WW / 8)                // n8 tiles per image row
#define STEPS (9 * CIN / 16)        // k16 steps

__device__ __forceinline__ uint4 ldw(const uint4* p) {
    uint4 v;
#if NWP > 1
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"       // pixel groups share it through L1
#else
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
#endif
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ void mma16816(float* c, const uint4& a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldsm4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

__device__ __forceinline__ float gelu(float v) { return 0.5f * v * (1.0f + erff(v * 0.70710678118654752440f)); }

// x: [B][HH][WW][CIN] fp16; wp: [COUT/16][STEPS][32] uint4; gn: per sample (mean, rstd);
// gamma/beta: [CIN] fp32; y: [B][HH][WW][COUT]; stats: per sample (sum, sumsq) fp32 (atomics)
extern "C" __global__ void __launch_bounds__(NW * 32)
wstream(const __half* __restrict__ x, const uint4* __restrict__ wp, const float* __restrict__ bias,
        const float* __restrict__ gn, const float* __restrict__ gamma, const float* __restrict__ beta,
        __half* __restrict__ y, float* __restrict__ stats, const float* __restrict__ sb,
        const float* __restrict__ sg, unsigned long long* __restrict__ tsc) {
#define STAMP(k) do { if (tsc && threadIdx.x == 0) { unsigned long long g_; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g_)); tsc[blockIdx.x * 8 + (k)] = g_; } } while (0)
    STAMP(0);
    extern __shared__ __align__(16) unsigned char smem[];
    __half* patch = reinterpret_cast<__half*>(smem);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wk = warp % NWK, wpg = warp / NWK;    // k slice, pixel group
    const int ct0 = blockIdx.x * MT;                 // first 16-channel tile
    const int n0 = blockIdx.y * NS;                  // first sample
    const int s0 = wk * STEPS / NWK, s1 = (wk + 1) * STEPS / NWK;

    // 1. the weight ring: per warp R = D + 1 slots of MT A fragments (512 bytes each) in smem after
    //    the patch, filled by cp.async; each lane reads back only the 16 bytes it copied, so the warps
    //    never wait for each other. The first D steps are issued before anything waits.
    constexpr int R = D + 1;
    const unsigned wring = (unsigned)__cvta_generic_to_shared(smem) + (unsigned)(NS * PP * RS * 2)
                         + (unsigned)(warp * R * MT * 512 + lane * 16);
    auto fetch = [&](int slot, int ss) {
#pragma unroll
        for (int t = 0; t < MT; ++t)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                         :: "r"(wring + (unsigned)((slot * MT + t) * 512)),
                            "l"(wp + ((size_t)(ct0 + t) * STEPS + ss) * 32 + lane));
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
#pragma unroll
    for (int i = 0; i < D; ++i) fetch(i, min(s0 + i, s1 - 1));

    // 2. the zero-padded patch: raw copies by cp.async (all in flight at once), then each thread
    //    normalizes the vectors it copied, in place
    // each thread keeps one 8-channel vector (c8) and walks pixels: its channels' scale and shift
    // are loaded once (per element loads of gamma and beta made the patch the kernel's bottleneck)
    constexpr int C8 = CIN / 8, PROWS = (NW * 32) / C8;
    const int c8 = threadIdx.x % C8, prow = threadIdx.x / C8;
    float gm[8], bt[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) { gm[e] = gamma[c8 * 8 + e]; bt[e] = beta[c8 * 8 + e]; }
    if (prow < PROWS) {
        for (int pp = prow; pp < NS * PP; pp += PROWS) {
            const int n = pp / PP, q = pp % PP, py = q / PW - 1, px = q % PW - 1;
            __half* dst = patch + (size_t)pp * RS + c8 * 8;
            if (py >= 0 && py < HH && px >= 0 && px < WW) {
                const __half* src = x + ((size_t)((n0 + n) * HH + py) * WW + px) * CIN + c8 * 8;
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src));
            } else {
#if FOLD
                // the raw value that normalizes to 0: the folded conv's zero padding
                const float mean = gn[2 * (n0 + n)], rstd = gn[2 * (n0 + n) + 1];
                uint4 pad;
                __half2* ph = reinterpret_cast<__half2*>(&pad);
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    ph[e] = __floats2half2_rn(mean - bt[2 * e] / (rstd * gm[2 * e]), mean - bt[2 * e + 1] / (rstd * gm[2 * e + 1]));
                *reinterpret_cast<uint4*>(dst) = pad;
#else
                *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
#endif
            }
        }
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");   // (and the ring's first D)
    if (!FOLD && prow < PROWS) {
        for (int pp = prow; pp < NS * PP; pp += PROWS) {
            const int n = pp / PP, q = pp % PP, py = q / PW - 1, px = q % PW - 1;
            if (py >= 0 && py < HH && px >= 0 && px < WW) {
                uint4* p = reinterpret_cast<uint4*>(patch + (size_t)pp * RS + c8 * 8);
                uint4 in = *p;
                const float mean = gn[2 * (n0 + n)], rstd = gn[2 * (n0 + n) + 1];
                __half2* h = reinterpret_cast<__half2*>(&in);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float2 f = __half22float2(h[e]);
                    h[e] = __floats2half2_rn((f.x - mean) * rstd * gm[2 * e] + bt[2 * e],
                                             (f.y - mean) * rstd * gm[2 * e + 1] + bt[2 * e + 1]);
                }
                *p = in;
            }
        }
    }
    __syncthreads();
    STAMP(1);

    // 3. the k loop: per step one A fragment per channel tile from the ring, B by ldmatrix
    float acc[MT][NT][4];
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[t][j][0] = acc[t][j][1] = acc[t][j][2] = acc[t][j][3] = 0.f;
    // lane's ldmatrix rows: n8 tile j + (lane >> 4) of a pair, k half (lane >> 3) & 1, pixel lane & 7
    const unsigned pbase = (unsigned)__cvta_generic_to_shared(patch) + 16u * ((lane >> 3) & 1);
    unsigned poff[NT / 2];
#pragma unroll
    for (int j = 0; j < NT; j += 2) {
        const int tile = wpg * NT + j + (lane >> 4);
        const int n = tile / (HH * TPR), rem = tile % (HH * TPR);
        poff[j / 2] = pbase + 2u * (unsigned)((n * PP + (rem / TPR) * PW + (rem % TPR) * 8 + (lane & 7)) * RS);
    }
    // one step: the A fragments `a`, B by ldmatrix at tap/channel offset of step ss
    auto step = [&](const uint4 (&a)[MT], int ss) {
        const int k0 = ss * 16, tap = k0 / CIN, c0 = k0 % CIN;
        const unsigned off = 2u * (unsigned)(((tap / 3) * PW + tap % 3) * RS + c0);
#pragma unroll
        for (int j = 0; j < NT; j += 2) {
            unsigned b0, b1, b2, b3;
            ldsm4(b0, b1, b2, b3, poff[j / 2] + off);
#pragma unroll
            for (int t = 0; t < MT; ++t) {
                mma16816(acc[t][j], a[t], b0, b1);
                mma16816(acc[t][j + 1], a[t], b2, b3);
            }
        }
    };
    auto slot_a = [&](uint4 (&a)[MT], int slot) {
#pragma unroll
        for (int t = 0; t < MT; ++t)
            asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
                         : "=r"(a[t].x), "=r"(a[t].y), "=r"(a[t].z), "=r"(a[t].w)
                         : "r"(wring + (unsigned)((slot * MT + t) * 512)) : "memory");
    };
    int s = s0;
    for (; s + R <= s1; s += R) {          // whole rounds: straight-line code
#pragma unroll
        for (int i = 0; i < R; ++i) {
            fetch((i + D) % R, min(s + i + D, s1 - 1));   // clamped: harmless extra loads at the end
            asm volatile("cp.async.wait_group %0;" :: "n"(D) : "memory");
            uint4 a[MT];
            slot_a(a, i);
            step(a, s + i);
        }
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
#pragma unroll
    for (int i = 0; i < D; ++i) {          // the tail (fewer than R steps), already in slots 0..
        if (s + i < s1) {
            uint4 a[MT];
            slot_a(a, i);
            step(a, s + i);
        }
    }

    // 4. the warps' K slices meet in smem: red[k slice][pixel][16*MT + 4] fp32 (patch and ring done)
    STAMP(2);
    __syncthreads();
    STAMP(3);
    float* red = reinterpret_cast<float*>(smem);
    constexpr int CB = 16 * MT, RR = CB + 4;
    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            float* r = red + ((size_t)wk * MPIX + (wpg * NT + j) * 8 + 2 * q) * RR + t * 16 + g;
            r[0] = acc[t][j][0];
            r[RR] = acc[t][j][1];
            r[8] = acc[t][j][2];
            r[RR + 8] = acc[t][j][3];
        }
    __syncthreads();
    float lsum = 0.f, lsq = 0.f;
    for (int v = threadIdx.x; v < MPIX * (CB / 8); v += NW * 32) {
        const int c8 = v % (CB / 8), p = v / (CB / 8);
        float o[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] = 0.f;
        for (int w = 0; w < NWK; ++w) {
            const float* r = red + ((size_t)w * MPIX + p) * RR + c8 * 8;
            const float4 u = *reinterpret_cast<const float4*>(r), u2 = *reinterpret_cast<const float4*>(r + 4);
            o[0] += u.x; o[1] += u.y; o[2] += u.z; o[3] += u.w;
            o[4] += u2.x; o[5] += u2.y; o[6] += u2.z; o[7] += u2.w;
        }
        {
            const int co = ct0 * 16 + c8 * 8;
#if FOLD
            const int ns_ = n0 + p / NPIX;
            const float mean = gn[2 * ns_], rstd = gn[2 * ns_ + 1];
#pragma unroll
            for (int e = 0; e < 8; ++e) o[e] = rstd * o[e] + (sb[co + e] - mean * rstd * sg[co + e]) + bias[co + e];
#else
#pragma unroll
            for (int e = 0; e < 8; ++e) o[e] += bias[co + e];
#endif
        }
        uint4 packed;
        __half2* ph = reinterpret_cast<__half2*>(&packed);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            ph[e] = __floats2half2_rn(gelu(o[2 * e]), gelu(o[2 * e + 1]));
            const float2 f = __half22float2(ph[e]);
            lsum += f.x + f.y;
            lsq += f.x * f.x + f.y * f.y;
        }
        const int n = p / NPIX;
        *reinterpret_cast<uint4*>(y + ((size_t)(n0 * NPIX + p)) * COUT + ct0 * 16 + c8 * 8) = packed;
        (void)n;
    }
    // statistics (prototype: NS == 1, one atomic pair per warp)
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) {
        lsum += __shfl_xor_sync(0xffffffffu, lsum, m);
        lsq += __shfl_xor_sync(0xffffffffu, lsq, m);
    }
    if (lane == 0) {
        atomicAdd(stats + 2 * n0, lsum);
        atomicAdd(stats + 2 * n0 + 1, lsq);
    }
    STAMP(4);
}

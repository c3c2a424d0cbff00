// chain.cu (lab prototype): a run of 8x8-level ops of one sample as ONE persistent kernel.
// G CTAs (one per SM of the slice, 8 warps each) walk a table of ops (copied to smem); a grid
// barrier (one atomic counter, zeroed before the launch) separates ops. A 3x3 conv is split by
// output channels (BN = Cout / G per CTA, the whole K in each CTA: no split-K), its raw 10x10 input
// map kept whole in smem (cp.async; im2col by ldmatrix addresses; GroupNorm folded: W' = W gn_w,
// the border holds the pad vector, rstd and -mean rstd Q[n] + P[n] on the sums), its weights
// streamed through a cp.async ring of STAGES units of 64 UW channels x BN rows, whose first
// stages are issued under the previous op (EARLY). Warps 4 (16 rows) x 2 (BN / 2 columns). The
// depthwise conv is split by channels (FFMA). GroupNorm partials travel as G (sum, sum of
// squares) pairs. fp16, batch 1, 8x8 maps only. Knockouts: NO_MMA, NO_LDM (no ldmatrix or mma).
#include "common.cuh"

#ifndef UW
#define UW 2   // 64-channel chunks per weight unit (a warp runs UW k16 steps per unit)
#endif
#ifndef STAGES
#define STAGES 6
#endif
constexpr int NT = 256, PIX = 64, HP = 10, SLOT = 64 * 128 * UW;
constexpr int RING = STAGES * SLOT;

struct ChainOp {
    int kind, cin, cout, gelu;   // kind 0: depthwise 7x7 (+ bias + time bias), 1: 3x3 conv
    const u16 *in;
    u16 *out;
    const u16 *w;                // 3x3: [cout][9][cin] fp16
    const float *wdw;            // depthwise: [49][C] fp32
    const float *bias, *tb, *gnw, *gnb;
    const float2 *st_in;         // G partials of the input (3x3 with GroupNorm)
    float2 *st_out;              // G partials of the output
    const u16 *res;              // residual added to the output (3x3)
    const float *gnr, *gnq, *gnp;   // folded GroupNorm: r = gn_b / gn_w per input channel, Q[n], P[n]
};

__device__ long long *g_stamp;
// lab timing: CTA 0's clock at each op's phases (null: off)
__device__ __forceinline__ void stamp(int k) {
    if (g_stamp != nullptr && blockIdx.x == 0 && threadIdx.x == 0) g_stamp[k] = clock64();
}

__device__ __forceinline__ void cpa16(saddr s, const void *g) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(g));
}
__device__ __forceinline__ void cpa_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cpa_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
// loads of what other CTAs wrote in this kernel: L2 only (L1 is not coherent across SMs)
__device__ __forceinline__ uint4 ld_cg4(const void *p) {
    uint4 r;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}
__device__ __forceinline__ float2 ld_cg2f(const void *p) {
    float2 r;
    asm volatile("ld.global.cg.v2.f32 {%0,%1}, [%2];" : "=f"(r.x), "=f"(r.y) : "l"(p));
    return r;
}
__device__ __forceinline__ u32 ld_cg32(const void *p) {
    u32 r;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(r) : "l"(p));
    return r;
}
__device__ __forceinline__ u16 ld_cg16(const void *p) {
    u16 r;
    asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(r) : "l"(p));
    return r;
}
#ifndef EARLY
#define EARLY 1   // 1: an op's first weight stages are issued under the previous op; 0: after its barrier
#endif

// the k-th barrier of a launch: every CTA adds one to the counter (zeroed before the launch) and
// waits for (k + 1) x G
__device__ void grid_barrier(unsigned *bar, unsigned k) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(bar, 1u);
        const unsigned target = (k + 1) * gridDim.x;
        unsigned v;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(bar));
        } while (v < target);
    }
    __syncthreads();
}

// one weight unit (tap t, chunk c of 64 UW channels) of the CTA's BN rows into ring slot s
__device__ __forceinline__ void issue_unit(const ChainOp &op, int t, int c, int slot_i, saddr ring) {
    const int BN = op.cout / gridDim.x, n0 = blockIdx.x * BN;
    const saddr slot = ring + slot_i * SLOT;
    const u16 *src = op.w + ((size_t)n0 * 9 + t) * op.cin + c * 64 * UW;
    for (int i = threadIdx.x; i < BN * 8 * UW; i += NT) {
        const int n = i / (8 * UW), ch = i % (8 * UW);
        cpa16(slot + n * (128 * UW) + (((ch & ~7) | ((ch ^ n) & 7)) << 4), src + (size_t)n * 9 * op.cin + ch * 8);
    }
}

__device__ __forceinline__ void prefetch(const ChainOp *next, saddr ring, bool early = true) {
    if (next == nullptr || next->kind != 1 || early != (EARLY != 0)) return;
    const int CC = next->cin / (64 * UW);
    for (int u = 0; u < STAGES - 1; ++u) {
        issue_unit(*next, u / CC, u % CC, u, ring);
        cpa_commit();
    }
}

__device__ float2 merge_stats(const float2 *st, int n, float eps) {   // every load issued first
    constexpr int GMAX = 16;
    float2 v[GMAX];
#pragma unroll
    for (int i = 0; i < GMAX; ++i) v[i] = i < (int)gridDim.x ? ld_cg2f(st + i) : make_float2(0.0f, 0.0f);
    float s = 0.0f, ss = 0.0f;
#pragma unroll
    for (int i = 0; i < GMAX; ++i) {
        s += v[i].x;
        ss += v[i].y;
    }
    const float mean = s / n, var = fmaxf(ss / n - mean * mean, 0.0f);
    return make_float2(mean, rsqrtf(var + eps));
}

__device__ void write_stats(float2 *st, float s, float ss, float *red) {
    s = block_sum(s, red);
    ss = block_sum(ss, red);
    if (threadIdx.x == 0) st[blockIdx.x] = make_float2(s, ss);
}

// ---- the 3x3 conv: warps 4 (16 rows each) x 2 (BN / 2 columns each), NFW 8-column fragments a warp --
// GroupNorm folded (gn: W' = W gn_w on the host, A raw, the padded border holding the vector whose
// normalization is 0, rstd and the column term -mean rstd Q[n] + P[n] applied to the sums).
__device__ __forceinline__ void ldmatrix_x2(u32 r[2], saddr a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}

template <int NFW>
__device__ void conv3(const ChainOp &op, const ChainOp *next, unsigned char *sm, float *tab, float *red, int oi) {
    const int BN = op.cout / gridDim.x, n0 = blockIdx.x * BN, cin = op.cin, CC = cin / (64 * UW), pitch = cin * 2;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp & 3, wn = warp >> 2;
    const saddr ring = smem_u32(sm), A = ring + RING;
    prefetch(&op, ring, false);   // EARLY 0: this op's first stages only now
    const int cv = cin / 8, nv = PIX * cv;
    for (int i = threadIdx.x; i < nv; i += NT) {   // the raw map straight into the halo interior
        const int p = i / cv, ch = i - p * cv, hp = ((p >> 3) + 1) * HP + (p & 7) + 1;
        cpa16(A + hp * pitch + (((ch & ~7) | ((ch ^ hp) & 7)) << 4), op.in + (size_t)i * 8);
    }
    cpa_commit();
    const bool norm = op.gnr != nullptr;
    float mean = 0.0f, rstd = 1.0f;
    if (norm) {
        float r[2];
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            const int c = threadIdx.x + q * NT;
            r[q] = c < cin ? op.gnr[c] : 0.0f;
        }
        const float2 mr = merge_stats(op.st_in, PIX * cin, 1e-5f);
        mean = mr.x;
        rstd = mr.y;
        const float sd = 1.0f / rstd;
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            const int c = threadIdx.x + q * NT;
            if (c < cin) tab[c] = fmaf(-r[q], sd, mean);
        }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < 36 * cv; i += NT) {   // the border: the pad vector (0 without a norm)
        const int bp = i / cv, ch = i - bp * cv;
        const int hp = bp < 10 ? bp : bp < 20 ? 90 + (bp - 10) : bp < 28 ? (bp - 19) * 10 : (bp - 27) * 10 + 9;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (norm) {
            u16 *e = reinterpret_cast<u16 *>(&v);
#pragma unroll
            for (int j = 0; j < 8; ++j) e[j] = F16::from_f(tab[ch * 8 + j]);
        }
        *reinterpret_cast<uint4 *>(sm + RING + hp * pitch + (((ch & ~7) | ((ch ^ hp) & 7)) << 4)) = v;
    }
    const int m = wm * 16 + (lane & 15), hp0 = (m >> 3) * HP + (m & 7), hi = lane >> 4;
    const int bn_row = (lane & 7) + ((lane >> 4) << 3), bk = (lane >> 3) & 1, nw0 = wn * (BN / 2);
    float acc[NFW][4];
#pragma unroll
    for (int j = 0; j < NFW; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[j][q] = 0.0f;
    cpa_wait<0>();
    stamp(4 * oi + 1);
    int ti = (STAGES - 1) / CC, ci = (STAGES - 1) % CC, slot_c = 0, slot_i = STAGES - 1;
    for (int t = 0; t < 9; ++t) {
        const int hpt = hp0 + (t / 3) * HP + t % 3;
        const saddr abase = A + hpt * pitch;
        for (int c = 0; c < CC; ++c) {
            cpa_wait<STAGES - 2>();
            __syncthreads();
            if (ti < 9) {
                issue_unit(op, ti, ci, slot_i, ring);
                if (++ci == CC) { ci = 0; ++ti; }
            }
            cpa_commit();
            slot_i = slot_i + 1 == STAGES ? 0 : slot_i + 1;
            const saddr slot = ring + slot_c * SLOT;
            slot_c = slot_c + 1 == STAGES ? 0 : slot_c + 1;
#ifndef NO_LDM
#pragma unroll
            for (int w = 0; w < UW; ++w)
#pragma unroll
                for (int ks = 0; ks < 4; ++ks) {
                    u32 a[4];
                    ldmatrix_x4(a, abase + (c * UW + w) * 128 + (((ks * 2 + hi) ^ (hpt & 7)) << 4));
                    const int kc = w * 8 + ks * 2 + bk;
                    if constexpr (NFW == 1) {
                        const int n = nw0 + (lane & 7);
                        u32 b[2];
                        ldmatrix_x2(b, slot + n * (128 * UW) + (((kc & ~7) | ((kc ^ n) & 7)) << 4));
                        F16::mma(acc[0], a, b);
                    } else {
#pragma unroll
                        for (int j = 0; j < NFW; j += 2) {
                            const int n = nw0 + j * 8 + bn_row;
                            u32 b[4];
                            ldmatrix_x4(b, slot + n * (128 * UW) + (((kc & ~7) | ((kc ^ n) & 7)) << 4));
#ifndef NO_MMA
                            F16::mma(acc[j], a, b);
                            F16::mma(acc[j + 1], a, b + 2);
#else
                            acc[j][0] += __uint_as_float(a[0] ^ b[0]) * 1e-30f;
#endif
                        }
                    }
                }
#endif
        }
    }
    cpa_wait<0>();
    __syncthreads();   // ring and halo free
    stamp(4 * oi + 2);
    prefetch(next, ring);

    // epilogue from the accumulators: loads first
    float cb[NFW][2], cq[NFW][2];
    u32 rv[NFW][2];
    const int r0 = wm * 16 + (lane >> 2);
#pragma unroll
    for (int j = 0; j < NFW; ++j) {
        const int n = n0 + nw0 + j * 8 + 2 * (lane & 3);
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            cb[j][q] = op.bias[n + q] + (norm ? op.gnp[n + q] : 0.0f);
            cq[j][q] = norm ? -mean * rstd * op.gnq[n + q] : 0.0f;
        }
#pragma unroll
        for (int h = 0; h < 2; ++h)
            rv[j][h] = op.res ? ld_cg32(op.res + (size_t)(r0 + 8 * h) * op.cout + n) : 0u;
    }
    float s = 0.0f, ss = 0.0f;
#pragma unroll
    for (int j = 0; j < NFW; ++j) {
        const int n = n0 + nw0 + j * 8 + 2 * (lane & 3);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            u16 o[2];
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                float x = fmaf(acc[j][2 * h + q], rstd, cq[j][q] + cb[j][q]);
                if (op.gelu) x = gelu_f(x);
                if (op.res) x += F16::to_f((u16)(rv[j][h] >> (16 * q)));
                o[q] = F16::from_f(x);
                const float r = F16::to_f(o[q]);
                s += r;
                ss += r * r;
            }
            *reinterpret_cast<u32 *>(op.out + (size_t)(r0 + 8 * h) * op.cout + n) = (u32)o[0] | ((u32)o[1] << 16);
        }
    }
    if (op.st_out) write_stats(op.st_out, s, ss, red);
}

// ---- the depthwise 7x7 conv: CC = C / G channels per CTA, FFMA from an fp32 halo ----------------
__device__ void dwconv(const ChainOp &op, const ChainOp *next, unsigned char *sm, float *red) {
    prefetch(next, smem_u32(sm));   // the ring is idle here
    const int C = op.cin, CC = C / gridDim.x, c0 = blockIdx.x * CC;
    float *halo = reinterpret_cast<float *>(sm + RING);   // [14][14][CC]
    float *wsm = halo + 196 * CC;                          // [49][CC]
    const float bias_tb = op.bias[c0 + threadIdx.x % CC] + op.tb[c0 + threadIdx.x % CC];
    constexpr int WV = 49 * 32 / NT + 1, XV = PIX * 32 / NT;   // loads per thread at CC <= 32
    float wr[WV];
    u16 xr[XV];
#pragma unroll
    for (int k = 0; k < WV; ++k) {   // every load first
        const int i = threadIdx.x + k * NT;
        wr[k] = i < 49 * CC ? op.wdw[(i / CC) * C + c0 + i % CC] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < XV; ++k) {
        const int i = threadIdx.x + k * NT, p = i / CC, cc = i - p * CC;
        xr[k] = i < PIX * CC ? ld_cg16(op.in + (size_t)p * C + c0 + cc) : (u16)0;
    }
    for (int i = threadIdx.x; i < 196 * CC; i += NT) halo[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < WV; ++k) {
        const int i = threadIdx.x + k * NT;
        if (i < 49 * CC) wsm[i] = wr[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < XV; ++k) {
        const int i = threadIdx.x + k * NT, p = i / CC, cc = i - p * CC;
        if (i < PIX * CC) halo[(((p >> 3) + 3) * 14 + (p & 7) + 3) * CC + cc] = F16::to_f(xr[k]);
    }
    __syncthreads();
    const int OPT = PIX * CC / NT, cc = threadIdx.x % CC, rest = threadIdx.x / CC;
    const int y = rest & 7, x0 = (rest >> 3) * OPT;
    float acc[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] = 0.0f;
    for (int ky = 0; ky < 7; ++ky) {
        float row[14];
#pragma unroll
        for (int j = 0; j < 14; ++j) row[j] = (j < OPT + 6) ? halo[((y + ky) * 14 + x0 + j) * CC + cc] : 0.0f;
#pragma unroll
        for (int kx = 0; kx < 7; ++kx) {
            const float w = wsm[(ky * 7 + kx) * CC + cc];
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[j] = fmaf(w, row[j + kx], acc[j]);
        }
    }
    const float add = bias_tb;
    float s = 0.0f, ss = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        if (j >= OPT) break;
        const u16 h = F16::from_f(acc[j] + add);
        op.out[(size_t)(y * 8 + x0 + j) * C + c0 + cc] = h;
        const float r = F16::to_f(h);
        s += r;
        ss += r * r;
    }
    write_stats(op.st_out, s, ss, red);
}


extern "C" __global__ void __launch_bounds__(NT, 1) chain(const ChainOp *ops, int nops, unsigned *bar, long long *stamps) {
    extern __shared__ __align__(128) unsigned char sm[];
    __shared__ float tab[512];
    __shared__ float red[33];
    __shared__ ChainOp sops[16];
    if (threadIdx.x == 0 && blockIdx.x == 0) g_stamp = stamps;
    for (int i = threadIdx.x; i < nops * (int)(sizeof(ChainOp) / 8); i += NT)
        reinterpret_cast<unsigned long long *>(sops)[i] = reinterpret_cast<const unsigned long long *>(ops)[i];
    __syncthreads();
    if (nops > 0) prefetch(&sops[0], smem_u32(sm));
    for (int i = 0; i < nops; ++i) {
        const ChainOp &op = sops[i];
        const ChainOp *next = i + 1 < nops ? &sops[i + 1] : nullptr;
        stamp(4 * i);
        if (op.kind == 0) {
            dwconv(op, next, sm, red);
        } else {
            const int nfw = op.cout / gridDim.x / 16;
            if (nfw == 4) conv3<4>(op, next, sm, tab, red, i);
            else if (nfw == 2) conv3<2>(op, next, sm, tab, red, i);
            else conv3<1>(op, next, sm, tab, red, i);
        }
        stamp(4 * i + 3);
        if (i + 1 < nops) grid_barrier(bar, i);
    }
}

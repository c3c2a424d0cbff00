// chain.cu (lab prototype, v3): a run of 8x8-level ops of one sample as ONE persistent kernel.
// G CTAs (one per SM) of two warp groups (4 warps each) walk a table of ops; a grid barrier (one
// atomic counter, zeroed before the launch) separates ops. A 3x3 conv is split by output channels
// (BN = Cout / G per CTA), the whole K in each CTA, its raw 10x10 input map whole in smem (cp.async;
// GroupNorm folded: W' = W gn_w, the border holds the pad vector, rstd and -mean rstd Q[n] + P[n] on
// the sums). The two groups take alternate 128-channel k-chunks; each streams its chunks, packed on
// the host in slot order ([kchunk][BN rows][128 channels], 16-byte pieces swizzled by row), through
// its own cp.async ring (named barrier per group), and issues its next op's first slots as soon as
// its k loop is done. Each warp holds the whole 64 x BN tile and takes every 4th k16 step of its
// group's chunks; the 8 partial tiles meet in the map's smem. A depthwise conv whose input is a 3x3
// conv's output runs in that conv's epilogue (the CTA holds all 64 pixels of its BN channels): no
// barrier, no reload. GroupNorm partials travel per warp as (sum, sum of squares). fp16, batch 1,
// 8x8 maps only. Knockout: NO_LDM (no ldmatrix or mma in the k loop).
#include "common.cuh"

#ifndef SLOT
#define SLOT 16384
#endif
#ifndef STAGES
#define STAGES 3
#endif
constexpr int NT = 256, GT = 128, PIX = 64, HP = 10, NW = NT / 32;
constexpr int RING = STAGES * SLOT;   // per group
constexpr int MAP = 2 * RING;         // the map region's offset

struct ChainOp {
    int kind, cin, cout, gelu;   // kind 0: depthwise 7x7 (+ bias + time bias), 1: 3x3 conv
    const u16 *in;
    u16 *out;
    const u16 *w;                // 3x3: packed, per CTA: group 0's k-chunks, then group 1's ([BN][128] each)
    const float *wdw;            // depthwise: [49][C] fp32
    const float *bias, *tb;
    const float2 *st_in;         // per-warp partials of the input (3x3 with GroupNorm)
    float2 *st_out;              // per-warp partials of the output
    const u16 *res;              // residual added to the output (3x3)
    const float *gnr, *gnq, *gnp;   // folded GroupNorm: r = gn_b / gn_w per input channel, Q[n], P[n]
    const float *dw_w, *dw_bias, *dw_tb;   // a depthwise conv fused after the 3x3 (dw_out != null)
    u16 *dw_out;
    float2 *dw_st;
};

__device__ long long *g_stamp;
__device__ __forceinline__ void stamp(int k) {
    if (g_stamp != nullptr && blockIdx.x == 0 && threadIdx.x == 0) g_stamp[k] = clock64();
}
__device__ __forceinline__ void cpa16(saddr s, const void *g) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(g));
}
__device__ __forceinline__ void cpa_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cpa_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void group_sync(int g) { asm volatile("bar.sync %0, %1;" ::"r"(1 + g), "n"(GT) : "memory"); }
__device__ __forceinline__ float2 ld_cg2f(const void *p) {
    float2 r;
    asm volatile("ld.global.cg.v2.f32 {%0,%1}, [%2];" : "=f"(r.x), "=f"(r.y) : "l"(p));
    return r;
}
__device__ __forceinline__ uint4 ld_cg4(const void *p) {
    uint4 r;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
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

struct Geo {   // a 3x3 op's weight stream for group g
    int BN, CC, NK, NKg, goff, KPU, NU;
    __device__ Geo(const ChainOp &op, int g) {
        BN = op.cout / gridDim.x;
        CC = op.cin / 128;
        NK = 9 * CC;
        NKg = (NK - g + 1) / 2;
        goff = g ? (NK + 1) / 2 : 0;
        KPU = SLOT / (BN * 256);
        if (KPU > NKg) KPU = NKg;
        NU = (NKg + KPU - 1) / KPU;
    }
};

__device__ __forceinline__ void issue_unit(const ChainOp &op, const Geo &q, int u, saddr slot) {
    const int k0 = u * q.KPU, nk = min(q.KPU, q.NKg - k0);
    const u16 *src = op.w + ((size_t)blockIdx.x * q.NK + q.goff + k0) * q.BN * 128;
    const int pieces = nk * q.BN * 16, gt = threadIdx.x & (GT - 1);
    for (int i = gt; i < pieces; i += GT) cpa16(slot + i * 16, src + (size_t)i * 8);
}

// the first STAGES - 1 slots of the next op, into this thread's group's ring
__device__ __forceinline__ void prefetch(const ChainOp *next, unsigned char *sm) {
    const int g = threadIdx.x / GT;
    if (next == nullptr || next->kind != 1) return;
    const Geo q(*next, g);
    const saddr ring = smem_u32(sm) + g * RING;
    for (int u = 0; u < STAGES - 1; ++u) {
        if (u < q.NU) issue_unit(*next, q, u, ring + u * SLOT);
        cpa_commit();
    }
}

// (mean, rstd) from the per-warp partials; every warp merges them all
__device__ float2 merge_stats(const float2 *st, int n, float eps) {
    const int lane = threadIdx.x & 31, np = gridDim.x * NW;
    float s = 0.0f, ss = 0.0f;
    for (int i = lane; i < np; i += 32) {
        const float2 v = ld_cg2f(st + i);
        s += v.x;
        ss += v.y;
    }
    s = warp_sum(s);
    ss = warp_sum(ss);
    const float mean = s / n, var = fmaxf(ss / n - mean * mean, 0.0f);
    return make_float2(mean, rsqrtf(var + eps));
}

__device__ __forceinline__ void write_stats(float2 *st, float s, float ss) {
    s = warp_sum(s);
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) st[blockIdx.x * NW + (threadIdx.x >> 5)] = make_float2(s, ss);
}

// the depthwise 7x7 of CC channels (c0 ..) over the fp32 halo [14][14][CC] in smem, weights [49][CC]
// in smem; writes the output and its per-warp partials
__device__ void dw_from_halo(const float *halo, const float *wsm, int C, int CC, int c0, float bias_tb,
                             u16 *out, float2 *st) {
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
            const float wk = wsm[(ky * 7 + kx) * CC + cc];
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[j] = fmaf(wk, row[j + kx], acc[j]);
        }
    }
    float s = 0.0f, ss = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        if (j >= OPT) break;
        const u16 h = F16::from_f(acc[j] + bias_tb);
        out[(size_t)(y * 8 + x0 + j) * C + c0 + cc] = h;
        const float r = F16::to_f(h);
        s += r;
        ss += r * r;
    }
    write_stats(st, s, ss);
}

template <int NFW>
__device__ void conv3(const ChainOp &op, const ChainOp *next, unsigned char *sm, float *tab, int oi) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = warp >> 2, w = warp & 3;
    const Geo q(op, g);
    constexpr int BN = NFW * 8;
    const int n0 = blockIdx.x * BN, cin = op.cin, pitch = cin * 2;
    const saddr ring = smem_u32(sm) + g * RING, A = smem_u32(sm) + MAP;
    const int cv = cin / 8, nv = PIX * cv;
    const bool norm = op.gnr != nullptr;
    float mean = 0.0f, rstd = 1.0f, r[2];
    float2 mr = make_float2(0.0f, 1.0f);
    if (norm) {   // the statistics and the GroupNorm's ratios first: the map's copies queue behind them
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int c = threadIdx.x + k * NT;
            r[k] = c < cin ? op.gnr[c] : 0.0f;
        }
        mr = merge_stats(op.st_in, PIX * cin, 1e-5f);
    }
#ifdef MAP_LD
    uint4 mv[16];   // the raw map through registers (cin <= 512: at most 16 pieces a thread)
#pragma unroll
    for (int k = 0; k < 16; ++k) {
        const int i = threadIdx.x + k * NT;
        if (i < nv) mv[k] = ld_cg4(op.in + (size_t)i * 8);
    }
#else
    for (int i = threadIdx.x; i < nv; i += NT) {   // the raw map straight into the halo interior
        const int p = i / cv, ch = i - p * cv, hp = ((p >> 3) + 1) * HP + (p & 7) + 1;
        cpa16(A + hp * pitch + (((ch & ~7) | ((ch ^ hp) & 7)) << 4), op.in + (size_t)i * 8);
    }
    cpa_commit();
#endif
    stamp(6 * oi + 1);
    if (norm) {
        mean = mr.x;
        rstd = mr.y;
        const float sd = 1.0f / rstd;
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int c = threadIdx.x + k * NT;
            if (c < cin) tab[c] = fmaf(-r[k], sd, mean);
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
        *reinterpret_cast<uint4 *>(sm + MAP + hp * pitch + (((ch & ~7) | ((ch ^ hp) & 7)) << 4)) = v;
    }
    stamp(6 * oi + 2);
#ifdef MAP_LD
#pragma unroll
    for (int k = 0; k < 16; ++k) {
        const int i = threadIdx.x + k * NT;
        if (i < nv) {
            const int p = i / cv, ch = i - p * cv, hp = ((p >> 3) + 1) * HP + (p & 7) + 1;
            *reinterpret_cast<uint4 *>(sm + MAP + hp * pitch + (((ch & ~7) | ((ch ^ hp) & 7)) << 4)) = mv[k];
        }
    }
#endif
    cpa_wait<0>();
    __syncthreads();
    stamp(6 * oi + 3);
    const int hi = lane >> 4, bk = (lane >> 3) & 1, bn_row = (lane & 7) + ((lane >> 4) << 3);
    int hp0[4];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
        const int m = mt * 16 + (lane & 15);
        hp0[mt] = (m >> 3) * HP + (m & 7);
    }
    float acc[4][NFW][4];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int j = 0; j < NFW; ++j)
#pragma unroll
            for (int k = 0; k < 4; ++k) acc[mt][j][k] = 0.0f;
    int slot_c = 0, slot_i = STAGES - 1;
    for (int u = 0; u < q.NU; ++u) {
        cpa_wait<STAGES - 2>();
        group_sync(g);
        if (u + STAGES - 1 < q.NU) issue_unit(op, q, u + STAGES - 1, ring + slot_i * SLOT);
        cpa_commit();
        slot_i = slot_i + 1 == STAGES ? 0 : slot_i + 1;
        const saddr slot = ring + slot_c * SLOT;
        slot_c = slot_c + 1 == STAGES ? 0 : slot_c + 1;
#ifndef NO_LDM
        const int k0 = u * q.KPU, nk = min(q.KPU, q.NKg - k0);
        for (int kk = 0; kk < nk; ++kk) {
            const int kc = g + 2 * (k0 + kk), t = kc / q.CC, c = kc - t * q.CC;
            const int toff = (t / 3) * HP + t % 3;
            const saddr bslot = slot + kk * BN * 256;
#pragma unroll
            for (int s = 0; s < 2; ++s) {
                const int ks = w + 4 * s;
                u32 a[4][4];
#pragma unroll
                for (int mt = 0; mt < 4; ++mt) {
                    const int hpt = hp0[mt] + toff;
                    ldmatrix_x4(a[mt], A + hpt * pitch + c * 256 + (((ks * 2 + hi) ^ (hpt & 7)) << 4));
                }
                const int kq = ks * 2 + bk;
#pragma unroll
                for (int j = 0; j < NFW; j += 2) {
                    const int n = j * 8 + bn_row;
                    u32 b[4];
                    ldmatrix_x4(b, bslot + n * 256 + (((kq & ~7) | ((kq ^ n) & 7)) << 4));
#pragma unroll
                    for (int mt = 0; mt < 4; ++mt) {
                        F16::mma(acc[mt][j], a[mt], b);
                        F16::mma(acc[mt][j + 1], a[mt], b + 2);
                    }
                }
            }
        }
#endif
    }
    cpa_wait<0>();
    group_sync(g);    // this group's ring is free: the next op's first slots go in now
    prefetch(next, sm);
    stamp(6 * oi + 4);

    // the epilogue's loads, under the partial tiles' exchange. Warp W ends with rows (W >> 1) * 16 ..
    // + 16, fragments JH * NFW / 2 .. of the tile.
    constexpr int NJ = NFW / 2;
    const int mt_o = warp >> 1, j0 = (warp & 1) * NJ, r0 = mt_o * 16 + (lane >> 2);
    float cb[NJ][2], cq[NJ][2];
    u32 rv[NJ][2];
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj) {
        const int n = n0 + (j0 + jj) * 8 + 2 * (lane & 3);
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            cb[jj][k] = op.bias[n + k] + (norm ? op.gnp[n + k] : 0.0f);
            cq[jj][k] = norm ? -mean * rstd * op.gnq[n + k] : 0.0f;
        }
#pragma unroll
        for (int h = 0; h < 2; ++h)
            rv[jj][h] = op.res ? ld_cg32(op.res + (size_t)(r0 + 8 * h) * op.cout + n) : 0u;
    }
    const bool dw = BN <= 32 && op.dw_out != nullptr;
    constexpr int DWV = BN <= 32 ? 49 * BN / NT + 1 : 1;
    float dwr[DWV];
    float dw_btb = 0.0f;
    if (BN <= 32 && dw) {
        const int C = op.cout;
#pragma unroll
        for (int k = 0; k < DWV; ++k) {
            const int i = threadIdx.x + k * NT;
            dwr[k] = i < 49 * BN ? op.dw_w[(i / BN) * C + n0 + i % BN] : 0.0f;
        }
        dw_btb = op.dw_bias[n0 + threadIdx.x % BN] + op.dw_tb[n0 + threadIdx.x % BN];
    }

    // the 8 partial tiles: group 1's into the map region, added by group 0, whose 4 sums meet there
    float4 *part = reinterpret_cast<float4 *>(sm + MAP);
    __syncthreads();   // both groups are done with the map
    if (g == 1) {
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
            for (int j = 0; j < NFW; ++j)
                part[((w * 4 + mt) * NFW + j) * 32 + lane] = make_float4(acc[mt][j][0], acc[mt][j][1], acc[mt][j][2], acc[mt][j][3]);
    }
    __syncthreads();
    if (g == 0) {
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
            for (int j = 0; j < NFW; ++j) {
                const float4 x = part[((w * 4 + mt) * NFW + j) * 32 + lane];
                acc[mt][j][0] += x.x; acc[mt][j][1] += x.y; acc[mt][j][2] += x.z; acc[mt][j][3] += x.w;
            }
    }
    __syncthreads();
    if (g == 0) {
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
            for (int j = 0; j < NFW; ++j)
                part[((w * 4 + mt) * NFW + j) * 32 + lane] = make_float4(acc[mt][j][0], acc[mt][j][1], acc[mt][j][2], acc[mt][j][3]);
    }
    __syncthreads();
    float tile[NJ][4];
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj) {
        float4 v = part[((0 * 4 + mt_o) * NFW + j0 + jj) * 32 + lane];
#pragma unroll
        for (int o = 1; o < 4; ++o) {
            const float4 x = part[((o * 4 + mt_o) * NFW + j0 + jj) * 32 + lane];
            v.x += x.x; v.y += x.y; v.z += x.z; v.w += x.w;
        }
        tile[jj][0] = v.x; tile[jj][1] = v.y; tile[jj][2] = v.z; tile[jj][3] = v.w;
    }

    float s = 0.0f, ss = 0.0f;
    float keep[NJ][4];
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj) {
        const int n = n0 + (j0 + jj) * 8 + 2 * (lane & 3);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            u16 o[2];
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                float x = fmaf(tile[jj][2 * h + k], rstd, cq[jj][k] + cb[jj][k]);
                if (op.gelu) x = gelu_f(x);
                if (op.res) x += F16::to_f((u16)(rv[jj][h] >> (16 * k)));
                o[k] = F16::from_f(x);
                const float r = F16::to_f(o[k]);
                keep[jj][2 * h + k] = r;
                s += r;
                ss += r * r;
            }
            *reinterpret_cast<u32 *>(op.out + (size_t)(r0 + 8 * h) * op.cout + n) = (u32)o[0] | ((u32)o[1] << 16);
        }
    }
    if (op.st_out) write_stats(op.st_out, s, ss);
    if constexpr (BN > 32) return;
    if (!dw) return;
    // the fused depthwise conv: this CTA's BN channels of all 64 pixels, already in registers
    float *halo = reinterpret_cast<float *>(sm + MAP);   // [14][14][BN]
    float *wsm = halo + 196 * BN;                         // [49][BN]
    __syncthreads();   // the partial tiles are read
    for (int i = threadIdx.x; i < 196 * BN; i += NT) halo[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < DWV; ++k) {
        const int i = threadIdx.x + k * NT;
        if (i < 49 * BN) wsm[i] = dwr[k];
    }
    __syncthreads();
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                const int p = r0 + 8 * h, nl = (j0 + jj) * 8 + 2 * (lane & 3) + k;
                halo[(((p >> 3) + 3) * 14 + (p & 7) + 3) * BN + nl] = keep[jj][2 * h + k];
            }
    __syncthreads();
    dw_from_halo(halo, wsm, op.cout, BN, n0, dw_btb, op.dw_out, op.dw_st);
}

// ---- the depthwise 7x7 conv alone: CC = C / G channels per CTA, FFMA from an fp32 halo ---------
__device__ void dwconv(const ChainOp &op, const ChainOp *next, unsigned char *sm) {
    prefetch(next, sm);   // the rings are idle here
    const int C = op.cin, CC = C / gridDim.x, c0 = blockIdx.x * CC;
    float *halo = reinterpret_cast<float *>(sm + MAP);   // [14][14][CC]
    float *wsm = halo + 196 * CC;                         // [49][CC]
    const float bias_tb = op.bias[c0 + threadIdx.x % CC] + op.tb[c0 + threadIdx.x % CC];
    constexpr int WV = 49 * 32 / NT + 1, XV = PIX * 32 / NT;   // loads per thread at CC <= 32
    float wr[WV];
    u16 xr[XV];
#pragma unroll
    for (int k = 0; k < WV; ++k) {
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
    dw_from_halo(halo, wsm, C, CC, c0, bias_tb, op.out, op.st_out);
}

extern "C" __global__ void __launch_bounds__(NT, 1) chain(const ChainOp *ops, int nops, unsigned *bar, long long *stamps) {
    extern __shared__ __align__(128) unsigned char sm[];
    __shared__ float tab[512];
    __shared__ ChainOp sops[16];
    if (threadIdx.x == 0 && blockIdx.x == 0) g_stamp = stamps;
    for (int i = threadIdx.x; i < nops * (int)(sizeof(ChainOp) / 8); i += NT)
        reinterpret_cast<unsigned long long *>(sops)[i] = reinterpret_cast<const unsigned long long *>(ops)[i];
    __syncthreads();
    if (nops > 0) prefetch(&sops[0], sm);
    for (int i = 0; i < nops; ++i) {
        const ChainOp &op = sops[i];
        const ChainOp *next = i + 1 < nops ? &sops[i + 1] : nullptr;
        stamp(6 * i);
        if (op.kind == 0) {
            dwconv(op, next, sm);
        } else {
            const int bn = op.cout / gridDim.x;
            if (bn == 64) conv3<8>(op, next, sm, tab, i);
            else if (bn == 32) conv3<4>(op, next, sm, tab, i);
            else conv3<2>(op, next, sm, tab, i);
        }
        stamp(6 * i + 5);
        if (i + 1 < nops) grid_barrier(bar, i);
    }
}

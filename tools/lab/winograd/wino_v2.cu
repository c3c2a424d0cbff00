// Prototype: 3x3 stride-1 conv as Winograd F(2x2, 3x3) on mma.sync (fp16 in, fp32 accumulate).
// NHWC fp16 x (B, H, W, Cin), U packed on the host (G w G^T per (cout, cin), B fragment order),
// y = gelu(conv + bias) fp16. CTA: 2 tile rows x TC tile cols (BT = 2 TC tiles of 2x2 outputs) x BN
// couts; 8 warps, warp w owns Winograd positions 2w, 2w+1 for all BT tiles and BN couts.
typedef unsigned short u16;
typedef unsigned int u32;

__device__ __forceinline__ float h2f(u16 v) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v)); return f; }
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
__device__ __forceinline__ void cp16(void* smem, const void* g, bool valid) {
    u32 s = (u32)__cvta_generic_to_shared(smem);
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(s), "l"(g), "r"(n));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void wait_group() { asm volatile("cp.async.wait_group %0;" :: "n"(N)); }
__device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ u32 hadd2(u32 a, u32 b) { u32 d; asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d; }
__device__ __forceinline__ u32 hsub2(u32 a, u32 b) { u32 d; asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d; }
__device__ __forceinline__ float gelu_f(float v) { return 0.5f * v * (1.0f + erff(v * 0.70710678118654752440f)); }

template <int TC, int BN, int S, int MODE>
__device__ __forceinline__ void wino(const u16* __restrict__ x, const uint4* __restrict__ U,
                                     const float* __restrict__ bias, u16* __restrict__ y,
                                     int H, int W, int Cin, int Cout) {
    constexpr int BT = 2 * TC, MB = BT / 16, NB = BN / 8, HC = 2 * TC + 2;
    constexpr int HALO_B = 6 * HC * 32, U_B = 16 * (NB / 2) * 32 * 16, V_B = 16 * MB * 32 * 16;
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char* halo = smem;                       // S x HALO_B
    unsigned char* ubuf = smem + S * HALO_B;          // S x U_B
    uint4* V = (uint4*)(smem + S * (HALO_B + U_B));   // V_B
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int W2 = W / 2, tcb_n = W2 / TC, trb_n = H / 4;
    int blk = blockIdx.x;
    const int tcb = blk % tcb_n; blk /= tcb_n;
    const int trb = blk % trb_n; const int b = blk / trb_n;
    const int oy0 = trb * 4, ox0 = tcb * 2 * TC, nblk = blockIdx.y;
    const int nk = Cin / 16;
    const uint4* Ub = U + (size_t)nblk * nk * (U_B / 16);

    auto load = [&](int kc, int stage) {
        unsigned char* hs = halo + stage * HALO_B;
        for (int v = tid; v < 6 * HC * 2; v += 256) {
            int r = v / (HC * 2), rem = v % (HC * 2), c = rem >> 1, h = rem & 1;
            int gy = oy0 - 1 + r, gx = ox0 - 1 + c;
            bool ok = gy >= 0 && gy < H && gx >= 0 && gx < W;
            const u16* src = ok ? x + ((size_t)(b * H + gy) * W + gx) * Cin + kc * 16 + h * 8 : x;
            cp16(hs + (r * HC + c) * 32 + h * 16, src, ok);
        }
        const uint4* us = Ub + (size_t)kc * (U_B / 16);
        uint4* ud = (uint4*)(ubuf + stage * U_B);
        for (int v = tid; v < U_B / 16; v += 256) cp16(ud + v, us + v, true);
    };

    float acc[2][MB][NB][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int m = 0; m < MB; ++m)
#pragma unroll
            for (int n = 0; n < NB; ++n)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][m][n][j] = 0.f;

#pragma unroll
    for (int s = 0; s < S - 1; ++s) { if (s < nk) load(s, s); commit(); }

    for (int k = 0; k < nk; ++k) {
        wait_group<S - 2>();
        __syncthreads();
        if (k + S - 1 < nk) load(k + S - 1, (k + S - 1) % S);
        commit();
        // input transform of chunk k: thread = (tile t, channel pair cp)
        if (MODE < 2 && tid < BT * 8) {
            const int t = tid >> 3, cp = tid & 7, tr = t / TC, tc = t % TC;
            const u32* hs = (const u32*)(halo + (k % S) * HALO_B);
            u32 d[4][4];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) d[i][j] = hs[((2 * tr + i) * HC + 2 * tc + j) * 8 + cp];
            u32 tm[4][4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                tm[0][j] = hsub2(d[0][j], d[2][j]);
                tm[1][j] = hadd2(d[1][j], d[2][j]);
                tm[2][j] = hsub2(d[2][j], d[1][j]);
                tm[3][j] = hsub2(d[1][j], d[3][j]);
            }
            const int r = t & 15, mb = t >> 4;
            const int ln = 4 * (r & 7) + (cp & 3), reg = (r >> 3) + 2 * (cp >> 2);
            u32* Vw = (u32*)V;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                Vw[(((i * 4 + 0) * MB + mb) * 32 + ln) * 4 + reg] = hsub2(tm[i][0], tm[i][2]);
                Vw[(((i * 4 + 1) * MB + mb) * 32 + ln) * 4 + reg] = hadd2(tm[i][1], tm[i][2]);
                Vw[(((i * 4 + 2) * MB + mb) * 32 + ln) * 4 + reg] = hsub2(tm[i][2], tm[i][1]);
                Vw[(((i * 4 + 3) * MB + mb) * 32 + ln) * 4 + reg] = hsub2(tm[i][1], tm[i][3]);
            }
        }
        __syncthreads();
        const uint4* us = (const uint4*)(ubuf + (k % S) * U_B);
#pragma unroll
        for (int pp = 0; pp < 2; ++pp) {
            const int p = 2 * warp + pp;
            uint4 a[MB];
#pragma unroll
            for (int m = 0; m < MB; ++m) a[m] = V[(p * MB + m) * 32 + lane];
#pragma unroll
            for (int nb = 0; nb < NB / 2; ++nb) {
                uint4 bf = us[(p * (NB / 2) + nb) * 32 + lane];
#pragma unroll
                for (int m = 0; m < MB; ++m) {
                    mma16816(acc[pp][m][2 * nb], (const u32*)&a[m], bf.x, bf.y);
                    mma16816(acc[pp][m][2 * nb + 1], (const u32*)&a[m], bf.z, bf.w);
                }
            }
        }
    }
    if (MODE >= 1) {   // knockout: no epilogue; keep the accumulators alive
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int m = 0; m < MB; ++m)
#pragma unroll
                for (int n = 0; n < NB; ++n) sum += acc[i][m][n][0] + acc[i][m][n][3];
        if (sum == 12345.f) y[tid] = 1;
        return;
    }
    // epilogue: accumulators -> smem M[p][t][n] (fp32) -> output transform, bias, GELU, fp16 stores
    wait_group<0>();
    __syncthreads();
    float* M = (float*)smem;
    {
        const int g = lane >> 2, q = lane & 3;
#pragma unroll
        for (int pp = 0; pp < 2; ++pp) {
            const int p = 2 * warp + pp;
#pragma unroll
            for (int m = 0; m < MB; ++m)
#pragma unroll
                for (int n = 0; n < NB; ++n) {
                    const int t0 = m * 16 + g, c0 = n * 8 + 2 * q;
                    *(float2*)&M[(p * BT + t0) * BN + c0] = make_float2(acc[pp][m][n][0], acc[pp][m][n][1]);
                    *(float2*)&M[(p * BT + t0 + 8) * BN + c0] = make_float2(acc[pp][m][n][2], acc[pp][m][n][3]);
                }
        }
    }
    __syncthreads();
    for (int item = tid; item < BT * BN / 2; item += 256) {
        const int t = item / (BN / 2), c = (item % (BN / 2)) * 2, tr = t / TC, tc = t % TC;
        float2 m[16];
#pragma unroll
        for (int p = 0; p < 16; ++p) m[p] = *(const float2*)&M[(p * BT + t) * BN + c];
        float2 s0[4], s1[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            s0[j] = make_float2(m[j].x + m[4 + j].x + m[8 + j].x, m[j].y + m[4 + j].y + m[8 + j].y);
            s1[j] = make_float2(m[4 + j].x - m[8 + j].x - m[12 + j].x, m[4 + j].y - m[8 + j].y - m[12 + j].y);
        }
        const int cg = nblk * BN + c;
        const float b0 = bias[cg], b1 = bias[cg + 1];
        float2 o[2][2];
        o[0][0] = make_float2(s0[0].x + s0[1].x + s0[2].x, s0[0].y + s0[1].y + s0[2].y);
        o[0][1] = make_float2(s0[1].x - s0[2].x - s0[3].x, s0[1].y - s0[2].y - s0[3].y);
        o[1][0] = make_float2(s1[0].x + s1[1].x + s1[2].x, s1[0].y + s1[1].y + s1[2].y);
        o[1][1] = make_float2(s1[1].x - s1[2].x - s1[3].x, s1[1].y - s1[2].y - s1[3].y);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int oy = oy0 + 2 * tr + i, ox = ox0 + 2 * tc + j;
                u32 v = pack2(gelu_f(o[i][j].x + b0), gelu_f(o[i][j].y + b1));
                *(u32*)&y[((size_t)(b * H + oy) * W + ox) * Cout + cg] = v;
            }
    }
}

#define INST(TC, BN, S, MODE)                                                                            \
    extern "C" __global__ void __launch_bounds__(256) wino_##TC##_##BN##_##S##_##MODE(                   \
        const u16* x, const uint4* U, const float* bias, u16* y, int H, int W, int Cin, int Cout) {    \
        wino<TC, BN, S, MODE>(x, U, bias, y, H, W, Cin, Cout);                                           \
    }
INST(16, 32, 3, 0)
INST(8, 32, 3, 0)
INST(16, 32, 2, 0)
INST(8, 32, 2, 0)
INST(16, 32, 2, 1)
INST(8, 32, 2, 1)
INST(16, 32, 2, 2)
INST(8, 32, 2, 2)

// Prototype v3: 3x3 stride-1 conv as Winograd F(2x2, 3x3) on mma.sync (fp16 in, fp32 accumulate).
// CTA = 16 warps, warp p owns Winograd position p for all BT = 64 tiles (2x2 outputs each) x BN = 32
// couts (64 accumulators a thread); the input transform in f16x2, one (tile, channel pair) a thread;
// the output transform through a padded fp32 exchange in two rounds of 8 positions.
typedef unsigned short u16;
typedef unsigned int u32;

__device__ __forceinline__ float h2f(u16 v) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v)); return f; }
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
__device__ __forceinline__ u32 hadd2(u32 a, u32 b) { u32 d; asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d; }
__device__ __forceinline__ u32 hsub2(u32 a, u32 b) { u32 d; asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d; }
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
__device__ __forceinline__ float gelu_f(float v) { return 0.5f * v * (1.0f + erff(v * 0.70710678118654752440f)); }

template <int TR, int TC, int S, int MODE>
__device__ __forceinline__ void wino3(const u16* __restrict__ x, const uint4* __restrict__ U,
                                      const float* __restrict__ bias, u16* __restrict__ y,
                                      int H, int W, int Cin, int Cout) {
    constexpr int BN = 32, BT = TR * TC, MB = BT / 16, NB = BN / 8, HR = 2 * TR + 2, HC = 2 * TC + 2;
    constexpr int HALO_B = HR * HC * 32, U_B = 16 * (NB / 2) * 32 * 16, SP = BN + 8;
    static_assert(BT == 64, "64 tiles a CTA");
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char* halo = smem;
    unsigned char* ubuf = smem + S * HALO_B;
    uint4* V = (uint4*)(smem + S * (HALO_B + U_B));
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int tcb_n = W / 2 / TC, trb_n = H / 2 / TR;
    int blk = blockIdx.x;
    const int tcb = blk % tcb_n; blk /= tcb_n;
    const int trb = blk % trb_n; const int b = blk / trb_n;
    const int oy0 = trb * 2 * TR, ox0 = tcb * 2 * TC, nblk = blockIdx.y;
    const int nk = Cin / 16;
    const uint4* Ub = U + (size_t)nblk * nk * (U_B / 16);

    auto load = [&](int kc, int stage) {
        unsigned char* hs = halo + stage * HALO_B;
        for (int v = tid; v < HR * HC * 2; v += 512) {
            int r = v / (HC * 2), rem = v - r * (HC * 2), c = rem >> 1, h = rem & 1;
            int gy = oy0 - 1 + r, gx = ox0 - 1 + c;
            bool ok = gy >= 0 && gy < H && gx >= 0 && gx < W;
            const u16* src = ok ? x + ((size_t)(b * H + gy) * W + gx) * Cin + kc * 16 + h * 8 : x;
            cp16(hs + (r * HC + c) * 32 + h * 16, src, ok);
        }
        const uint4* us = Ub + (size_t)kc * (U_B / 16);
        uint4* ud = (uint4*)(ubuf + stage * U_B);
#pragma unroll
        for (int v = tid; v < U_B / 16; v += 512) cp16(ud + v, us + v, true);
    };

    float acc[MB][NB][4];
#pragma unroll
    for (int m = 0; m < MB; ++m)
#pragma unroll
        for (int n = 0; n < NB; ++n)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[m][n][j] = 0.f;

#pragma unroll
    for (int s = 0; s < S - 1; ++s) { if (s < nk) load(s, s); commit(); }

    // transform item of this thread: tile t, channel pair cp
    const int t_ = tid >> 3, cp_ = tid & 7, tr_ = t_ / TC, tc_ = t_ % TC;
    const int r_ = t_ & 15, mb_ = t_ >> 4;
    const int vbase = mb_ * 32 * 4 + (4 * (r_ & 7) + (cp_ & 3)) * 4 + (r_ >> 3) + 2 * (cp_ >> 2);
    for (int k = 0; k < nk; ++k) {
        wait_group<S - 2>();
        __syncthreads();
        if (k + S - 1 < nk) load(k + S - 1, (k + S - 1) % S);
        commit();
        if (MODE < 2) {
            const u32* hs = (const u32*)(halo + (k % S) * HALO_B) + ((2 * tr_) * HC + 2 * tc_) * 8 + cp_;
            u32 d[4][4];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) d[i][j] = hs[(i * HC + j) * 8];
            u32 tm[4][4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                tm[0][j] = hsub2(d[0][j], d[2][j]);
                tm[1][j] = hadd2(d[1][j], d[2][j]);
                tm[2][j] = hsub2(d[2][j], d[1][j]);
                tm[3][j] = hsub2(d[1][j], d[3][j]);
            }
            u32* Vw = (u32*)V + vbase;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                Vw[(i * 4 + 0) * MB * 128] = hsub2(tm[i][0], tm[i][2]);
                Vw[(i * 4 + 1) * MB * 128] = hadd2(tm[i][1], tm[i][2]);
                Vw[(i * 4 + 2) * MB * 128] = hsub2(tm[i][2], tm[i][1]);
                Vw[(i * 4 + 3) * MB * 128] = hsub2(tm[i][1], tm[i][3]);
            }
        }
        __syncthreads();
        const uint4* us = (const uint4*)(ubuf + (k % S) * U_B);
        uint4 a[MB];
#pragma unroll
        for (int m = 0; m < MB; ++m) a[m] = V[(warp * MB + m) * 32 + lane];
#pragma unroll
        for (int nb = 0; nb < NB / 2; ++nb) {
            uint4 bf = us[(warp * (NB / 2) + nb) * 32 + lane];
#pragma unroll
            for (int m = 0; m < MB; ++m) {
                mma16816(acc[m][2 * nb], (const u32*)&a[m], bf.x, bf.y);
                mma16816(acc[m][2 * nb + 1], (const u32*)&a[m], bf.z, bf.w);
            }
        }
    }
    wait_group<0>();
    if (MODE >= 1) {   // knockout: no epilogue; keep the accumulators alive
        float sum = 0.f;
#pragma unroll
        for (int m = 0; m < MB; ++m)
#pragma unroll
            for (int n = 0; n < NB; ++n) sum += acc[m][n][0] + acc[m][n][3];
        if (sum == 12345.f) y[tid] = 1;
        return;
    }
    // epilogue: two rounds of 8 positions through a padded fp32 exchange M[8][BT][SP]
    float* M = (float*)smem;
    float2 s0[2][4], s1[2][4];
    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int round = 0; round < 2; ++round) {
        __syncthreads();
        if ((warp >> 3) == round) {
            const int pl = warp & 7;
#pragma unroll
            for (int m = 0; m < MB; ++m)
#pragma unroll
                for (int n = 0; n < NB; ++n) {
                    const int t0 = m * 16 + g, c0 = n * 8 + 2 * q;
                    *(float2*)&M[(pl * BT + t0) * SP + c0] = make_float2(acc[m][n][0], acc[m][n][1]);
                    *(float2*)&M[(pl * BT + t0 + 8) * SP + c0] = make_float2(acc[m][n][2], acc[m][n][3]);
                }
        }
        __syncthreads();
#pragma unroll
        for (int it = 0; it < 2; ++it) {
            const int item = tid + 512 * it, t = item >> 4, c = (item & 15) * 2;
            float2 m[8];
#pragma unroll
            for (int pl = 0; pl < 8; ++pl) m[pl] = *(const float2*)&M[(pl * BT + t) * SP + c];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if (round == 0) {   // rows a = 0, 1: s0 = m0 + m1, s1 = m1
                    s0[it][j] = make_float2(m[j].x + m[4 + j].x, m[j].y + m[4 + j].y);
                    s1[it][j] = m[4 + j];
                } else {            // rows a = 2, 3: s0 += m2, s1 -= m2 + m3
                    s0[it][j].x += m[j].x; s0[it][j].y += m[j].y;
                    s1[it][j].x -= m[j].x + m[4 + j].x; s1[it][j].y -= m[j].y + m[4 + j].y;
                }
            }
        }
    }
#pragma unroll
    for (int it = 0; it < 2; ++it) {
        const int item = tid + 512 * it, t = item >> 4, c = (item & 15) * 2, tr = t / TC, tc = t % TC;
        const int cg = nblk * BN + c;
        const float b0 = bias[cg], b1 = bias[cg + 1];
        float2 o[2][2];
        const float2* sa = s0[it];
        const float2* sb = s1[it];
        o[0][0] = make_float2(sa[0].x + sa[1].x + sa[2].x, sa[0].y + sa[1].y + sa[2].y);
        o[0][1] = make_float2(sa[1].x - sa[2].x - sa[3].x, sa[1].y - sa[2].y - sa[3].y);
        o[1][0] = make_float2(sb[0].x + sb[1].x + sb[2].x, sb[0].y + sb[1].y + sb[2].y);
        o[1][1] = make_float2(sb[1].x - sb[2].x - sb[3].x, sb[1].y - sb[2].y - sb[3].y);
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

#define INST(TR, TC, S, MODE)                                                                            \
    extern "C" __global__ void __launch_bounds__(512, 1) wino3_##TC##_##S##_##MODE(                      \
        const u16* x, const uint4* U, const float* bias, u16* y, int H, int W, int Cin, int Cout) {    \
        wino3<TR, TC, S, MODE>(x, U, bias, y, H, W, Cin, Cout);                                          \
    }
#define INST_ALL(TR, TC) INST(TR, TC, 3, 0) INST(TR, TC, 2, 0) INST(TR, TC, 2, 1) INST(TR, TC, 2, 2)
INST_ALL(2, 32)
INST_ALL(4, 16)
INST_ALL(8, 8)

// lowres.cu (prototype): a 3x3 conv at the 8x8 / 16x16 levels for small batches on few SMs, where a
// call streams far more weight bytes than activation bytes. Each CTA takes NT output channels x 64
// pixels (one M tile: 64 / W rows of one image) x CS input channels (split K by channel ranges over
// all 9 taps): it issues every load up front (the zero-padded patch (64/W + 2) x (W + 2) x CS once,
// its NT x 9 x CS weights), normalizes the patch in place (GroupNorm(1) affine, padding left zero),
// runs mma.sync m16n8k16 from shared memory (4 warps, 16 pixels each), adds its fp32 partial sums to
// a workspace with red.add, and the last CTA of each (M tile, N tile) (a ticket) adds the bias,
// applies the exact GELU, stores fp16, leaves the workspace zero and adds its sum / sum of squares
// to the sample's statistics (the next GroupNorm).
// mode 1: no epilogue (the partial sums only); mode 2: loads and epilogue only (no mma).
#include "common.cuh"

__device__ __forceinline__ void cp16(saddr s, const void *g, bool full) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g), "r"(full ? 16 : 0));
}

template <int NT, int CS, int W, int MODE>
__global__ void __launch_bounds__(128) lr_conv(const u16 *__restrict__ x, const u16 *__restrict__ wt,
                                               const float *__restrict__ bias, const float *__restrict__ gam,
                                               const float *__restrict__ bet, float mean, float rstd,
                                               float *__restrict__ ws, unsigned *__restrict__ tickets,
                                               u16 *__restrict__ out, float *__restrict__ stats, int H, int C, int N) {
    constexpr int TR = 64 / W, PR = TR + 2, PC = W + 2, PS = CS + 8, KS = 9 * CS + 8, NF = NT / 8;
    extern __shared__ __align__(16) unsigned char smem[];
    u16 *patch = (u16 *)smem;
    u16 *wsm = patch + PR * PC * PS;
    __shared__ float red[33];
    __shared__ unsigned last;
    const int nt = blockIdx.x, split = blockIdx.y, mt = blockIdx.z, tiles = H / TR;
    const int b = mt / tiles, y0 = (mt % tiles) * TR, c0 = split * CS, n0 = nt * NT;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // ---- every load first
    for (int i = threadIdx.x; i < PR * PC * (CS / 8); i += 128) {
        const int p = i / (CS / 8), v = i % (CS / 8), py = p / PC, px = p % PC, y = y0 + py - 1, xx = px - 1;
        const bool in = y >= 0 && y < H && xx >= 0 && xx < W;
        const u16 *src = in ? x + (((size_t)b * H + y) * W + xx) * C + c0 + v * 8 : x;
        cp16(smem_u32(patch + p * PS + v * 8), src, in);
    }
    for (int i = threadIdx.x; i < NT * 9 * (CS / 8); i += 128) {
        const int r = i / (9 * CS / 8), q = i % (9 * CS / 8), tap = q / (CS / 8), v = q % (CS / 8);
        cp16(smem_u32(wsm + r * KS + tap * CS + v * 8), wt + ((size_t)(n0 + r) * 9 + tap) * C + c0 + v * 8, true);
    }
    asm volatile("cp.async.wait_all;\n" ::);
    __syncthreads();
    // ---- GroupNorm on the patch's interior (padding stays zero)
    for (int i = threadIdx.x; i < PR * PC * (CS / 2); i += 128) {
        const int p = i / (CS / 2), c = 2 * (i % (CS / 2)), py = p / PC, px = p % PC, y = y0 + py - 1, xx = px - 1;
        if (y < 0 || y >= H || xx < 0 || xx >= W) continue;
        u32 *q = (u32 *)(patch + p * PS + c);
        const float a0 = F16::to_f((u16)(*q & 0xffffu)), a1 = F16::to_f((u16)(*q >> 16));
        const float s0 = rstd * gam[c0 + c], s1 = rstd * gam[c0 + c + 1];
        *q = (u32)F16::from_f((a0 - mean) * s0 + bet[c0 + c]) | ((u32)F16::from_f((a1 - mean) * s1 + bet[c0 + c + 1]) << 16);
    }
    __syncthreads();
    float acc[NF][4];
#pragma unroll
    for (int j = 0; j < NF; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    // A rows: warp's pixels 16w .. 16w+15; lane's ldmatrix row
    const int q4 = lane >> 3, arow = 16 * warp + (q4 & 1) * 8 + (lane & 7), acol = (q4 >> 1) * 8;
    const saddr a_base = smem_u32(patch + ((arow / W) * PC + arow % W) * PS + acol);
    const saddr b_base = smem_u32(wsm + ((q4 >> 1) * 8 + (lane & 7)) * KS + (q4 & 1) * 8);
    if (MODE != 2) {
#pragma unroll 1
        for (int tap = 0; tap < 9; ++tap) {
            const int dy = tap / 3, dx = tap % 3;
#pragma unroll
            for (int kc = 0; kc < CS / 16; ++kc) {
                u32 a[4];
                ldmatrix_x4(a, a_base + 2 * ((dy * PC + dx) * PS + kc * 16));
#pragma unroll
                for (int j = 0; j < NF / 2; ++j) {
                    u32 bb[4];
                    ldmatrix_x4(bb, b_base + 2 * (j * 16 * KS + tap * CS + kc * 16));
                    F16::mma(acc[2 * j], a, bb);
                    F16::mma(acc[2 * j + 1], a, bb + 2);
                }
            }
        }
    }
    // ---- partial sums into the workspace
    const int g = lane >> 2, t4 = lane & 3;
    const size_t pix0 = (size_t)b * H * W + (size_t)y0 * W;
#pragma unroll
    for (int j = 0; j < NF; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int m = 16 * warp + g + 8 * h, n = n0 + 8 * j + 2 * t4;
            float *p = ws + (pix0 + m) * N + n;
            atomicAdd(p, acc[j][2 * h]);
            atomicAdd(p + 1, acc[j][2 * h + 1]);
        }
    if (MODE == 1) return;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(tickets + mt * gridDim.x + nt, 1u) == gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    float s = 0.0f, s2 = 0.0f;
    for (int i = threadIdx.x; i < 64 * NT / 2; i += 128) {
        const int m = i / (NT / 2), n = n0 + 2 * (i % (NT / 2));
        float2 *p = (float2 *)(ws + (pix0 + m) * N + n);
        const float2 v = __ldcg(p);
        __stcg(p, make_float2(0.0f, 0.0f));
        const float g0 = gelu_f(v.x + bias[n]), g1 = gelu_f(v.y + bias[n + 1]);
        *(u32 *)(out + (pix0 + m) * N + n) = (u32)F16::from_f(g0) | ((u32)F16::from_f(g1) << 16);
        s += g0 + g1;
        s2 += g0 * g0 + g1 * g1;
    }
    s = block_sum(s, red);
    s2 = block_sum(s2, red);
    if (threadIdx.x == 0) {
        atomicAdd(stats + 2 * b, s);
        atomicAdd(stats + 2 * b + 1, s2);
        tickets[mt * gridDim.x + nt] = 0u;
    }
}

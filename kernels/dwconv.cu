// dwconv.cu: depthwise KxK convolution (the ConvNeXt `ds_conv`, 7x7, groups = C) over NHWC.
//
// Computes out[b, y, x, c] = sum_{ky,kx} w[ky, kx, c] * x[b, y+ky-K/2, x+kx-K/2, c] + bias[c]
//   + tbias[t_idx[b], c]  (zero padding), and GroupNorm(1) partials of `out` for the next conv's
//   norm1 (one StatPartial per CTA: count, sum, M2 about the tile mean).
// The input may be a view of a concat buffer (pixel stride ldx > C); the output has stride ldo.
// Launch: grid (ceil(H/8)*ceil(W/TW), ceil(C/32), B), block 256 (fixed) = 32 channels x 8 rows; each
//   thread produces TW outputs of one row from a (8+K-1) x (TW+K-1) x 32 halo tile in shared memory,
//   kept in the activation dtype (lanes run over channels: coalesced loads, conflict-free smem
//   reads). TW = 8, or 4 where the TW = 4 grid still has at most one CTA per SM (ops.dwconv_tw;
//   most of batch 1 on the H100): a thread's chain of ~49 * TW FMAs is then half as long, at 1.4x
//   the smem reads. Weights fp32 [K*K][C], staged in smem too (in registers they took 49 per
//   thread and capped occupancy at 2 CTAs per SM, which made the batch-16 launches ~8 waves of
//   latency chains).
// Loads: every thread issues all its loads (t_idx first, weights, VEC-wide halo vectors, bias)
//   before its first smem store, so the whole prologue costs about one memory latency; the time
//   bias (whose address waits for t_idx) is loaded after the halo's loads and used only in the
//   epilogue, so t_idx -> time bias no longer puts a second latency in front of the halo's loads.
//   VEC (8 for 16-bit, 4 for fp32, 1 for odd channel counts or views) is chosen on the host (C, the
//   pixel strides and the view offsets divisible by VEC).
// Reference: runtime.reference.conv2d(groups=C) + the block's time bias.
#include "common.cuh"

#define DW_PARAMS                                                                            \
    const void *x_, int H, int W, int C, int ldx, const float *w, const float *bias,          \
    const float *tbias, int tb_stride, const int *t_idx, void *out_, int ldo, float4 *st_part
#define DW_ARGS x_, H, W, C, ldx, w, bias, tbias, tb_stride, t_idx, out_, ldo, st_part

template <class D, int K, int VEC, int TW>
__device__ __forceinline__ void dwconv(DW_PARAMS) {
    typedef typename D::S S;
    constexpr int TH = 8, CC = 32, HW = TW + K - 1, HH = TH + K - 1, P = K / 2, NT = 256;
    constexpr int NTILE = HH * HW * CC, CV = CC / VEC, NVEC = NTILE / VEC, WN = K * K * CC;
    static_assert(CC % VEC == 0, "channel vectors");
    __shared__ __align__(16) S tile[NTILE];
    __shared__ float wsm[WN];
    __shared__ float red[33];
    const S *x = (const S *)x_;
    S *out = (S *)out_;
    const int tiles_x = (W + TW - 1) / TW;
    const int y0 = (blockIdx.x / tiles_x) * TH, x0 = (blockIdx.x % tiles_x) * TW;
    const int c0 = blockIdx.y * CC, b = blockIdx.z;
    const int cl = threadIdx.x % CC, row = threadIdx.x / CC, c = c0 + cl;
    const int tb_i = tbias ? t_idx[b] : 0;   // issued first; used after the halo's loads are issued

    // ---- every load first (chunks of LC vectors for the scalar path's 25 per thread) -----------
    constexpr int WPT = (WN + NT - 1) / NT;
    float wv[WPT];
#pragma unroll
    for (int u = 0; u < WPT; ++u) {
        const int i = threadIdx.x + u * NT, t = i / CC, cc = i % CC;
        wv[u] = (i < WN && c0 + cc < C) ? w[t * C + c0 + cc] : 0.0f;
    }
    const float bv = c < C ? bias[c] : 0.0f;
    constexpr int VPT = (NVEC + NT - 1) / NT, LC = VPT < 8 ? VPT : 8;
    for (int u0 = 0; u0 < VPT; u0 += LC) {
        Vec<S, VEC> v[LC];
#pragma unroll
        for (int u = 0; u < LC; ++u) {
            const int i = threadIdx.x + (u0 + u) * NT;
            const int cc = (i % CV) * VEC, p = i / CV, py = p / HW, px = p - (p / HW) * HW;
            const int gy = y0 + py - P, gx = x0 + px - P;
            v[u] = (i < NVEC && gy >= 0 && gy < H && gx >= 0 && gx < W && c0 + cc < C)
                       ? vload<S, VEC>(x + ((size_t)(b * H + gy) * W + gx) * ldx + c0 + cc) : vzero<S, VEC>();
        }
#pragma unroll
        for (int u = 0; u < LC; ++u) {
            const int i = threadIdx.x + (u0 + u) * NT;
            if (i < NVEC) vstore<S, VEC>(&tile[i * VEC], v[u]);
        }
    }
    const float tv = (tbias && c < C) ? tbias[tb_i * tb_stride + c] : 0.0f;   // consumed in the epilogue
#pragma unroll
    for (int u = 0; u < WPT; ++u) {
        const int i = threadIdx.x + u * NT;
        if (i < WN) wsm[i] = wv[u];
    }
    __syncthreads();

    float acc[TW];
#pragma unroll
    for (int j = 0; j < TW; ++j) acc[j] = 0.0f;
    if (c < C) {
#pragma unroll
        for (int ky = 0; ky < K; ++ky) {
            float r[HW];
#pragma unroll
            for (int j = 0; j < HW; ++j) r[j] = D::to_f(tile[((row + ky) * HW + j) * CC + cl]);
#pragma unroll
            for (int kx = 0; kx < K; ++kx) {
                const float wk = wsm[(ky * K + kx) * CC + cl];
#pragma unroll
                for (int j = 0; j < TW; ++j) acc[j] = fmaf(r[j + kx], wk, acc[j]);
            }
        }
    }
    const int oy = y0 + row;
    const float add = bv + tv;
    float lsum = 0.0f;
#pragma unroll
    for (int j = 0; j < TW; ++j) {
        const float v = acc[j] + add;
        acc[j] = v;
        if (c < C && oy < H && x0 + j < W) {
            out[((size_t)(b * H + oy) * W + x0 + j) * ldo + c] = D::from_f(v);
            lsum += v;
        }
    }
    if (st_part) {
        const float cnt = (float)(min(TH, H - y0) * min(TW, W - x0) * min(CC, C - c0));
        const float tsum = block_sum(lsum, red), tmean = __fdividef(tsum, cnt);   // within 2 ulp: M2 grows by n * err^2
        float lm2 = 0.0f;
#pragma unroll
        for (int j = 0; j < TW; ++j)
            if (c < C && oy < H && x0 + j < W) lm2 += (acc[j] - tmean) * (acc[j] - tmean);
        const float tm2 = block_sum(lm2, red);
        if (threadIdx.x == 0)
            st_part[(size_t)b * gridDim.x * gridDim.y + blockIdx.y * gridDim.x + blockIdx.x] =
                make_float4(cnt, tsum, tm2, 0.0f);
    }
}

#define DW_INSTANCE(name, D, K, VEC, TW)                                                     \
    extern "C" __global__ void __launch_bounds__(256) name(DW_PARAMS) { dwconv<D, K, VEC, TW>(DW_ARGS); }

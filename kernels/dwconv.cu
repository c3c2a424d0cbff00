// dwconv.cu: depthwise KxK convolution (the ConvNeXt `ds_conv`, 7x7, groups = C) over NHWC.
//
// Computes out[b, y, x, c] = sum_{ky,kx} w[ky, kx, c] * x[b, y+ky-K/2, x+kx-K/2, c] + bias[c]
//   + tbias[t_idx[b], c]  (zero padding), and GroupNorm(1) partials of `out` for the next conv's
//   norm1 (one StatPartial per CTA: count, sum, M2 about the tile mean).
// The input may be a view of a concat buffer (pixel stride ldx > C); the output has stride ldo.
// Launch: grid (ceil(H/8)*ceil(W/8), ceil(C/32), B), block 256 (fixed) = 32 channels x 8 rows; each thread
//   produces 8 outputs of one row from a (8+K-1)^2 x 32 fp32 halo tile in shared memory (lanes run
//   over channels: coalesced loads, conflict-free smem reads). Weights fp32 [K*K][C].
// Reference: runtime.reference.conv2d(groups=C) + the block's time bias.
#include "common.cuh"

#define DW_PARAMS                                                                            \
    const void *x_, int H, int W, int C, int ldx, const float *w, const float *bias,          \
    const float *tbias, int tb_stride, const int *t_idx, void *out_, int ldo, float4 *st_part
#define DW_ARGS x_, H, W, C, ldx, w, bias, tbias, tb_stride, t_idx, out_, ldo, st_part

template <class D, int K>
__device__ __forceinline__ void dwconv(DW_PARAMS) {
    typedef typename D::S S;
    constexpr int TH = 8, TW = 8, CC = 32, HW = TW + K - 1, HH = TH + K - 1, P = K / 2;
    __shared__ float tile[HH * HW * CC];
    __shared__ float red[33];
    const S *x = (const S *)x_;
    S *out = (S *)out_;
    const int tiles_x = (W + TW - 1) / TW;
    const int y0 = (blockIdx.x / tiles_x) * TH, x0 = (blockIdx.x % tiles_x) * TW;
    const int c0 = blockIdx.y * CC, b = blockIdx.z;
    const int cl = threadIdx.x % CC, row = threadIdx.x / CC, c = c0 + cl;

    // This CTA's 49 weights first (independent loads, one latency), then the halo tile in chunks
    // of 8 loads issued before their 8 stores: a load->store loop would pay one memory latency per
    // element (25 per thread), which dominated the kernel at batch 1.
    float wreg[K * K];
#pragma unroll
    for (int t = 0; t < K * K; ++t) wreg[t] = c < C ? w[t * C + c] : 0.0f;
    constexpr int NTILE = HH * HW * CC, CH = 8;
    for (int i0 = threadIdx.x; i0 < NTILE; i0 += CH * 256) {
        float v[CH];
#pragma unroll
        for (int u = 0; u < CH; ++u) {
            const int i = i0 + u * 256;
            const int cc = i % CC, p = i / CC, py = p / HW, px = p - (p / HW) * HW;
            const int gy = y0 + py - P, gx = x0 + px - P;
            v[u] = (i < NTILE && gy >= 0 && gy < H && gx >= 0 && gx < W && c0 + cc < C)
                       ? D::to_f(x[((size_t)(b * H + gy) * W + gx) * ldx + c0 + cc]) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < CH; ++u)
            if (i0 + u * 256 < NTILE) tile[i0 + u * 256] = v[u];
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
            for (int j = 0; j < HW; ++j) r[j] = tile[((row + ky) * HW + j) * CC + cl];
#pragma unroll
            for (int kx = 0; kx < K; ++kx) {
                const float wv = wreg[ky * K + kx];
#pragma unroll
                for (int j = 0; j < TW; ++j) acc[j] = fmaf(r[j + kx], wv, acc[j]);
            }
        }
    }
    const float add = c < C ? bias[c] + (tbias ? tbias[t_idx[b] * tb_stride + c] : 0.0f) : 0.0f;
    const int oy = y0 + row;
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
        const float tsum = block_sum(lsum, red), tmean = tsum / cnt;
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

#define DW_INSTANCE(name, D, K)                                                              \
    extern "C" __global__ void __launch_bounds__(256) name(DW_PARAMS) { dwconv<D, K>(DW_ARGS); }

// io.cu: the two convolutions at the network's ends, where the image tensors are fp32 NHWC.
//
// init_conv: out = conv_KxK(x) + bias, x the fp32 image (Cin = channels, pixel stride Cin), out in
//   the activation dtype at pixel stride ldo (it sits in the final concat buffer).
//   Launch: grid (ceil(H/8)*ceil(W/TW), 1, B), block 256; dynamic smem Cin*(8+K-1)*RS + K*K*Cin*CoutP
//   floats (halo tile [ci][row][RS] + all weights [ky][kx][ci][CoutP], CoutP = Cout rounded up to 8
//   with zeros; RS: below). TW = 8, or 16 where the 8-wide grid is several waves (ops.init_tw:
//   batch 16): each item then computes 2 pixels per weight read, the kernel being bound by its smem
//   reads (3 per 8 FMAs at TW 8, 4 per 16 at 16) with each CTA's 4704-weight staging halved per pixel.
//   Each thread owns (PX pixels, 8 output channels) items; Cin is a template parameter (CIN, the image
//   channels), so each kernel row's KxCIN taps unroll into straight smem loads and FMAs (a runtime
//   Cin loop made the default model's init_conv the slowest launch: 15 us at batch 1, 72 us at 16);
//   the rows stay a loop (all 7x7x3 taps unrolled: 53 us at batch 16, the slowest launch again).
// final_conv: eps = conv_1x1(x) + bias, x in the activation dtype (pixel stride ldx), eps fp32 with
//   pixel stride Cout (<= 8). Launch: grid ceil(B*H*W/128), block 128, dynamic smem Cout*Cin floats.
//   Each thread reads its pixel's channels as VEC-wide vectors (VEC 8 for 16-bit, 4 for fp32, 1
//   for odd strides or view offsets; chosen on the host like the depthwise conv's): one scalar
//   load per channel made a warp's loads 32 pixels apart each (8 us at batch 16 on the H100).
//   With xs (the sampler's fp32 NHWC image; GpuExecutor.run(step=...)) it also takes the sampling
//   step in place, xs = c_x * xs + c_eps * eps + sigma * z with (c_x, c_eps, sigma, row) = *step
//   (sample.cu advance_step) and z the NCHW noise row `row` of npix * Cout values (none when row is
//   -1; hw pixels per image), exactly as the host's generator fills it, so host noise is drawn
//   straight into pinned memory with no transpose pass (at batch 16 the transpose made the noise
//   thread, not the GPU, the bottleneck). One kernel fewer per step than a separate p_sample.
// Reference: runtime.reference.conv2d.
#include "common.cuh"

extern __shared__ __align__(16) float dyn_smem[];

#define INIT_PARAMS                                                                          \
    const float *x, int H, int W, int Cin, const float *w, const float *bias, void *out_,     \
    int Cout, int CoutP, int ldo
#define INIT_ARGS x, H, W, Cin, w, bias, out_, Cout, CoutP, ldo

template <class D, int K, int CIN, int TW>
__device__ __forceinline__ void init_conv(INIT_PARAMS) {
    typedef typename D::S S;
    constexpr int TH = 8, PX = TW / 8, HW = TW + K - 1, HH = TH + K - 1, P = K / 2, NT = 256;
    static_assert(TW % 8 == 0, "items of PX pixels 8 apart");
    constexpr int NTILE = HH * HW * CIN, TPT = (NTILE + NT - 1) / NT, WCH = 20;
    // The halo tile channel-planar, rows RS floats apart with RS an odd multiple of 8 (ops.init_row):
    // a warp's 32 pixels (4 rows of 8) then read 32 distinct banks. Pixel-interleaved (3 floats per
    // pixel), the rows collided: 1.2 M bank conflicts at batch 16, the kernel bound by smem reads.
    constexpr int RS = HW <= 8 ? 8 : 8 * (2 * ((HW - 8 + 15) / 16) + 1);
    float *tile = dyn_smem, *ws = dyn_smem + CIN * HH * RS;
    S *out = (S *)out_;
    const int tiles_x = (W + TW - 1) / TW;
    const int y0 = (blockIdx.x / tiles_x) * TH, x0 = (blockIdx.x % tiles_x) * TW, b = blockIdx.z;
    // Every load before its store: the halo (TPT per thread), then the weights in chunks of WCH
    // (one chunk for the default model's 4704 weights), so the prologue costs ~one memory latency.
    float tv[TPT];
#pragma unroll
    for (int u = 0; u < TPT; ++u) {
        const int i = threadIdx.x + u * NT;
        const int ci = i % CIN, p = i / CIN, py = p / HW, px = p - (p / HW) * HW;
        const int gy = y0 + py - P, gx = x0 + px - P;
        tv[u] = (i < NTILE && gy >= 0 && gy < H && gx >= 0 && gx < W) ? x[((size_t)(b * H + gy) * W + gx) * CIN + ci] : 0.0f;
    }
    const int nw = K * K * CIN * CoutP;
    for (int i0 = threadIdx.x; i0 < nw; i0 += WCH * NT) {
        float v[WCH];
#pragma unroll
        for (int u = 0; u < WCH; ++u) v[u] = i0 + u * NT < nw ? w[i0 + u * NT] : 0.0f;
#pragma unroll
        for (int u = 0; u < WCH; ++u)
            if (i0 + u * NT < nw) ws[i0 + u * NT] = v[u];
    }
#pragma unroll
    for (int u = 0; u < TPT; ++u) {
        const int i = threadIdx.x + u * NT;
        const int ci = i % CIN, p = i / CIN, py = p / HW, px = p - (p / HW) * HW;
        if (i < NTILE) tile[(ci * HH + py) * RS + px] = tv[u];
    }
    __syncthreads();
    // Item `it`: 8 output channels (group g) of PX pixels 8 apart in a row. A warp's 32 items are 4
    // rows of 8 neighbouring pixels (conflict-free reads, as above); each weight pair it reads from
    // smem (two 16-byte broadcasts) serves PX pixels.
    const int groups = CoutP / 8;
    for (int it = threadIdx.x; it < TH * 8 * groups; it += NT) {
        const int p = it % (TH * 8), g = it / (TH * 8), py = p / 8, px = p % 8;
        const int oy = y0 + py;
        if (oy >= H || x0 + px >= W) continue;   // its first pixel is outside: so are the others
        float acc[PX][8];
#pragma unroll
        for (int q = 0; q < PX; ++q)
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[q][j] = 0.0f;
#pragma unroll 1   // unrolled, the K*K*CIN taps made ~26 KB of code per thread: instruction-fetch bound
        for (int ky = 0; ky < K; ++ky)
#pragma unroll
            for (int kx = 0; kx < K; ++kx)
#pragma unroll
                for (int ci = 0; ci < CIN; ++ci) {
                    const float4 *wr = reinterpret_cast<const float4 *>(ws + ((ky * K + kx) * CIN + ci) * CoutP + g * 8);
                    const float4 w0 = wr[0], w1 = wr[1];
#pragma unroll
                    for (int q = 0; q < PX; ++q) {
                        const float xv = tile[(ci * HH + py + ky) * RS + px + 8 * q + kx];
                        float *a = acc[q];
                        a[0] = fmaf(xv, w0.x, a[0]); a[1] = fmaf(xv, w0.y, a[1]);
                        a[2] = fmaf(xv, w0.z, a[2]); a[3] = fmaf(xv, w0.w, a[3]);
                        a[4] = fmaf(xv, w1.x, a[4]); a[5] = fmaf(xv, w1.y, a[5]);
                        a[6] = fmaf(xv, w1.z, a[6]); a[7] = fmaf(xv, w1.w, a[7]);
                    }
                }
#pragma unroll
        for (int q = 0; q < PX; ++q) {
            const int ox = x0 + px + 8 * q;
            if (ox >= W) break;
            S *o = out + ((size_t)(b * H + oy) * W + ox) * ldo + g * 8;
            Vec<S, 8> v;
#pragma unroll
            for (int j = 0; j < 8; ++j) v.v[j] = D::from_f(acc[q][j] + (g * 8 + j < Cout ? bias[g * 8 + j] : 0.0f));
            // one 16-byte store where the 8 channels are whole and aligned: scattered 2-byte stores
            // wrote a 32-byte sector each (16x the bytes; init_conv was the slowest launch at batch 16)
            if (sizeof(S) * 8 == 16 && g * 8 + 8 <= Cout && ((size_t)o & 15) == 0) {
                vstore<S, 8>(o, v);
            } else {
#pragma unroll
                for (int j = 0; j < 8; ++j)
                    if (g * 8 + j < Cout) o[j] = v.v[j];
            }
        }
    }
}

#define FINAL_PARAMS                                                                            \
    const void *x_, int npix, int Cin, int ldx, const float *w, const float *bias, float *out, int Cout, \
    float *xs, const float *noise, const float4 *step, int hw
#define FINAL_ARGS x_, npix, Cin, ldx, w, bias, out, Cout, xs, noise, step, hw

template <class D, int VEC>
__device__ __forceinline__ void final_conv(FINAL_PARAMS) {
    typedef typename D::S S;
    const S *x = (const S *)x_;
    float *ws = dyn_smem;
    const float4 k = xs ? *step : make_float4(0.0f, 0.0f, 0.0f, 0.0f);   // first: overlaps the staging
    for (int i = threadIdx.x; i < Cout * Cin; i += blockDim.x) ws[i] = w[i];
    __syncthreads();
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= npix) return;
    float acc[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] = 0.0f;
    const S *xp = x + (size_t)p * ldx;
#pragma unroll 4
    for (int c0 = 0; c0 < Cin; c0 += VEC) {   // Cin % VEC == 0 (host)
        const Vec<S, VEC> v = vload<S, VEC>(xp + c0);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            const float xv = D::to_f(v.v[e]);
#pragma unroll
            for (int j = 0; j < 8; ++j)
                if (j < Cout) acc[j] = fmaf(xv, ws[j * Cin + c0 + e], acc[j]);
        }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j)
        if (j < Cout) out[(size_t)p * Cout + j] = acc[j] += bias[j];
    if (!xs) return;
    // the sampler's step (schedule.p_sample's expression, on the eps values just stored)
    const int row = __float_as_int(k.w), b = p / hw;
    const float *z = row >= 0 ? noise + (size_t)row * npix * Cout + (size_t)b * Cout * hw + (p - b * hw) : nullptr;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        if (j >= Cout) continue;
        const size_t i = (size_t)p * Cout + j;
        float v = fmaf(k.x, xs[i], k.y * acc[j]);   // acc: eps as stored
        if (z) v = fmaf(k.z, z[(size_t)j * hw], v);
        xs[i] = v;
    }
}

#define INIT_INSTANCE(name, D, K, CIN, TW)                                                   \
    extern "C" __global__ void __launch_bounds__(256) name(INIT_PARAMS) { init_conv<D, K, CIN, TW>(INIT_ARGS); }
#define FINAL_INSTANCE(name, D, VEC)                                                         \
    extern "C" __global__ void __launch_bounds__(128) name(FINAL_PARAMS) { final_conv<D, VEC>(FINAL_ARGS); }

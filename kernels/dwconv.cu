// dwconv.cu: depthwise KxK convolution (the ConvNeXt `ds_conv`, 7x7, groups = C) over NHWC.
//
// Computes out[b, y, x, c] = sum_{ky,kx} w[ky, kx, c] * x[b, y+ky-K/2, x+kx-K/2, c] + bias[c]
//   + tbias[t_idx[b], c]  (zero padding), and GroupNorm(1) partials of `out` for the next conv's
//   norm1 (one StatPartial per CTA: count, sum, M2 about the tile mean). With oscale (the next conv
//   folds its GroupNorm: kernels/conv.cu conv_gn_prologue) channel c is stored times oscale[c], that
//   conv's gn_w; the statistics stay those of the unscaled values.
// The input may be a view of a concat buffer (pixel stride ldx > C); the output has stride ldo.
// Launch: grid (ceil(H/TH)*ceil(W/TW), ceil(C/32), B), block 32/CP lanes x CP channels x TH rows
//   (TH = 8 CP: 256 threads; or TH = 8 at CP = 2: 128, ops.dwconv_rows). CP = 1: each thread
//   produces TW outputs of one row and one channel from a (TH+K-1) x (TW+K-1) x 32 halo tile in
//   shared memory, kept in the activation dtype (lanes run over channels: coalesced loads,
//   conflict-free smem reads). TW = 8, or 4 where the TW = 4 grid still
//   has at most one CTA per SM (ops.dwconv_tw; most of batch 1 on the H100): a thread's chain of
//   ~49 * TW FMAs is then half as long, at 1.4x the smem reads. CP = 2 (channel pairs; ops.dwconv_cp,
//   where the one-channel grid has more CTAs than the GPU has SMs): 16 lanes x 2 channels x 16 rows,
//   the halo tile converted to fp32 once as it is stored (CP = 1 converts each value once per tap
//   row it is read in), each smem read a float2 of tile or weights: about half the instructions per
//   output (the loop ~1.2 instead of ~1.6 per FFMA, the halo index arithmetic spread over twice the
//   outputs), at 46 KB of smem per CTA (4 per SM on the H100), with a chain twice as long per thread.
//   8-row pair tiles (TH = 8, 128 threads) serve maps of 8 rows (the 8x8 level), where a 16-row
//   tile would leave half its rows idle: with two channels a thread, a one-channel grid of 1.5
//   waves runs in one.
//   Weights fp32 [K*K][C], staged in smem too (in registers they took 49 per
//   thread and capped occupancy at 2 CTAs per SM, which made the batch-16 launches ~8 waves of
//   latency chains).
// Loads: every thread issues all its loads (t_idx first, weights, VEC-wide halo vectors, bias)
//   before its first smem store, so the whole prologue costs about one memory latency; the time
//   bias (whose address waits for t_idx) is loaded after the halo's loads and used only in the
//   epilogue, so t_idx -> time bias no longer puts a second latency in front of the halo's loads.
//   VEC (8 or 4 for 16-bit, 4 for fp32, 1 for odd channel counts or views) is chosen on the host (C, the
//   pixel strides and the view offsets divisible by VEC).
// Reference: runtime.reference.conv2d(groups=C) + the block's time bias.
#include "common.cuh"

#define DW_PARAMS                                                                            \
    const void *x_, int H, int W, int C, int ldx, const float *w, const float *bias,          \
    const float *tbias, int tb_stride, const int *t_idx, void *out_, int ldo, float4 *st_part,  \
    const float *oscale
#define DW_ARGS x_, H, W, C, ldx, w, bias, tbias, tb_stride, t_idx, out_, ldo, st_part, oscale

// One StatPartial per CTA of either depthwise kernel: count, sum, M2 about the tile mean (m2_about
// gives a thread's part of M2 about the mean it is passed). Grid (tiles, channel tiles, samples).
template <class F>
__device__ __forceinline__ void dw_partial(float4 *st_part, int b, float cnt, float lsum, float *red, F m2_about) {
    const float tsum = block_sum(lsum, red), tmean = __fdividef(tsum, cnt);   // within 2 ulp: M2 grows by n * err^2
    const float tm2 = block_sum(m2_about(tmean), red);
    if (threadIdx.x == 0)
        st_part[(size_t)b * gridDim.x * gridDim.y + blockIdx.y * gridDim.x + blockIdx.x] = make_float4(cnt, tsum, tm2, 0.0f);
}

template <bool C, class A, class B> struct DwPick { typedef A T; };
template <class A, class B> struct DwPick<false, A, B> { typedef B T; };

template <class D, int K, int VEC, int TW, int CP, int TH>
__device__ __forceinline__ void dwconv(DW_PARAMS) {
    typedef typename D::S S;
    typedef typename DwPick<CP == 1, S, float>::T T;   // the halo tile's element
    static_assert(CP == 1 || (CP == 2 && VEC % 4 == 0), "channel pairs: 16-byte vectors, stored as float4");
    static_assert(TH == 8 * CP || (CP == 2 && TH == 8), "tile rows: 8 a channel per thread, 16 or 8 for pairs");
    constexpr int CC = 32, LR = CC / CP, NT = LR * TH, HW = TW + K - 1, HH = TH + K - 1, P = K / 2;
    constexpr int NTILE = HH * HW * CC, CV = CC / VEC, NVEC = NTILE / VEC, WN = K * K * CC;
    static_assert(CC % VEC == 0, "channel vectors");
    __shared__ __align__(16) T tile[NTILE];
    __shared__ __align__(16) float wsm[WN];
    __shared__ float red[33];
    const S *x = (const S *)x_;
    S *out = (S *)out_;
    const int tiles_x = (W + TW - 1) / TW;
    const int y0 = (blockIdx.x / tiles_x) * TH, x0 = (blockIdx.x % tiles_x) * TW;
    const int c0 = blockIdx.y * CC, b = blockIdx.z;
    const int cl = (threadIdx.x % LR) * CP, row = threadIdx.x / LR, c = c0 + cl;
    const int tb_i = tbias ? t_idx[b] : 0;   // issued first; used after the halo's loads are issued

    // ---- every load first (chunks of LC vectors for the scalar path's 25 per thread) -----------
    constexpr int WPT = (WN + NT - 1) / NT;
    float wv[WPT];
#pragma unroll
    for (int u = 0; u < WPT; ++u) {
        const int i = threadIdx.x + u * NT, t = i / CC, cc = i % CC;
        wv[u] = (i < WN && c0 + cc < C) ? w[t * C + c0 + cc] : 0.0f;
    }
    float bv[CP];
#pragma unroll
    for (int q = 0; q < CP; ++q) bv[q] = c < C ? bias[c + q] : 0.0f;   // CP = 2: C is even (VEC | C)
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
            if (i >= NVEC) continue;
            if constexpr (CP == 1) {
                vstore<S, VEC>(&tile[i * VEC], v[u]);
            } else {   // converted once here, where CP = 1 converts each value once per tap row
#pragma unroll
                for (int h = 0; h < VEC; h += 4) {
                    Vec<float, 4> f;
#pragma unroll
                    for (int e = 0; e < 4; ++e) f.v[e] = D::to_f(v[u].v[h + e]);
                    vstore<float, 4>(&tile[i * VEC + h], f);
                }
            }
        }
    }
    float tv[CP], sv[CP];   // consumed in the epilogue: time bias, output scale
#pragma unroll
    for (int q = 0; q < CP; ++q) {
        tv[q] = (tbias && c < C) ? tbias[tb_i * tb_stride + c + q] : 0.0f;
        sv[q] = (oscale && c < C) ? oscale[c + q] : 1.0f;
    }
#pragma unroll
    for (int u = 0; u < WPT; ++u) {
        const int i = threadIdx.x + u * NT;
        if (i < WN) wsm[i] = wv[u];
    }
    __syncthreads();

    // the CP consecutive floats at p (one float2 read for a pair)
    auto floats_at = [](const float *p, float (&r)[CP]) {
        if constexpr (CP == 1) {
            r[0] = *p;
        } else {
            const float2 q = *reinterpret_cast<const float2 *>(p);
            r[0] = q.x;
            r[1] = q.y;
        }
    };
    float acc[TW][CP];
#pragma unroll
    for (int j = 0; j < TW; ++j)
#pragma unroll
        for (int q = 0; q < CP; ++q) acc[j][q] = 0.0f;
    if (c < C) {
#pragma unroll
        for (int ky = 0; ky < K; ++ky) {
            float r[HW][CP];
#pragma unroll
            for (int j = 0; j < HW; ++j) {
                const int i = ((row + ky) * HW + j) * CC + cl;
                if constexpr (CP == 1) r[j][0] = D::to_f(tile[i]);   // the tile in the activation dtype
                else floats_at(&tile[i], r[j]);
            }
#pragma unroll
            for (int kx = 0; kx < K; ++kx) {
                float wk[CP];
                floats_at(&wsm[(ky * K + kx) * CC + cl], wk);
#pragma unroll
                for (int j = 0; j < TW; ++j)
#pragma unroll
                    for (int q = 0; q < CP; ++q) acc[j][q] = fmaf(r[j + kx][q], wk[q], acc[j][q]);
            }
        }
    }
    const int oy = y0 + row;
    float add[CP];
#pragma unroll
    for (int q = 0; q < CP; ++q) add[q] = bv[q] + tv[q];
    float lsum = 0.0f;
#pragma unroll
    for (int j = 0; j < TW; ++j) {
        Vec<S, CP> o;
#pragma unroll
        for (int q = 0; q < CP; ++q) {
            acc[j][q] += add[q];
            o.v[q] = D::from_f(acc[j][q] * sv[q]);
        }
        if (c < C && oy < H && x0 + j < W) {
            vstore<S, CP>(out + ((size_t)(b * H + oy) * W + x0 + j) * ldo + c, o);
#pragma unroll
            for (int q = 0; q < CP; ++q) lsum += acc[j][q];
        }
    }
    if (st_part)
        dw_partial(st_part, b, (float)(min(TH, H - y0) * min(TW, W - x0) * min(CC, C - c0)), lsum, red, [&](float tmean) {
            float lm2 = 0.0f;
#pragma unroll
            for (int j = 0; j < TW; ++j)
                if (c < C && oy < H && x0 + j < W)
#pragma unroll
                    for (int q = 0; q < CP; ++q) lm2 += (acc[j][q] - tmean) * (acc[j][q] - tmean);
            return lm2;
        });
}

// CP = 1: no minimum CTAs per SM (0; ptxas takes 39-64 registers). CP = 2 with 16-bit 16-byte
// vectors is held to 64 registers (4 CTAs of 256 threads per SM, as many as its smem allows on the
// H100; ptxas alone takes 73-80); fp32 and 8-byte vectors to 85 (at 64 they spilled 16 bytes). The
// 8-row pair tiles (128 threads: twice the loads in flight per thread) to 85, 6 CTAs per SM, and
// bf16 (its conversions) to 102 (at 64 the 16-bit ones spilled 72-154 bytes on sm_87, bf16 28 at 85).
#define DW_NT(CP, TH) (32 / (CP) * (TH))
template <class D> struct DwH8Ctas { static constexpr int v = 6; };
template <> struct DwH8Ctas<BF16> { static constexpr int v = 5; };
#define DW_MIN_CTAS(D, VEC, CP, TH) \
    ((CP) == 1 ? 0 : (TH) == 8 ? DwH8Ctas<D>::v : sizeof(D::S) == 2 && (VEC) == 8 ? 4 : 3)
#define DW_INSTANCE(name, D, K, VEC, TW, CP, TH)                                                  \
    extern "C" __global__ void __launch_bounds__(DW_NT(CP, TH), DW_MIN_CTAS(D, VEC, CP, TH)) name(DW_PARAMS) { \
        dwconv<D, K, VEC, TW, CP, TH>(DW_ARGS);                                                   \
    }

// dwconv_tc's statistics over a thread's accumulators (channel q, column block cb, element e at
// row y + 8 (e / 2), column x + 8 cb + e % 2 of channel c + q): the sum (SQ false), or the sum of
// squares about m. MASK tests each element's bounds (ragged tiles); whole tiles skip the tests.
template <bool MASK, bool SQ, int CPW>
__device__ __forceinline__ float dw_tc_sum(const float (&acc)[CPW][2][4], float m, int c, int y, int x, int C,
                                           int H, int W) {
    float s = 0.0f;
#pragma unroll
    for (int q = 0; q < CPW; ++q)
#pragma unroll
        for (int cb = 0; cb < 2; ++cb)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float d = SQ ? acc[q][cb][e] - m : acc[q][cb][e];
                if (!MASK || (c + q < C && y + 8 * (e / 2) < H && x + 8 * cb + e % 2 < W)) s = SQ ? fmaf(d, d, s) : s + d;
            }
    return s;
}

// ---- dwconv_tc: the same op on tensor cores (fp16 / bf16, 16-byte vectors) ---------------------
// For one channel and one kernel row ky, the conv of 16 output rows x 8 output columns is one
// m16n8k16 mma: A[m][k] = x[y0 + m + ky - P][x0 + k - P] (16 rows of 16 input columns: a 16x16 block
// of the channel's halo plane, one ldmatrix.x4), B[k][n] = w[ky][k - n] for 0 <= k - n < K, else 0
// (the weights' row ky as a banded Toeplitz matrix; K <= 9 keeps the band inside 16 columns), so that
// D[m][n] = sum_kx w[ky][kx] x[y0 + m + ky - P][x0 + n + kx - P]. K mma over ky sum the whole conv in
// fp32. The B fragments come from the host in fragment order (ops.pack_dw_tc: [C][K][32 lanes] u32
// pairs): each is one 8-byte load per lane, nothing computed. The weights are rounded to the
// activation dtype (the FFMA kernel above keeps them fp32), as in the GEMM convs.
// CTA: 256 threads, a tile of 16 x 16 outputs x CC = 8 CPW channels; warp w takes channels CPW w ..
// CPW w + CPW - 1, each as 2 column blocks x K mma (the 2 CPW accumulator sets of a warp are
// independent chains). CPW = 4 (32 channels) where the grid is deep; 2 or 1 make 2-4x the CTAs for
// small grids (ops.dwconv_tc_cpw), a shorter chain per CTA. The halo is staged transposed, one
// plane per channel ([CC][TH + K - 1][24] 16-bit words, rows 48 bytes apart, so the 8 rows of an
// ldmatrix phase hit distinct banks; columns past the conv's reach meet zero weights and hold finite
// values; each group of 8 planes GPAD 16-bit words after the last), from pairs of pixels (two
// 16-byte loads of one channel vector as raw 32-bit words, zero where padding: eight byte permutes
// and eight 4-byte stores). A warp's loads take CV consecutive
// vectors (all of the tile's channels) of 32 / CV pixel pairs: whole sectors, 32 / CV lines a load,
// where one vector per lane took 32 lines and 2-4x the L1 requests (Nsight Compute: the
// kernel waited on these loads, not on its mma). Its stores then write words q .. q + 32 / CV - 1 of
// CV planes 8 apart, which GPAD (32 / CV 4-byte words a group) spreads over all 32 banks. The B
// fragments of a warp's channel q are loaded as its mma start (K register pairs live, not CPW K;
// CPW 1 loads them with the halo, a latency less per CTA). The outputs go back through shared
// memory ([CC channels][256 pixels + 2 or 4]: the read below conflict-free for every CV), each
// thread then reading 8 words (two pixels of 8 channels) and permuting them into two 16-byte
// stores. Statistics as the FFMA kernel (one StatPartial per CTA), without per-output bounds tests
// in a whole tile (dw_tc_sum). 4 CTAs per SM (64 registers; CPW 4 spills 16-24 bytes), where 3 at
// 80 registers left more of the halo loads' latency exposed.
// Why: the FFMA kernel issues ~1.2-1.6 instructions per multiply-add, 49 per output; here a warp's
// 128 outputs per channel and column block cost K ldmatrix + K mma.
// Launch: grid (ceil(H/16)*ceil(W/16), ceil(C/CC), B), block 256, no dynamic smem.
template <class D, int K, int CPW>
__device__ __forceinline__ void dwconv_tc(DW_PARAMS) {
    typedef typename D::S S;
    static_assert(sizeof(S) == 2 && K % 2 == 1 && K <= 9, "16-bit types, odd K <= 9");
    static_assert(CPW == 1 || CPW == 2 || CPW == 4, "channels per warp");
    constexpr int NT = 256, CC = 8 * CPW, TH = 16, TW = 16, P = K / 2, VEC = 8, CV = CC / VEC;
    constexpr int PR = TH + K - 1, PC = TW + 8, PLANE = PR * PC;   // halo plane: rows, columns, words
    constexpr int NPH = NT / (CV * (PC / 2)), JR = (PR + NPH - 1) / NPH;   // halo row phases, rows per thread
    constexpr int GPAD = CV > 1 ? 64 / CV : 0;                      // 16-bit words after each 8 planes
    constexpr int OSTR = TH * TW + (CV == 2 ? 4 : 2);               // output staging: 16-bit words per channel
    static_assert(CC * OSTR <= CC * PLANE && OSTR % 2 == 0, "the output staging reuses the halo planes");
    static_assert(PLANE % 8 == 0 && GPAD % 8 == 0, "16-byte aligned planes for ldmatrix");
    __shared__ __align__(16) S planes[CC * PLANE + CV * GPAD];
    __shared__ float red[33];
    const S *x = (const S *)x_;
    S *out = (S *)out_;
    const uint2 *wf = (const uint2 *)w;   // B fragments, [C][K][32]
    const unsigned utid = threadIdx.x;
    const int tid = utid, lane = tid & 31, warp = tid >> 5;
    const int tiles_x = (W + TW - 1) / TW;
    const int y0 = (blockIdx.x / tiles_x) * TH, x0 = (blockIdx.x % tiles_x) * TW;
    const int c0 = blockIdx.y * CC, b = blockIdx.z;
    const int tb_i = tbias ? t_idx[b] : 0;

    // ---- every load first: the halo's pixel pairs, (CPW 1) the B fragments, bias and time bias ---
    // A thread takes one channel vector cv = tid % CV and pair column pc = tid / CV % (PC/2) (halo
    // columns 2 pc, 2 pc + 1) of halo rows ph, ph + NPH, ... (ph = tid / (CV PC/2) < NPH): JR jobs
    // whose addresses and plane words differ by constants. 16-byte words as raw 32-bit words, zero
    // where the tap is padding or past the conv's reach (columns >= TW + K - 1, which only meet zero
    // weights: not loaded, stored as zeros so that they are finite). Offsets from the CTA's sample and
    // channel vector in 32 bits (a sample's map is < 2^31 elements).
    const unsigned hcv = utid % CV, hpc = utid / CV % (PC / 2), hph = utid / (CV * (PC / 2));
    const bool hthread = hph < NPH;
    const int gy0 = y0 - P + (int)hph, gx = x0 - P + 2 * (int)hpc;
    const bool cok = hthread && c0 + (int)hcv * VEC < C;
    const bool ok0 = cok && 2 * hpc < TW + K - 1 && (unsigned)gx < (unsigned)W;
    const bool ok1 = cok && 2 * hpc + 1 < TW + K - 1 && (unsigned)(gx + 1) < (unsigned)W;
    const uint4 *hsrc = reinterpret_cast<const uint4 *>(x + (size_t)b * H * W * ldx + c0 + hcv * VEC + (gy0 * W + gx) * ldx);
    const int hstep = NPH * W * ldx / VEC, hnext = ldx / VEC;   // uint4s to the job's next row, next pixel
    uint4 hv[JR][2];
#pragma unroll
    for (int k = 0; k < JR; ++k) {
        const bool rowok = (unsigned)(gy0 + k * NPH) < (unsigned)H && hph + k * NPH < PR;
        hv[k][0] = hv[k][1] = make_uint4(0u, 0u, 0u, 0u);
        if (rowok && ok0) hv[k][0] = hsrc[k * hstep];
        if (rowok && ok1) hv[k][1] = hsrc[k * hstep + hnext];
    }
    // the B fragments of the warp's channel q: K 8-byte loads per lane
    auto load_b = [&](uint2 (&bq)[K], int q) {
        const int c = c0 + warp * CPW + q;
#pragma unroll
        for (int ky = 0; ky < K; ++ky) bq[ky] = c < C ? wf[((size_t)c * K + ky) * 32 + lane] : uint2{0u, 0u};
    };
    uint2 bf[K];      // channel q's B fragments, loaded in the k loop; with one channel per warp
    if (CPW == 1) load_b(bf, 0);   // already here (registers to spare: one memory latency less)
    // transposed into the planes: word (row, pc) of channel plane 8 cv + e is (pixel 0, pixel 1) of channel e
    u32 *hdst = reinterpret_cast<u32 *>(planes) + hcv * ((VEC * PLANE + GPAD) / 2) + hph * (PC / 2) + hpc;
#pragma unroll
    for (int k = 0; k < JR; ++k) {
        if (!hthread || hph + k * NPH >= PR) continue;
        const u32 a[4] = {hv[k][0].x, hv[k][0].y, hv[k][0].z, hv[k][0].w};
        const u32 c[4] = {hv[k][1].x, hv[k][1].y, hv[k][1].z, hv[k][1].w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            hdst[k * NPH * (PC / 2) + (2 * j) * (PLANE / 2)] = __byte_perm(a[j], c[j], 0x5410);       // low halves: channel 2 j
            hdst[k * NPH * (PC / 2) + (2 * j + 1) * (PLANE / 2)] = __byte_perm(a[j], c[j], 0x7632);   // high: 2 j + 1
        }
    }
    // bias + time bias of the CTA's channels, for the epilogue: in smem, not CPW registers held
    // through the mma
    __shared__ float add[CC], osc[CC];   // and the output scale
    if (tid < CC) {
        const int c = c0 + tid;
        add[tid] = c < C ? bias[c] + (tbias ? tbias[tb_i * tb_stride + c] : 0.0f) : 0.0f;
        osc[tid] = (oscale && c < C) ? oscale[c] : 1.0f;
    }
    __syncthreads();

    // ---- K mma per channel and column block ----------------------------------------------------
    // ldmatrix.x4: lane l gives row l % 8 of matrix l / 8: rows (l / 8 & 1) * 8 + l % 8, columns
    // (l / 16) * 8 of the 16x16 A block (a0..a3 of the m16n8k16 fragment)
    const int mj = lane >> 3, mr = lane & 7;
    const saddr abase = smem_u32(planes) + (u32)((((mj & 1) * 8 + mr) * PC + (mj >> 1) * 8) * 2);
    float acc[CPW][2][4];
#pragma unroll
    for (int q = 0; q < CPW; ++q) {
        const int cl = warp * CPW + q;
        if (CPW > 1) load_b(bf, q);
#pragma unroll
        for (int cb = 0; cb < 2; ++cb)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[q][cb][e] = 0.0f;
#pragma unroll
        for (int ky = 0; ky < K; ++ky) {
            // columns 0..15 for block 0; block 1's columns 8..15 are the same two matrices, so only
            // its columns 16..23 are loaded (6 matrices a row, not 8)
            const saddr row = abase + (u32)((cl * PLANE + (cl / VEC) * GPAD + ky * PC) * 2);
            u32 a[4];
            const u32 bb[2] = {bf[ky].x, bf[ky].y};
            ldmatrix_x4(a, row);
            D::mma(acc[q][0], a, bb);
            a[0] = a[2];
            a[1] = a[3];
            ldmatrix_x2(a + 2, row + 16 * 2);
            D::mma(acc[q][1], a, bb);
        }
    }
    __syncthreads();   // every warp is done with the planes: they take the outputs next

    // ---- epilogue: + bias + time bias; stage [channel][pixel]; statistics; 16-byte stores --------
    // accumulator e of block cb: output row g + 8 (e / 2), column cb * 8 + 2 t + e % 2 (g = lane / 4, t = lane % 4)
    const int g = lane >> 2, t = lane & 3;
    u32 *ost = reinterpret_cast<u32 *>(planes);
#pragma unroll
    for (int q = 0; q < CPW; ++q) {
        const int cl = warp * CPW + q;
#pragma unroll
        for (int cb = 0; cb < 2; ++cb)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float &v0 = acc[q][cb][2 * h], &v1 = acc[q][cb][2 * h + 1];
                v0 += add[cl];
                v1 += add[cl];
                const float s = osc[cl];   // the statistics below take v0, v1 unscaled
                ost[cl * (OSTR / 2) + (g + 8 * h) * (TW / 2) + cb * 4 + t] = (u32)D::from_f(v0 * s) | ((u32)D::from_f(v1 * s) << 16);
            }
    }
    // a tile inside the map and the channels (every tile of a map of 16 k rows and columns, of 8 CPW
    // k channels) needs no bounds test per output
    const bool full = y0 + TH <= H && x0 + TW <= W && c0 + CC <= C;
    const float lsum = full ? dw_tc_sum<false, false>(acc, 0.0f, 0, 0, 0, C, H, W)
                            : dw_tc_sum<true, false>(acc, 0.0f, c0 + warp * CPW, y0 + g, x0 + 2 * t, C, H, W);
    // the statistics before the stores (their barriers publish the staging), so that the
    // accumulators are dead while the stores' words are live: 64 registers without spills
    if (st_part)
        dw_partial(st_part, b, (float)(min(TH, H - y0) * min(TW, W - x0) * min(CC, C - c0)), lsum, red, [&](float tmean) {
            return full ? dw_tc_sum<false, true>(acc, tmean, 0, 0, 0, C, H, W)
                        : dw_tc_sum<true, true>(acc, tmean, c0 + warp * CPW, y0 + g, x0 + 2 * t, C, H, W);
        });
    else
        __syncthreads();
    // pair job i: channel vector cv = i % CV, pixels 2 (i / CV) and the next: 8 words (two pixels of a
    // channel) from the staging, transposed into two 16-byte stores
    constexpr int OPJ = TH * TW / 2 * CV, OPT = (OPJ + NT - 1) / NT;
#pragma unroll
    for (int u = 0; u < OPT; ++u) {
        const unsigned i = utid + u * NT, cv = i % CV, pp = i / CV;
        if (OPJ % NT != 0 && i >= OPJ) break;
        const int oy = y0 + pp / (TW / 2), ox = x0 + 2 * (pp % (TW / 2)), c = c0 + cv * VEC;
        u32 w2[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) w2[e] = ost[(cv * VEC + e) * (OSTR / 2) + pp];
        uint4 o[2];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const u32 sel = k ? 0x7632 : 0x5410;
            o[k] = make_uint4(__byte_perm(w2[0], w2[1], sel), __byte_perm(w2[2], w2[3], sel),
                              __byte_perm(w2[4], w2[5], sel), __byte_perm(w2[6], w2[7], sel));
        }
        if (full || (oy < H && c < C)) {
            uint4 *dst = reinterpret_cast<uint4 *>(out + ((size_t)(b * H + oy) * W + ox) * ldo + c);
            if (full || ox < W) dst[0] = o[0];
            if (full || ox + 1 < W) dst[ldo / VEC] = o[1];
        }
    }
}

#define DW_TC_INSTANCE(name, D, K, CPW)                                                           \
    extern "C" __global__ void __launch_bounds__(256, 4) name(DW_PARAMS) {                           \
        dwconv_tc<D, K, CPW>(DW_ARGS);                                                            \
    }

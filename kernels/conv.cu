// conv.cu: implicit-GEMM convolution over NHWC activations, and the attention gate.
//
// Computes (runtime.plan "conv"): out = act(conv_k(pre(x)) + bias + tbias[b, n]) + residual_term
//   GEMM per sample b = blockIdx.z: M = Hout*Wout pixels, N = Cout, K = two segments
//   segment 0: KH*KH*Cin, ordered (ky, kx, c) so an A row's loads are channel-contiguous;
//              the tap reads x[(oy*ST + ky - PAD) / UP, (ox*ST + kx - PAD) / UP, c] with bounds on
//              the (upsampled) grid: UP = 2 is `up2`, ST = 2 with a 2x2 "tap" is pixel_unshuffle2
//              (the weights are reordered to (dy, dx, c) at upload so the loads stay contiguous).
//              pre(x) = GroupNorm(1) affine of x from the producer's partial statistics; padded
//              taps stay 0 in the normalized domain. Either applied to every A vector (a table of
//              scale/shift) or folded into the GEMM (gn_fold, the 16-bit cp.async and halo convs:
//              see conv_gn_prologue).
//   segment 1: Cr channels of `xr` at the output pixel: a 1x1 `residual_conv` fused as extra K
//              columns of the same GEMM (its bias is pre-summed into `bias`), so a block's conv2 is
//              one launch; for the gate it is residual_conv(skip).
// Epilogue: bias, time bias (fp32 table row t_idx[b]), exact GELU, identity residual, store in the
//   activation dtype at pixel stride ldo (a view into a concat buffer), and optionally GroupNorm
//   partials of the stored tensor for the next conv's norm (one StatPartial per CTA). With oscale
//   (feature o: the next conv folds its GroupNorm) column n is stored times oscale[n] (that conv's
//   gn_w), its statistics those of the unscaled values.
// GATE epilogue (GATE 1: BN >= N, one CTA row; 2: N split over gridDim.y CTAs that meet through a
// ticket, conv_finish): s = psi . relu(acc + bias); out = sigmoid(s + psi_b) * skip.
//
// Launch: grid (ceil(M/BM) * splits, ceil(N/BN), B), block 32*WM*WN, dynamic smem 8*Cin bytes when
//   normalized. splits > 1 (small-M layers at small batch): split-K over CTAs with an fp32
//   workspace and per-tile arrival counters (zeroed once at upload, re-armed by the kernel). Weights: 16-bit: [Npad][ldw] (k contiguous); fp32: [Kpad][ldw = Npad].
// Compute: fp16/bf16 mma.sync.m16n8k16 (fp32 accumulate) from ldmatrix fragments, BK = 32 or 64
//   (64 halves the serialized global-load latencies of long K loops where smem allows);
//   fp32 FFMA with a TMxTN register tile per thread, BK = 16. Register-staged double buffering.
// Reference: runtime.reference.run_conv / run_gate.
// The GroupNorm prologue, the tensor-core k-tile, the split-K merge and the epilogue are device
// functions shared with the cp.async variant (conv_pipe.cu, the default for 16-bit convs): both kernels run the same code
// for everything but moving the tiles into shared memory.
#include "common.cuh"

extern __shared__ __align__(16) float dyn_smem[];

#define CONV_PARAMS                                                                          \
    const void *x_, int Hin, int Win, int Cin, int ldx, const void *xr_, int Cr, int ldr,     \
    const void *w_, int ldw, int nk0, int nk1, const float *bias, const float *tbias,         \
    int tb_stride, const int *t_idx, const float *gn_w, const float *gn_b,                    \
    const float *gn_fold, const float4 *gn_part, int gn_P, float gn_eps, const void *res_,    \
    int ldres, void *out_, int Hout, int Wout, int N, int ldo, float4 *st_part, int act, const float *psi_w,         \
    float psi_b, int splits, float *ws, int *counters, const float *oscale
#define CONV_ARGS                                                                            \
    x_, Hin, Win, Cin, ldx, xr_, Cr, ldr, w_, ldw, nk0, nk1, bias, tbias, tb_stride, t_idx,   \
    gn_w, gn_b, gn_fold, gn_part, gn_P, gn_eps, res_, ldres, out_, Hout, Wout, N, ldo,       \
    st_part, act, psi_w, psi_b, splits, ws, counters, oscale

// The arguments as an instantiation for the op features F sees them (jetson_unet/ops/keys.py FEATURES:
// bit i is its i-th letter): a feature the op lacks is a compile-time null or constant, so its code
// folds away; one it has is passed as given. A split-K op's instantiation has every bit set (ops.conv
// with_features): the generic kernel. Per U-Net call this took 3.1% off batch 1 on an 8-SM slice,
// 3.4% off batch 4 and 4.4% off batch 64 on the whole GPU (H200; docs/kernels.md, "Op features").
#define FT_ON(F, i) (((F) >> (i)) & 1)
// the activation as a compile-time constant (0 none, 1 GELU: the op has GELU iff bit 0), or -1 in the
// generic kernel (split-K: every bit set), whose `act` argument says
#define FT_ACT(F) (FT_ON(F, 6) ? -1 : FT_ON(F, 0))
#define CONV_FEATURE_ARGS(F)                                                                          \
    x_, Hin, Win, Cin, ldx, FT_ON(F, 3) ? xr_ : nullptr, FT_ON(F, 3) ? Cr : 0, ldr, w_, ldw, nk0,       \
    FT_ON(F, 3) ? nk1 : 0, bias, FT_ON(F, 1) ? tbias : nullptr, tb_stride, t_idx,                       \
    FT_ON(F, 2) ? gn_w : nullptr, FT_ON(F, 2) ? gn_b : nullptr, gn_fold, FT_ON(F, 2) ? gn_part : nullptr, \
    gn_P, gn_eps, FT_ON(F, 4) ? res_ : nullptr, ldres, out_, Hout, Wout, N, ldo,                        \
    FT_ON(F, 5) ? st_part : nullptr, FT_ON(F, 0) ? act : 0, psi_w, psi_b, FT_ON(F, 6) ? splits : 1, ws, counters, \
    FT_ON(F, 7) ? oscale : nullptr

// ---- shared pieces ------------------------------------------------------------------------------

// GroupNorm(1) of the input, from the producer's partials of sample b (merged by each warp on its
// own, gn_merge: `gp` holds the partials the kernel loaded at its entry), in one of two ways:
//
// Table (FOLD false): a per-channel scale/shift table in dynamic smem (8*Cin bytes), applied
// to every A vector (GnCoef): scale = gn_w * rstd, shift = gn_b - mean * scale. fp32: scale[Cin],
// shift[Cin] as floats. 16-bit: scale, shift_hi, shift_lo as S[Cin] each, for packed fma: shift_lo
// holds what S cannot of the shift, so that a large mean/std ratio costs no more than one rounding
// of the normalized value.
//
// Folded (FOLD: the 16-bit cp.async and halo convs' `_f` instantiations; runtime/ops/conv.py fold_norm
// decides and prepares it): the producer stores xs = gn_w * x (feature o, or the depthwise conv's
// oscale: rounded once, like any activation; its statistics are x's), the weights W stay as they
// are (no W * gn_w rounded to 16 bits: a fixed perturbation of the model that every sampling step
// repeats, docs/performance.md), the bias holds bias + P with P[n] = sum_k W[n][k] gn_b[c(k)], so that
//     conv(gn(x)) = rstd * sum_k W[n][k] xp[k]  -  mean * rstd * Q[n]  +  P[n],   Q[n] = sum_k W[n][k] gn_w[c(k)]
// holds when every padded tap reads xp = pad[c] = gn_w[c] mean - gn_b[c] / rstd: the value whose
// normalization is exactly 0, as the conv's zero padding of gn(x) wants. So the in-bounds A
// vectors are used as loaded (no pass over them: that pass measured
// ~20 us per batch-1 call and ~84 us at batch 16 on the H100), the padded ones are overwritten with the pad
// vector, the CTA scales its segment-0 sum by rstd once (scale_acc) and the epilogue adds the
// column term -mean * rstd * Q[n] with the bias (fcol: BN + 1 floats of static smem, the column
// term and then rstd, which the k loop reads from there rather than hold a register across it).
// gn_fold holds gn_w[Cin], gn_b[Cin], then Q[Npad] (in float64 from the uploaded W, so that mean * Q
// cancels what the GEMM accumulated). Dynamic smem: the pad vector table, S[Cin].
//
// The affine weights of the first PF * NT channels (4: 512 channels at 128 threads) and
// the column term's Q are loaded before the merge, so their latency overlaps the partials' instead
// of following it (one exposed global latency less). The only barrier publishes the tables.
template <class D, int NT, int PF, int BN, bool FOLD>
__device__ __forceinline__ void conv_gn_prologue(const float4 *gn_part, int gn_P, const GnPrefetch &gp, float gn_eps,
                                                 const float *gn_w, const float *gn_b, const float *gn_fold,
                                                 float *fcol, int Cin, int b, int n0) {
    constexpr bool fold = D::TC && FOLD;
    constexpr int QR = (BN + NT - 1) / NT;
    float pw[PF], pb[PF], q[QR];
#pragma unroll
    for (int r = 0; r < PF; ++r) {
        const int c = threadIdx.x + r * NT;
        pw[r] = c < Cin ? (fold ? gn_fold[c] : gn_w[c]) : 0.0f;
        pb[r] = c < Cin ? (fold ? gn_fold[Cin + c] : gn_b[c]) : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < QR; ++r) {   // Q is padded to Npad: in bounds for the CTA's BN columns
        const int c = threadIdx.x + r * NT;
        q[r] = (fold && c < BN) ? gn_fold[2 * Cin + n0 + c] : 0.0f;
    }
    const float2 mr = gn_merge(gn_part + (size_t)b * gn_P, gn_P, gp, gn_eps);
    const float mean = mr.x, rstd = mr.y;
    if constexpr (fold) {
        typename D::S *t = reinterpret_cast<typename D::S *>(dyn_smem);
        const float sd = 1.0f / rstd;
#pragma unroll
        for (int r = 0; r < PF; ++r) {
            const int c = threadIdx.x + r * NT;
            if (c < Cin) t[c] = D::from_f(fmaf(-pb[r], sd, pw[r] * mean));
        }
        for (int c = threadIdx.x + PF * NT; c < Cin; c += NT)
            t[c] = D::from_f(fmaf(-gn_fold[Cin + c], sd, gn_fold[c] * mean));
        const float mrs = -mean * rstd;
#pragma unroll
        for (int r = 0; r < QR; ++r) {
            const int c = threadIdx.x + r * NT;
            if (c < BN) fcol[c] = mrs * q[r];
        }
        if (threadIdx.x == 0) fcol[BN] = rstd;
    } else {
        auto put = [&](int c, float w, float bb) {
            const float s = w * rstd, sh = bb - mean * s;
            if constexpr (D::TC) {
                typename D::S *t = reinterpret_cast<typename D::S *>(dyn_smem);
                const typename D::S hi = D::from_f(sh);
                t[c] = D::from_f(s);
                t[Cin + c] = hi;
                t[2 * Cin + c] = D::from_f(sh - D::to_f(hi));
            } else {
                dyn_smem[c] = s;
                dyn_smem[Cin + c] = sh;
            }
        };
#pragma unroll
        for (int r = 0; r < PF; ++r) {
            const int c = threadIdx.x + r * NT;
            if (c < Cin) put(c, pw[r], pb[r]);
        }
        for (int c = threadIdx.x + PF * NT; c < Cin; c += NT) put(c, gn_w[c], gn_b[c]);   // wider than PF * NT
    }
    __syncthreads();
}

// The folded GroupNorm's rstd on the segment-0 sum (conv_gn_prologue): a CTA calls it once, after
// the mma of its last segment-0 k-tile (last_seg0_tile), before any residual_conv column joins the sum.
template <int A0, int A1, int A2>
__device__ __forceinline__ void scale_acc(float (&acc)[A0][A1][A2], float s) {
#pragma unroll
    for (int i = 0; i < A0; ++i)
#pragma unroll
        for (int j = 0; j < A1; ++j)
#pragma unroll
            for (int q = 0; q < A2; ++q) acc[i][j][q] *= s;
}

// The GELU of a thread's N accumulators (flat, in registers) in a loop that is not unrolled: G of
// them per trip, then the array rotates by G, so after N / G trips every value has had its GELU and
// sits where it was. The straight-line form (erff inlined once per accumulator: 32-64 copies of ~29
// instructions, half of a conv1 kernel's code) is fetched from L2 by every SM at every launch of
// the kernel; this one's ~16 copies stay in the instruction cache (docs/kernels.md, "Code size").
// The rotation costs N moves a trip.
template <int N> __device__ __forceinline__ void gelu_rolled(float *flat) {
    constexpr int G = N < 16 ? N : 16;
    static_assert(N % G == 0, "whole trips");
#pragma unroll 1
    for (int it = 0; it < N / G; ++it) {
        float x[G];
#pragma unroll
        for (int j = 0; j < G; ++j) x[j] = gelu_f(flat[j]);
#pragma unroll
        for (int j = 0; j < N - G; ++j) flat[j] = flat[j + G];
#pragma unroll
        for (int j = 0; j < G; ++j) flat[N - G + j] = x[j];
    }
}

// Whether k-tile kt, the i-th of the CTA's ntiles, is its last of segment 0 (from values the k loop
// holds anyway: no register of its own).
__device__ __forceinline__ bool last_seg0_tile(int kt, int i, int ntiles, int nk0) {
    return kt < nk0 && (kt + 1 == nk0 || i + 1 == ntiles);
}

// Bias (gates: bias and psi) of the CTA's BN output columns, loaded into registers at the start and
// published to smem (`ep`, 2 * BN floats: the bias plus the time bias, then psi or the output scale)
// by conv_finish with the time bias and the output scale (convs), which are loaded only then: the seed model's GEMM convs have none (the blocks' time bias is the depthwise
// conv's), and a register held across the k loop for it made ptxas spill at the 128-register cap
//. The epilogue then waits on no global load but the residual's.
// ON for the tensor-core kernels up to BN 128; off (loads in the epilogue) for the 256-wide gate,
// whose tiles fill the smem budget, and for FFMA, where ptxas then spilled.
template <int BN, int NT, bool GATE, bool ENABLE> struct EpiloguePrefetch {
    static constexpr bool ON = ENABLE && BN <= 128;
    static constexpr int R = ON ? (BN + NT - 1) / NT : 0;
    float bias[R > 0 ? R : 1], psi[GATE && R > 0 ? R : 1];
    __device__ __forceinline__ void load(const float *bias_, const float *psi_w, int n0) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int c = threadIdx.x + r * NT, n = n0 + c;
            bias[r] = c < BN ? bias_[n] : 0.0f;                    // bias and psi are padded to Npad
            if constexpr (GATE) psi[r] = c < BN ? psi_w[n] : 0.0f;
        }
    }
    __device__ __forceinline__ void publish(float *ep, const float *tbias, int tb_stride, const int *t_idx, int b,
                                            int n0, int N, const float *fcol, const float *oscale) const {
        const int row = (!GATE && tbias) ? t_idx[b] * tb_stride : 0;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int c = threadIdx.x + r * NT, n = n0 + c;
            if (c < BN) {
                float add = fcol ? bias[r] + fcol[c] : bias[r];   // fcol: the folded GroupNorm's column term
                if constexpr (GATE) {
                    ep[BN + c] = psi[r];
                } else {
                    if (tbias && n < N) add += tbias[row + n];
                    if (oscale) ep[BN + c] = oscale[n];           // padded to Npad
                }
                ep[c] = add;
            }
        }
    }
};

// The GroupNorm coefficients of one A vector (channels c..c+VEC-1), loaded from the prologue's table
// into registers once per k-tile, applied to each of the thread's rows: one expression for both
// kernels, so they round identically. 16-bit: v * scale + shift_hi, then + shift_lo, each a packed
// fma with one rounding (2 instructions per pair instead of 2 conversions, 2 FFMA and a pack);
// the normalized value is within about one rounding of the fp32 computation.
template <class D, int VEC, bool TC = D::TC> struct GnCoef {
    float sc[VEC], sh[VEC];
    __device__ __forceinline__ void load(int Cin, int c) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) { sc[j] = dyn_smem[c + j]; sh[j] = dyn_smem[Cin + c + j]; }
    }
    __device__ __forceinline__ void apply(Vec<typename D::S, VEC> &v) const {
#pragma unroll
        for (int j = 0; j < VEC; ++j) v.v[j] = D::from_f(D::to_f(v.v[j]) * sc[j] + sh[j]);
    }
};
template <class D, int VEC> struct GnCoef<D, VEC, true> {
    typedef typename D::S S;
    static constexpr int P = VEC / 2;   // packed pairs; an odd VEC (1) goes element by element
    union Pk { Vec<S, VEC> v; u32 p[P > 0 ? P : 1]; };
    Pk sc, hi, lo;
    __device__ __forceinline__ void load(int Cin, int c) {
        const S *t = reinterpret_cast<const S *>(dyn_smem) + c;   // c % VEC == 0, Cin % VEC == 0: aligned
        sc.v = vload<S, VEC>(t);
        hi.v = vload<S, VEC>(t + Cin);
        lo.v = vload<S, VEC>(t + 2 * Cin);
    }
    __device__ __forceinline__ void apply(Vec<S, VEC> &v) const {
        if constexpr (VEC % 2 == 0) {
            Pk x;
            x.v = v;
#pragma unroll
            for (int j = 0; j < P; ++j) x.p[j] = D::fma2(D::fma2(x.p[j], sc.p[j], hi.p[j]), D::ONE2, lo.p[j]);
            v = x.v;
        } else {
            const S one = (S)(D::ONE2 & 0xffffu);
#pragma unroll
            for (int j = 0; j < VEC; ++j) v.v[j] = D::fma1(D::fma1(v.v[j], sc.v.v[j], hi.v.v[j]), one, lo.v.v[j]);
        }
    }
};

// Element offsets of (row, k) in a [rows][BK] smem tile. Padded: rows of LD = BK + 8 halves
// (conflict-free ldmatrix, register-staged stores). Swizzled (conv_pipe.cu): rows of exactly BK,
// 16-byte chunk j of row r stored at chunk j ^ f(r), so the 8 rows of one ldmatrix phase and a
// warp's 16-byte cp.async writes hit distinct banks without the padding (20% less smem per stage).
template <int LD> struct PaddedTile {
    static constexpr int ROW = LD;
    static __device__ __forceinline__ int off(int r, int k) { return r * LD + k; }
};
template <int BK> struct SwizzledTile {
    static_assert(BK == 32 || BK == 64, "swizzle for 64- and 128-byte rows");
    static constexpr int ROW = BK;   // off(r + 8j, k) = off(r, k) + 8j * ROW: the swizzle repeats every 8 rows
    static __device__ __forceinline__ int off(int r, int k) {   // k: a multiple of 8
        const int f = BK == 64 ? (r & 7) : ((r >> 1) & 3);     // 128-byte rows: 8 chunks; 64: 2 rows per 128 B
        return r * BK + (((k >> 3) ^ f) << 3);
    }
};

// The A loader's thread -> (AP rows, one k vector) map, the same in conv_gemm and conv_gemm_pipe:
// thread tid owns k vector kv (VEC channels) of rows r0 + i * RPP; oy/ox locate each row's output
// pixel. ok is false only for the spare threads of a short tile (AP == 1); an invalid row (past M,
// or a spare thread's) gets an oy far out of range, so it fails every bounds test of the loaders.
template <int BM, int BK, int VEC, int NT> struct ARows {
    static constexpr int KV = BK / VEC, RPP = NT / KV, AP = (BM + RPP - 1) / RPP;
    static_assert(NT % KV == 0 && (BM % RPP == 0 || AP == 1) && AP <= 32, "A tile split");
    int kv, r0, oy[AP], ox[AP];
    bool ok;
    __device__ __forceinline__ ARows(int tid, int m0, int M, int Wout) : kv(tid % KV), r0(tid / KV), ok(r0 < BM) {
#pragma unroll
        for (int i = 0; i < AP; ++i) {
            const int m = ok ? m0 + r0 + i * RPP : M;
            const int q = div_small(m, Wout);
            oy[i] = m < M ? q : -(1 << 20);
            ox[i] = m < M ? m - q * Wout : 0;
        }
    }
};

// The ldmatrix addresses of one warp's fragments in a k-tile, as byte offsets from the tile's base
// (layouts LA, LB; warp tile rows arow / brow), computed once per kernel so that the k loop does no
// row or swizzle arithmetic: one offset per 16-deep k step for A and one for B; fragment j of a
// step lies 16 * j rows further (a row stride of the layout: both layouts' swizzle repeats every 8
// rows), a constant the ldmatrix instruction adds itself.
// KS > 1 (conv_pipe.cu's k slices): the warp of slice `slice` takes the k steps slice, slice + KS, ...
// PIN: each offset pinned (common.cuh pin), so that ptxas keeps it instead of rebuilding it from the
// lane for every ldmatrix of every k-tile (the 64 x 64 x 64 cp.async tile: 852 -> 776 instructions a
// three-k-tile trip of its loop, sm_87); not in the gates, where a 1 x 4-warp tile spilled for it.
template <class S, int BK, class LA, class LB, int KS = 1, bool PIN = true> struct FragOffsets {
    static_assert((BK / 16) % KS == 0, "k steps per slice");
    static constexpr int Q = BK / 16 / KS;   // k steps of the warp per k-tile
    u32 a[Q], b[Q];
    static constexpr u32 A16 = 16 * LA::ROW * sizeof(S), B16 = 16 * LB::ROW * sizeof(S);
    __device__ __forceinline__ FragOffsets(int arow, int brow, int lane, int slice = 0) {
#pragma unroll
        for (int q = 0; q < Q; ++q) {
            const int k = (q * KS + slice) * 16;
            a[q] = LA::off(arow + (lane & 15), k + (lane >> 4) * 8) * sizeof(S);
            b[q] = LB::off(brow + (lane & 7) + ((lane >> 4) << 3), k + ((lane >> 3) & 1) * 8) * sizeof(S);
            if constexpr (PIN) {
                pin(a[q]);
                pin(b[q]);
            }
        }
    }
};

template <int A0, int A1, int A2> __device__ __forceinline__ void zero_acc(float (&acc)[A0][A1][A2]) {
#pragma unroll
    for (int i = 0; i < A0; ++i)
#pragma unroll
        for (int j = 0; j < A1; ++j)
#pragma unroll
            for (int q = 0; q < A2; ++q) acc[i][j][q] = 0.0f;
}

// One 16-deep k step of a warp's tile: the caller's A fragments, the B fragments from smem at B
// (fragment pair np at np * b16 bytes further), then MF x NF mma.sync m16n8k16.
template <class D, int MF, int NF>
__device__ __forceinline__ void mma_kstep(float (&acc)[MF][NF][4], const u32 (&af)[MF][4], saddr B, u32 b16) {
    u32 bf[NF][2];
#pragma unroll
    for (int np = 0; np < NF / 2; ++np) {
        u32 r[4];
        ldmatrix_x4(r, B + np * b16);
        bf[2 * np][0] = r[0]; bf[2 * np][1] = r[1];
        bf[2 * np + 1][0] = r[2]; bf[2 * np + 1][1] = r[3];
    }
#pragma unroll
    for (int mf = 0; mf < MF; ++mf)
#pragma unroll
        for (int nf = 0; nf < NF; ++nf) D::mma(acc[mf][nf], af[mf], bf[nf]);
}

// One k-tile of a warp's WTM x WTN tile at smem tiles A, B (the warp's F::Q k steps of it):
// ldmatrix fragments, mma.sync m16n8k16.
template <class D, int MF, int NF, class F>
__device__ __forceinline__ void mma_ktile(float (&acc)[MF][NF][4], saddr A, saddr B, const F &f) {
#pragma unroll
    for (int q = 0; q < F::Q; ++q) {
        u32 af[MF][4];
#pragma unroll
        for (int mf = 0; mf < MF; ++mf) ldmatrix_x4(af[mf], A + f.a[q] + mf * F::A16);
        mma_kstep<D, MF, NF>(acc, af, B + f.b[q], F::B16);
    }
}

// The N x N transpose (N 2 or 4) of a[0..N-1] over N neighbouring lanes (the lane's place among them:
// t mod N): afterwards lane t holds, in a[j], what lane j of its group held in a[t mod N]. One shuffle
// round per bit of N - 1 (lanes t ^ 1, then t ^ 2), each trading the words whose index differs from t
// in that bit.
template <int N>
__device__ __forceinline__ void lane_transpose(u32 *a, int t) {
#pragma unroll
    for (int bit = 1; bit < N; bit <<= 1) {
        const bool hi = t & bit;
#pragma unroll
        for (int k = 0; k < N; ++k) {
            if (k & bit) continue;
            const u32 r = __shfl_xor_sync(0xffffffffu, hi ? a[k] : a[k + bit], bit);
            if (hi) a[k] = r; else a[k + bit] = r;
        }
    }
}

// After the k loop: the split-K merge, then the epilogue (conv or gate) and the statistics.
// acc is [MF][NF][4] (tensor cores) or [TM][TN][1] (FFMA); m-tile mt of mtiles, K split sk; `red`
// (33 floats) is the kernel's static smem scratch for the statistics; `pre` the prefetched bias
// and time bias; `fcol` the folded GroupNorm's column term (conv_gn_prologue), nullptr without one
// (it needs the prefetch: EP and BN <= 128, which the host checks). UPS 2: conv_pipe.cu's sub-pixel
// up2 convs, whose row m is output pixel (2 iy + py, 2 ix + px) of its parity class (SubPixel there).
// UPS 3: conv_halo.cu's row tiles, whose warp wm holds pixels wm * 16 .. of each of the tile's rows.
// ACT: the activation known at compile time (FT_ACT: 0 or 1), or -1 (the generic kernel: `act`).
// WHOLE: whether the tile's rows and columns all lie in the output. 2: always (the row tiles: the host
// keeps M and N multiples of their tile); 1: tested per tile, where the 16-byte stores below apply (a
// second copy of the epilogue's loops); 0: never assumed (the GEMM-tile halo conv: with the second
// copy, sm_87 ptxas spilled 28 bytes in its 128x64 split-K instance).
template <class D, int BM, int BN, int WM, int WN, int VEC, int GATE, int UPS, int WHOLE, int ACT, int A0, int A1, int A2, bool EP>
__device__ __forceinline__ void conv_finish(float (&acc)[A0][A1][A2], int mtiles, int mt, int sk, float *red,
                                            const EpiloguePrefetch<BN, 32 * WM * WN, (GATE != 0), EP> &pre,
                                            const float *fcol, CONV_PARAMS) {
    typedef typename D::S S;
    constexpr bool TC = D::TC;
    constexpr int NT = 32 * WM * WN;
    constexpr int WTM = BM / WM, WTN = BN / WN, MF = TC ? WTM / 16 : 1, NF = TC ? WTN / 8 : 1;
    constexpr int TXN = NT / 16, TM = TC ? 1 : BM / 16, TN = TC ? 1 : BN / TXN;
    static_assert(A0 == (TC ? MF : TM) && A1 == (TC ? NF : TN) && A2 == (TC ? 4 : 1), "accumulator shape");
    const S *xr = (const S *)xr_, *res = (const S *)res_;
    S *out = (S *)out_;
    const int tid = threadIdx.x, b = blockIdx.z, lane = tid & 31, warp = tid >> 5;
    const int M = Hout * Wout, m0 = mt * BM, n0 = blockIdx.y * BN;
    const int wm = warp / WN, wn = warp % WN;   // TC warp position
    const int tx = tid % TXN, ty = tid / TXN;   // FFMA thread position

    // ---- split-K: every split stores its partial tile; the last to arrive (per-tile counter) sums
    // all of them in split order (deterministic) and runs the epilogue; it re-arms the counter, so
    // the next launch or CUDA-graph replay starts from zero. Partials stay in per-thread order.
    if (splits > 1) {
        constexpr int NACC = (TC ? MF * NF * 4 : TM * TN);
        const int tile = (b * gridDim.y + blockIdx.y) * mtiles + mt;
        float *wt_tile = ws + (size_t)tile * splits * NT * NACC;
        float *flat = &acc[0][0][0];
#pragma unroll
        for (int i = 0; i < NACC; i += 4)
            *reinterpret_cast<float4 *>(wt_tile + ((size_t)sk * NACC + i) * NT + tid * 4) =
                make_float4(flat[i], flat[i + 1], flat[i + 2], flat[i + 3]);
        // The ticket by thread 0 alone, an acquire-release atomic between two barriers (common.cuh,
        // atomic_add_acq_rel; the pattern of CUTLASS's split-K semaphore): the first barrier orders
        // every thread's partial before the release, the second the last CTA's reads after the
        // acquire. (A __threadfence in every thread was ~4% of a batch-1 split-K conv's stall samples
        // in Nsight Compute; thread 0's __threadfence + atomicAdd and the last CTA's per-thread fence
        // cost ~0.3 us per split-K launch more than this at batch 1.)
        __syncthreads();
        __shared__ int last;
        if (tid == 0) last = atomic_add_acq_rel(&counters[tile], 1) == splits - 1;
        __syncthreads();
        if (!last) return;
#pragma unroll
        for (int i = 0; i < NACC; ++i) flat[i] = 0.0f;
#pragma unroll 4
        for (int q = 0; q < splits; ++q) {   // unrolled: 4 splits' loads in flight, not one
#pragma unroll
            for (int i = 0; i < NACC; i += 4) {
                const float4 v = __ldcg(reinterpret_cast<const float4 *>(wt_tile + ((size_t)q * NACC + i) * NT + tid * 4));
                flat[i] += v.x; flat[i + 1] += v.y; flat[i + 2] += v.z; flat[i + 3] += v.w;
            }
        }
        if (tid == 0) counters[tile] = 0;
    }

    // bias (plus the time bias where the prefetch ran), then psi (gate) or the output scale (conv)
    // of the tile's columns: from smem where the prefetch ran, else from global memory
    constexpr bool ON = EpiloguePrefetch<BN, NT, (GATE != 0), EP>::ON;
    __shared__ __align__(8) float ep[ON ? 2 * BN : 1];   // 8: the scale pairs are float2 loads
    const float *ebias = ep, *esecond = ep + BN;
    const float *const escale = ON ? esecond : oscale + n0;   // read only with oscale
    if constexpr (ON) {
        pre.publish(ep, tbias, tb_stride, t_idx, b, n0, N, fcol, oscale);
        __syncthreads();
    } else {
        ebias = bias + n0;
        esecond = psi_w + n0;
    }

    // ---- epilogue: each thread owns NPAIR pairs of adjacent columns; pair p -> (row slot ri, tile
    // row r, tile col c) and a pointer to its two accumulators (constant indices once unrolled).
    constexpr int NPAIR = TC ? MF * NF * 2 : TM * (TN / 2);
    auto pair_at = [&](int p, int &ri, int &r, int &c) -> float * {
        if constexpr (TC) {
            const int mf = p / (NF * 2), nf = (p / 2) % NF, h = p & 1;
            ri = mf * 2 + h;
            r = wm * WTM + mf * 16 + (lane >> 2) + 8 * h;
            c = wn * WTN + nf * 8 + (lane & 3) * 2;
            return &acc[mf][nf][2 * h];
        } else {
            const int i = p / (TN / 2), j = (p % (TN / 2)) * 2;
            ri = i;
            r = ty + 16 * i;
            c = tx * TN + j;
            return &acc[i][j][0];   // acc[i][j+1][0] is the next float: the last extent is 1
        }
    };

    if constexpr (GATE != 0) {
        constexpr int SLOTS = TC ? WN : TXN;
        __shared__ float gred[SLOTS * BM];
        __shared__ float gsig[BM];
        float rsum[TC ? MF * 2 : TM];
#pragma unroll
        for (int i = 0; i < (TC ? MF * 2 : TM); ++i) rsum[i] = 0.0f;
#pragma unroll
        for (int p = 0; p < NPAIR; ++p) {   // padded columns have psi 0
            int ri, r, c;
            const float *v = pair_at(p, ri, r, c);
            rsum[ri] += fmaxf(v[0] + ebias[c], 0.0f) * esecond[c] + fmaxf(v[1] + ebias[c + 1], 0.0f) * esecond[c + 1];
        }
#pragma unroll
        for (int i = 0; i < (TC ? MF * 2 : TM); ++i) {
            float s = rsum[i];
            if constexpr (TC) {
                s += __shfl_xor_sync(0xffffffffu, s, 1);
                s += __shfl_xor_sync(0xffffffffu, s, 2);
                if ((lane & 3) == 0) gred[wn * BM + wm * WTM + (i >> 1) * 16 + (lane >> 2) + 8 * (i & 1)] = s;
            } else {
                gred[tx * BM + ty + 16 * i] = s;
            }
        }
        __syncthreads();
        if constexpr (GATE == 1) {
            for (int r = tid; r < BM; r += NT) {
                float s = psi_b;
                for (int q = 0; q < SLOTS; ++q) s += gred[q * BM + r];
                gsig[r] = 1.0f / (1.0f + expf(-s));
            }
        } else {
            // GATE 2, N split over gridDim.y CTAs (a 256-wide gate at batch 1: one CTA's split-K merge
            // of full-width partial tiles was its critical path): each stores its rows' partial psi
            // sums after the split-K region of the workspace, and the last of the m tile's CTAs to
            // arrive (its own ticket after the split-K counters, the same acquire-release pattern)
            // adds them in column-tile order (deterministic), takes the sigmoid and scales the skip
            // rows. Its own instantiations (ConvKey.nsplit), so the one-CTA gates compile as before.
            const size_t split_tiles = splits > 1 ? (size_t)gridDim.z * gridDim.y * mtiles : 0;
            float *part = ws + split_tiles * splits * BM * BN + ((size_t)b * mtiles + mt) * gridDim.y * BM;
            int *ticket = counters + split_tiles + b * mtiles + mt;
            for (int r = tid; r < BM; r += NT) {
                float s = 0.0f;
                for (int q = 0; q < SLOTS; ++q) s += gred[q * BM + r];
                part[blockIdx.y * BM + r] = s;
            }
            __syncthreads();
            __shared__ int last_n;
            if (tid == 0) last_n = atomic_add_acq_rel(ticket, 1) == (int)gridDim.y - 1;
            __syncthreads();
            if (!last_n) return;
            for (int r = tid; r < BM; r += NT) {
                float s = psi_b;
                for (int q = 0; q < (int)gridDim.y; ++q) s += __ldcg(part + q * BM + r);
                gsig[r] = 1.0f / (1.0f + expf(-s));
            }
            if (tid == 0) *ticket = 0;
        }
        __syncthreads();
        const int cv = Cr / VEC;
        for (int i = tid; i < BM * cv; i += NT) {
            const int r = i / cv, c = (i - r * cv) * VEC, m = m0 + r;
            if (m >= M) continue;
            Vec<S, VEC> v = vload<S, VEC>(xr + ((size_t)b * M + m) * ldr + c);
            const float g = gsig[r];
#pragma unroll
            for (int j = 0; j < VEC; ++j) v.v[j] = D::from_f(D::to_f(v.v[j]) * g);
            vstore<S, VEC>(out + ((size_t)b * M + m) * ldo + c, v);
        }
        return;
    } else {
        float lsum = 0.0f;
        const float *tb = (!ON && tbias) ? tbias + t_idx[b] * tb_stride : nullptr;   // one load, not per pair
        // bias and time bias of pair p (in place)
        auto bias_pair = [&](int p) {
            int ri, r, c;
            float *v = pair_at(p, ri, r, c);
            float v0 = v[0] + ebias[c], v1 = v[1] + ebias[c + 1];   // bias is padded to Npad
            if (!ON && tb) {
                const int m = m0 + r, n = n0 + c;
                if (m < M && n < N) v0 += tb[n];
                if (m < M && n + 1 < N) v1 += tb[n + 1];
            }
            v[0] = v0;
            v[1] = v1;
        };
        // every pair's bias, then the GELU where `gelu` (decided once: the generic split-K kernel's
        // `act` is a runtime value)
        auto prep = [&](const bool gelu) {
#pragma unroll
            for (int p = 0; p < NPAIR; ++p) bias_pair(p);
            if (gelu) gelu_rolled<A0 * A1 * A2>(&acc[0][0][0]);
        };
        // Addresses from the tile's (0, 0) by 32-bit offsets r * ld + c (a sample's view stays under
        // 2^31 elements, as the loaders assume): per pair a constant past its row's offset. The
        // 64-bit (b * M + m) * ld + n of each pair was ~12 instructions per stored pair (Nsight
        // Compute).
        const size_t tile0 = (size_t)b * M + (UPS != 2 ? m0 : 0);
        S *const outt = out + tile0 * ldo + n0;
        const S *const rest = res ? res + tile0 * ldres + n0 : nullptr;
        // the output pixel of tile row r, from the tile's (UPS 1, 3) or the sample's (UPS 2) first pixel
        const int sub_cls = UPS == 2 ? div_small(m0, Hin * Win) : 0, sub_m = m0 - sub_cls * Hin * Win;
        auto pix = [&](int r) -> int {
            if constexpr (UPS == 1) {
                return r;
            } else if constexpr (UPS == 3) {   // r = wm * WTM + row * 16 + i: pixel wm * 16 + i of the tile's row
                const unsigned u = r;          // unsigned: WTM = 16 TH, a power of two, so masks and shifts
                return (int)(((u % WTM) >> 4) * Wout + (u / WTM) * 16 + (u & 15));
            } else {
                const int mi = sub_m + r, iy = div_small(mi, Win);
                return (2 * iy + (sub_cls >> 1)) * Wout + 2 * (mi - iy * Win) + (sub_cls & 1);
            }
        };
        // the residual, store and sum of pair p (after prep), each element tested against M and N
        auto store_pair = [&](int p) {
            int ri, r, c;
            float *v = pair_at(p, ri, r, c);
            float v0 = v[0], v1 = v[1];
            const int m = m0 + r, n = n0 + c;
            const bool ok0 = m < M && n < N, ok1 = m < M && n + 1 < N;
            const int q = pix(r);
            if (rest) {
                if (ok0) v0 += D::to_f(rest[q * ldres + c]);
                if (ok1) v1 += D::to_f(rest[q * ldres + c + 1]);
            }
            S *const o = outt + (q * ldo + c);
            float s0 = v0, s1 = v1;   // as stored: times the next conv's gn_w with oscale (padded to Npad)
            if (oscale) {   // c is even, smem and oscale 8-byte aligned: one load for the pair
                const float2 o2 = *reinterpret_cast<const float2 *>(escale + c);
                s0 *= o2.x;
                s1 *= o2.y;
            }
            if (VEC > 1 && ok1) {   // VEC > 1: N, ldo and the view offset are even (checked on the host)
                Vec<S, 2> w; w.v[0] = D::from_f(s0); w.v[1] = D::from_f(s1);
                vstore<S, 2>(o, w);
            } else {
                if (ok0) o[0] = D::from_f(s0);
                if (ok1) o[1] = D::from_f(s1);
            }
            lsum += (ok0 ? v0 : 0.0f) + (ok1 ? v1 : 0.0f);
            v[0] = v0;
            v[1] = v1;
        };
        // First every pair's bias, then the GELU of all of them (prep: decided once, not by an `act`
        // test per pair, since the generic split-K kernel's `act` is a runtime value; gelu_rolled).
        // Then the stores. A whole tile of 16-bit outputs whose warp tile spans a multiple of 16
        // columns (QW), in an instantiation that knows its activation (ACT 0 or 1), takes one pass per
        // pair for the residual and sum (the same values in the same order), and each quad of
        // lanes then transposes its row's words (lane_transpose: 4 x 4 where the warp tile spans a
        // multiple of 32 columns, else 2 x 2 between lane pairs) so that a lane holds 8 (4)
        // consecutive channels and stores them with one 16-byte (8-byte) store (VEC 8: the output
        // view's offset and pixel stride are multiples of 8 elements): a quarter (half) of the store
        // instructions, no bounds tests. Why: with the tests folded away but 4-byte stores, ptxas bunched 32 stores
        // per thread at the end of the epilogue, which cost the 64x64 level's row-tile conv1 4.5 us
        // at batch 64 (H200) though the loop had half the instructions; with the 16-byte stores the
        // same op went from 93.4 to 84.4 us (docs/kernels.md).
        // Every other tile: the residual, stores and sum pair by pair, with the bounds tests even
        // where the tile is whole (their branches space the 4-byte stores: folded away, the row
        // tiles of 16-channel warp tiles lost 3-4 us at batch 4 and 64).
        constexpr int QW = NF % 4 == 0 ? 4 : NF % 2 == 0 ? 2 : 0;   // words per lane transpose
        constexpr bool Q16 = TC && ACT >= 0 && WHOLE > 0 && sizeof(S) == 2 && VEC == 8 && QW > 0;
        const bool whole = WHOLE == 2 || (Q16 && m0 + BM <= M && n0 + BN <= N);
        auto pass16 = [&]() {
            const int t = lane & 3;
#pragma unroll
            for (int mf = 0; mf < (Q16 ? MF : 0); ++mf) {
                u32 w[2][NF];
#pragma unroll
                for (int nf = 0; nf < NF; ++nf)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {   // pair_at's order: p = (mf * NF + nf) * 2 + h
                        const int p = (mf * NF + nf) * 2 + h;
                        int ri, r, c;
                        float *v = pair_at(p, ri, r, c);
                        float v0 = v[0], v1 = v[1];   // after prep
                        if (rest) {
                            const int q = pix(r);
                            v0 += D::to_f(rest[q * ldres + c]);
                            v1 += D::to_f(rest[q * ldres + c + 1]);
                        }
                        lsum += v0 + v1;
                        v[0] = v0;
                        v[1] = v1;
                        if (oscale) {   // as store_pair stores them
                            const float2 o2 = *reinterpret_cast<const float2 *>(escale + c);
                            v0 *= o2.x;
                            v1 *= o2.y;
                        }
                        w[h][nf] = (u32)D::from_f(v0) | ((u32)D::from_f(v1) << 16);
                    }
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    int ri, r, c;
                    pair_at((mf * NF) * 2 + h, ri, r, c);
                    // a group of QW n-fragments is 8 QW columns; lane t's channels in it: 8 t (QW 4),
                    // or 4 (t >> 1) + 8 (t & 1) (QW 2: the even lane of a pair has fragment 0's)
                    S *const o = outt + (pix(r) * ldo + wn * WTN + (QW == 4 ? 8 * t : 4 * (t >> 1) + 8 * (t & 1)));
#pragma unroll
                    for (int g = 0; g < (QW ? NF / QW : 0); ++g) {
                        u32 *const a = &w[h][QW * g];
                        lane_transpose<QW>(a, t);
                        if constexpr (QW == 4) *reinterpret_cast<uint4 *>(o + 32 * g) = make_uint4(a[0], a[1], a[2], a[3]);
                        else *reinterpret_cast<uint2 *>(o + 16 * g) = make_uint2(a[0], a[1]);
                    }
                }
            }
        };
        if (ACT == 1 || (ACT < 0 && act == 1)) prep(true); else prep(false);
        if (Q16 && whole) {
            pass16();
        } else {
#pragma unroll
            for (int p = 0; p < NPAIR; ++p) store_pair(p);   // tested even in a whole tile: see above
        }
        if (st_part) {   // GroupNorm partials of this tile: count, sum, M2 about the tile mean
            const float cnt = (float)(min(BM, M - m0) * min(BN, N - n0));
            const float tsum = block_sum(lsum, red), tmean = __fdividef(tsum, cnt);   // within 2 ulp: M2 grows by n * err^2
            auto m2 = [&](const bool all) {
                float lm2 = 0.0f;
#pragma unroll
                for (int p = 0; p < NPAIR; ++p) {
                    int ri, r, c;
                    const float *v = pair_at(p, ri, r, c);
                    const int m = m0 + r, n = n0 + c;
                    if (all || (m < M && n < N)) lm2 += (v[0] - tmean) * (v[0] - tmean);
                    if (all || (m < M && n + 1 < N)) lm2 += (v[1] - tmean) * (v[1] - tmean);
                }
                return lm2;
            };
            const float tm2 = block_sum(whole ? m2(true) : m2(false), red);
            if (tid == 0)
                st_part[(size_t)b * mtiles * gridDim.y + blockIdx.y * mtiles + mt] =
                    make_float4(cnt, tsum, tm2, 0.0f);
        }
    }
}

// ---- the kernel: register-staged double buffering ---------------------------------------------
template <class D, int BM, int BN, int BK, int WM, int WN, int KH, int ST, int UP, int VEC, int GATE, int ACT>
__device__ __forceinline__ void conv_gemm(CONV_PARAMS) {
    typedef typename D::S S;
    constexpr bool TC = D::TC;
    constexpr int NT = 32 * WM * WN;
    static_assert(BK % 16 == 0 && (TC || BK == 16), "K tile");
    constexpr int PAD = ST == 1 ? KH / 2 : 0;
    // smem tiles. TC: As[BM][BK+8], Bs[BN][BK+8] (k contiguous; +8 halves = conflict-free ldmatrix)
    //             FFMA: As[BK][BM+4], Bs[BK][BN+4] (m / n contiguous for broadcast + float4 reads)
    constexpr int LDA = TC ? BK + 8 : BM + 4;
    constexpr int LDB = TC ? BK + 8 : BN + 4;
    constexpr int A_SZ = TC ? BM * LDA : BK * LDA;
    constexpr int B_SZ = TC ? BN * LDB : BK * LDB;
    __shared__ __align__(16) S As[2][A_SZ];
    __shared__ __align__(16) S Bs[2][B_SZ];
    __shared__ float red[33];   // block_sum scratch (the statistics epilogue)

    const S *x = (const S *)x_, *xr = (const S *)xr_, *wt = (const S *)w_;
    const int tid = threadIdx.x, b = blockIdx.z;
    const GnPrefetch gp(gn_part ? gn_part + (size_t)b * gn_P : nullptr, gn_P);   // first: its latency overlaps the set-up
    // split-K: grid.x = m-tiles * splits; split `sk` owns k-tiles [kb, ke) of the nk0 + nk1
    const int M = Hout * Wout, mtiles = (M + BM - 1) / BM;
    const int sk = div_small(blockIdx.x, mtiles), mt = blockIdx.x - sk * mtiles;
    const int m0 = mt * BM, n0 = blockIdx.y * BN;
    const bool norm = gn_part != nullptr;

    EpiloguePrefetch<BN, NT, (GATE != 0), TC> pre;
    pre.load(bias, psi_w, n0);

    // ---- prologue: GroupNorm(1) of the input as a per-channel scale/shift -------------------------
    if (norm) conv_gn_prologue<D, NT, 4, BN, false>(gn_part, gn_P, gp, gn_eps, gn_w, gn_b, nullptr, nullptr, Cin, b, n0);

    // ---- A (activations) loader: each thread owns AP rows at a fixed k offset kv*VEC ------------
    typedef ARows<BM, BK, VEC, NT> AR;
    constexpr int RPP = AR::RPP, AP = AR::AP;
    const AR ar(tid, m0, M, Wout);
    const int kv = ar.kv, r0 = ar.r0;
    const bool a_row_ok = ar.ok;
    const int(&oy)[AP] = ar.oy;
    const int(&ox)[AP] = ar.ox;
    Vec<S, VEC> areg[AP];
    u32 amask = 0;   // rows whose vector is real data (normalized at store time)
    int a_c = -1;    // channel of this thread's vectors in segment 0, -1 in segment 1

    auto load_a = [&](int kt) {
        amask = 0;
        if (kt < nk0) {
            const int k = kt * BK + kv * VEC;
            const int tap = div_small(k, Cin), c = k - tap * Cin;
            const int ky = tap / KH, kx = tap - (tap / KH) * KH;
            const bool kok = tap < KH * KH;
            a_c = c;
#pragma unroll
            for (int i = 0; i < AP; ++i) {
                const int vy = oy[i] * ST + ky - PAD, vx = ox[i] * ST + kx - PAD;
                const bool ok = kok && vy >= 0 && vy < Hin * UP && vx >= 0 && vx < Win * UP;
                if (ok) {
                    const int iy = UP == 2 ? (vy >> 1) : vy, ix = UP == 2 ? (vx >> 1) : vx;
                    areg[i] = vload<S, VEC>(x + ((size_t)(b * Hin + iy) * Win + ix) * ldx + c);
                    amask |= 1u << i;
                } else {
                    areg[i] = vzero<S, VEC>();
                }
            }
        } else {
            const int c = (kt - nk0) * BK + kv * VEC;
            a_c = -1;
#pragma unroll
            for (int i = 0; i < AP; ++i) {
                const int m = m0 + r0 + i * RPP;
                areg[i] = (a_row_ok && m < M && c < Cr) ? vload<S, VEC>(xr + ((size_t)b * M + m) * ldr + c)
                                            : vzero<S, VEC>();
            }
        }
    };

    auto store_a = [&](int buf) {
        GnCoef<D, VEC> g;
        if (norm && a_c >= 0) g.load(Cin, a_c);
#pragma unroll
        for (int i = 0; i < AP; ++i) {
            Vec<S, VEC> v = areg[i];
            if (norm && a_c >= 0 && ((amask >> i) & 1u)) g.apply(v);
            const int row = r0 + i * RPP;
            if (!a_row_ok) break;
            if constexpr (TC) {
                vstore<S, VEC>(&As[buf][row * LDA + kv * VEC], v);
            } else {
#pragma unroll
                for (int j = 0; j < VEC; ++j) As[buf][(kv * VEC + j) * LDA + row] = v.v[j];
            }
        }
    };

    // ---- B (weights) loader: padded on upload, so never out of bounds; 16-byte vectors ---------
    constexpr int VB = 16 / (int)sizeof(S);
    constexpr int BVEC = BN * BK / VB, BP = BVEC / NT;
    static_assert(BVEC % NT == 0, "B tile split");
    Vec<S, VB> breg[BP];
    auto load_b = [&](int kt) {
#pragma unroll
        for (int i = 0; i < BP; ++i) {
            const int v = tid + i * NT;
            if constexpr (TC) {   // row n, k offset
                const int n = v / (BK / VB), kk = (v % (BK / VB)) * VB;
                breg[i] = vload<S, VB>(wt + (size_t)(n0 + n) * ldw + kt * BK + kk);
            } else {              // row k, n offset
                const int kk = v / (BN / VB), n = (v % (BN / VB)) * VB;
                breg[i] = vload<S, VB>(wt + (size_t)(kt * BK + kk) * ldw + n0 + n);
            }
        }
    };
    auto store_b = [&](int buf) {
#pragma unroll
        for (int i = 0; i < BP; ++i) {
            const int v = tid + i * NT;
            if constexpr (TC) {
                const int n = v / (BK / VB), kk = (v % (BK / VB)) * VB;
                vstore<S, VB>(&Bs[buf][n * LDB + kk], breg[i]);
            } else {
                const int kk = v / (BN / VB), n = (v % (BN / VB)) * VB;
                vstore<S, VB>(&Bs[buf][kk * LDB + n], breg[i]);
            }
        }
    };

    // ---- compute ------------------------------------------------------------------------------
    const int lane = tid & 31, warp = tid >> 5;
    constexpr int WTM = BM / WM, WTN = BN / WN, MF = TC ? WTM / 16 : 1, NF = TC ? WTN / 8 : 1;
    constexpr int TXN = NT / 16, TM = TC ? 1 : BM / 16, TN = TC ? 1 : BN / TXN;
    static_assert(!TC || (WTM % 16 == 0 && WTN % 16 == 0), "warp tile");
    static_assert(TC || (BM % 16 == 0 && TN % 4 == 0), "thread tile");
    const int wm = warp / WN, wn = warp % WN;   // TC warp position
    const int tx = tid % TXN, ty = tid / TXN;   // FFMA thread position
    float acc[TC ? MF : TM][TC ? NF : TN][TC ? 4 : 1];
    zero_acc(acc);

    typedef FragOffsets<S, BK, PaddedTile<LDA>, PaddedTile<LDB>> FO;
    const FO fo(wm * WTM, wn * WTN, lane);
    auto compute = [&](int buf) {
        const S *A = As[buf], *B = Bs[buf];
        if constexpr (TC) {
            mma_ktile<D, MF, NF>(acc, smem_u32(As[0]) + buf * (A_SZ * (u32)sizeof(S)),
                                     smem_u32(Bs[0]) + buf * (B_SZ * (u32)sizeof(S)), fo);
        } else {
#pragma unroll
            for (int k = 0; k < BK; ++k) {
                float a[TM], bb[TN];
#pragma unroll
                for (int i = 0; i < TM; ++i) a[i] = D::to_f(A[k * LDA + ty + 16 * i]);
#pragma unroll
                for (int j = 0; j < TN; j += 4) {
                    const float4 q = *reinterpret_cast<const float4 *>(&B[k * LDB + tx * TN + j]);
                    bb[j] = q.x; bb[j + 1] = q.y; bb[j + 2] = q.z; bb[j + 3] = q.w;
                }
#pragma unroll
                for (int i = 0; i < TM; ++i)
#pragma unroll
                    for (int j = 0; j < TN; ++j) acc[i][j][0] = fmaf(a[i], bb[j], acc[i][j][0]);
            }
        }
    };

    const int nk = nk0 + nk1, kb = div_small(sk * nk, splits), ke = div_small((sk + 1) * nk, splits);
    load_a(kb); load_b(kb); store_a(0); store_b(0);
    __syncthreads();
    for (int kt = kb; kt < ke; ++kt) {
        const int cur = (kt - kb) & 1;
        if (kt + 1 < ke) { load_a(kt + 1); load_b(kt + 1); }   // in flight during the MMAs
        compute(cur);
        if (kt + 1 < ke) { store_a(cur ^ 1); store_b(cur ^ 1); }
        __syncthreads();   // one barrier: the other buffer was last read before the previous one
    }

    conv_finish<D, BM, BN, WM, WN, VEC, GATE, 1, 1, ACT>(acc, mtiles, mt, sk, red, pre, nullptr, CONV_ARGS);
}

// One extern "C" kernel per instantiation (cache-friendly on every CuPy version); the host
// generates the list from the plan's distinct shapes (runtime/gpu/kernels.py).
#define CONV_INSTANCE(name, D, BM, BN, BK, WM, WN, KH, ST, UP, VEC, GATE, F)                   \
    extern "C" __global__ void __launch_bounds__(32 * WM * WN) name(CONV_PARAMS) {           \
        conv_gemm<D, BM, BN, BK, WM, WN, KH, ST, UP, VEC, GATE, FT_ACT(F)>(CONV_FEATURE_ARGS(F));       \
    }

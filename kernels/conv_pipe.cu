// conv_pipe.cu: conv_gemm (conv.cu) with a cp.async multi-stage shared-memory pipeline. The default
// for 16-bit vectorized convs and gates (3 stages; JETSON_UNET_CONV_STAGES, runtime/gpu/ops.py; 0
// turns it off): the loader appends this file after conv.cu only to modules that instantiate it.
//
// Computes exactly what conv_gemm computes (same GEMM, K order, in_map, fused GroupNorm, residual K
// segment, split-K, epilogue and statistics: those are conv.cu's shared device functions), for
// fp16/bf16 with 16-byte vectors (channels % 8 == 0, 16-byte aligned strides and view offsets);
// everything else keeps conv_gemm. Same parameter list (CONV_PARAMS) and launch shape: grid
// (ceil(M/BM) * splits, ceil(N/BN), B), block 32*WM*WN, dynamic smem as conv.cu (the folded GroupNorm's tap table).
//
// Why: conv_gemm stages one k-tile in registers, so every k-tile costs one exposed global-memory
// latency (docs/perf-notes.md: ~60 TFLOP/s at batch 16 on an H200, ~14 us per GEMM conv at batch
// 1). Here STAGES-1 k-tiles are in flight while the tensor cores work on the oldest:
//   cp.async.cg 16 B global -> smem (zero-fill: src-size 0 for padded taps, rows past M, K
//   padding), commit_group per k-tile, wait_group STAGES-2, one barrier per k-tile; ldmatrix +
//   mma.sync m16n8k16 through conv.cu's mma_ktile. sm_80+ only (valid on sm_87); nothing of Hopper.
// Smem: a ring of STAGES x (A[BM][BK] + B[BN][BK]) 16-bit tiles, XOR-swizzled (SwizzledTile)
//   instead of padded; the host (ops.pipe_tile) keeps the ring <= 40 KB so that ring + GroupNorm
//   scale/shift + scratch stays under the 48 KB of static + dynamic smem that needs no opt-in, and
//   two CTAs fit on an SM with 100 KB.
// GroupNorm: folded into the weights and the epilogue (conv.cu, "GroupNorm, folded"): cp.async
//   moves raw activations, nothing touches A in shared memory, and the statistics merge runs after
//   the first STAGES-1 tiles are issued, its result needed only where segment 0 ends.
// Reference: runtime.reference.run_conv / run_gate (as conv.cu).

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool full) {
    // src-size 0: nothing is read, the 16 bytes are zero-filled (padding and out-of-bounds rows)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem),
                 "r"(full ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

template <class D, int BM, int BN, int BK, int WM, int WN, int KH, int ST, int UP, int VEC, bool GATE, int STAGES>
__device__ __forceinline__ void conv_gemm_pipe(CONV_PARAMS) {
    typedef typename D::S S;
    typedef SwizzledTile<BK> L;
    static_assert(D::TC && VEC * sizeof(S) == 16, "16-bit types with 16-byte vectors only");
    static_assert(STAGES >= 2, "at least two stages");
    constexpr int NT = 32 * WM * WN;
    constexpr int PAD = ST == 1 ? KH / 2 : 0;
    __shared__ __align__(128) S As[STAGES][BM * BK];
    __shared__ __align__(128) S Bs[STAGES][BN * BK];
    __shared__ float red[33];
    __shared__ float mean_rstd[2];
    __shared__ double dred[96];

    const S *x = (const S *)x_, *xr = (const S *)xr_, *wt = (const S *)w_;
    const int tid = threadIdx.x, b = blockIdx.z, lane = tid & 31, warp = tid >> 5;
    const int M = Hout * Wout, mtiles = (M + BM - 1) / BM;   // split-K as in conv_gemm
    const int mt = blockIdx.x % mtiles, sk = blockIdx.x / mtiles;
    const int m0 = mt * BM, n0 = blockIdx.y * BN;
    const bool norm = !GATE && ST == 1 && gn_part != nullptr;   // never on gates, unshuffle: no code there

    // ---- A copies: the thread -> (rows, k vector) map of conv_gemm's loader ----------------------
    typedef ARows<BM, BK, VEC, NT> AR;
    constexpr int KV = AR::KV, RPP = AR::RPP, AP = AR::AP;
    const AR ar(tid, m0, M, Wout);
    const int kv = ar.kv, r0 = ar.r0;
    const bool a_row_ok = ar.ok;
    const int(&oy)[AP] = ar.oy;
    const int(&ox)[AP] = ar.ox;
    // B copies: weights padded on upload, never out of bounds
    constexpr int BVEC = BN * BK / VEC, BP = BVEC / NT;
    static_assert(BVEC % NT == 0, "B tile split");

    // Issue k-tile kt into stage st.
    auto issue = [&](int kt, int st) {
        S *A = As[st], *B = Bs[st];
        if (kt < nk0) {
            const int k = kt * BK + kv * VEC;
            const int tap = k / Cin, c = k - tap * Cin;
            const int ky = tap / KH, kx = tap - (tap / KH) * KH;
            const bool kok = tap < KH * KH;
#pragma unroll
            for (int i = 0; i < AP; ++i) {
                const int vy = oy[i] * ST + ky - PAD, vx = ox[i] * ST + kx - PAD;
                const bool ok = kok && vy >= 0 && vy < Hin * UP && vx >= 0 && vx < Win * UP;
                const int iy = UP == 2 ? (vy >> 1) : vy, ix = UP == 2 ? (vx >> 1) : vx;
                const S *src = ok ? x + ((size_t)(b * Hin + iy) * Win + ix) * ldx + c : wt;
                if (a_row_ok) cp_async16(&A[L::off(r0 + i * RPP, kv * VEC)], src, ok);
            }
        } else {
            const int c = (kt - nk0) * BK + kv * VEC;
#pragma unroll
            for (int i = 0; i < AP; ++i) {
                const int m = m0 + r0 + i * RPP;
                const bool ok = a_row_ok && m < M && c < Cr;
                const S *src = ok ? xr + ((size_t)b * M + m) * ldr + c : wt;
                if (a_row_ok) cp_async16(&A[L::off(r0 + i * RPP, kv * VEC)], src, ok);
            }
        }
#pragma unroll
        for (int i = 0; i < BP; ++i) {
            const int v = tid + i * NT, n = v / KV, kk = (v % KV) * VEC;
            cp_async16(&B[L::off(n, kk)], wt + (size_t)(n0 + n) * ldw + kt * BK + kk, true);
        }
    };

    constexpr int WTM = BM / WM, WTN = BN / WN, MF = WTM / 16, NF = WTN / 8;
    static_assert(WTM % 16 == 0 && WTN % 16 == 0, "warp tile");
    const int wm = warp / WN, wn = warp % WN;
    float acc[MF][NF][4];
#pragma unroll
    for (int i = 0; i < MF; ++i)
#pragma unroll
        for (int j = 0; j < NF; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;

    // ---- pipeline. Tile i lives in stage i % STAGES. One commit per slot even when nothing was
    // issued, so wait_group counts stay uniform.
    const int nk = nk0 + nk1, kb = sk * nk / splits, ke = (sk + 1) * nk / splits, ntiles = ke - kb;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ntiles) issue(kb + s, s);
        cp_async_commit();
    }
    // the epilogue's operands and the GroupNorm merge overlap the first copies (independent of them)
    EpiloguePrefetch<BN, NT, GATE, true> pre;
    pre.load(bias, tbias, tb_stride, t_idx, psi_w, b, n0, N);
    if (norm) gn_merge(gn_part + (size_t)b * gn_P, gn_P, gn_eps, mean_rstd, dred);   // read after a loop barrier

    int st = 0;
    for (int i = 0; i < ntiles; ++i) {
        cp_async_wait<STAGES - 2>();   // this thread's copies of tile i have landed
        __syncthreads();   // tile i visible to all; every warp is done with tile i-1 (its stage is reused next)
        const int wst = st == 0 ? STAGES - 1 : st - 1;   // the stage of tile i-1 = of tile i+STAGES-1
        if (i + STAGES - 1 < ntiles) issue(kb + i + STAGES - 1, wst);
        cp_async_commit();
        if (norm && kb + i == nk0) scale_acc(acc, mean_rstd[1]);   // segment 0 done: folded GroupNorm
        mma_ktile<D, MF, NF, BK, L, L>(acc, As[st], Bs[st], wm * WTM, wn * WTN, lane);
        st = st + 1 == STAGES ? 0 : st + 1;
    }
    cp_async_wait<0>();   // only empty groups remain; leave nothing in flight

    if (norm && ke <= nk0) scale_acc(acc, mean_rstd[1]);
    conv_finish<D, BM, BN, WM, WN, KH, VEC, GATE>(acc, mtiles, mt, sk, red, mean_rstd, pre, CONV_ARGS);
}

// One extern "C" kernel per instantiation, as CONV_INSTANCE; symbols end in _s<STAGES>.
#define CONV_PIPE_INSTANCE(name, D, BM, BN, BK, WM, WN, KH, ST, UP, VEC, GATE, STAGES)           \
    extern "C" __global__ void __launch_bounds__(32 * WM * WN) name(CONV_PARAMS) {               \
        conv_gemm_pipe<D, BM, BN, BK, WM, WN, KH, ST, UP, VEC, GATE, STAGES>(CONV_ARGS);         \
    }

// conv_pipe.cu: conv_gemm (conv.cu) with a cp.async multi-stage shared-memory pipeline. The default
// for 16-bit vectorized convs and gates (3 stages; JETSON_UNET_CONV_STAGES, runtime/gpu/ops.py; 0
// turns it off): the loader appends this file after conv.cu only to modules that instantiate it.
//
// Computes exactly what conv_gemm computes (same GEMM, K order, in_map, fused GroupNorm, residual K
// segment, split-K, epilogue and statistics: those are conv.cu's shared device functions), for
// fp16/bf16 with 16-byte vectors (channels % 8 == 0, 16-byte aligned strides and view offsets);
// everything else keeps conv_gemm. Same parameter list (CONV_PARAMS) and launch shape: grid
// (ceil(M/BM) * splits, ceil(N/BN), B), block 32*WM*WN, dynamic smem 8*Cin bytes when normalized.
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
// GroupNorm: cp.async cannot transform data in flight. Two ways were open: (a) normalize in smem
//   after the wait, each thread the vectors it copied, before the barrier the loop has anyway; (b)
//   apply scale/shift to the fragments after ldmatrix. (b) repeats the work WN (or WM) times, one
//   warp per fragment, needs the per-(row, tap) padding mask in smem (padded taps must stay 0 in
//   the normalized domain) and breaks the bit-for-bit rounding of conv_gemm. (a) touches every
//   element once, with the thread's own masks (kept in registers for the STAGES-1 tiles in
//   flight), the same gn_apply expression as conv_gemm (so both round alike), no extra barrier;
//   and since the copies do not depend on the statistics, the first STAGES-1 tiles are issued
//   before the GroupNorm merge, hiding its latency chain behind theirs. (a) it is.
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
    const bool norm = gn_part != nullptr;
    const float *gn_scale = dyn_smem, *gn_shift = dyn_smem + Cin;

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

    // Issue k-tile kt into stage st. mask: rows whose vector is real segment-0 data (to normalize);
    // chan: its channel, -1 in segment 1 (residual_conv columns are not normalized).
    auto issue = [&](int kt, int st, u32 &mask, int &chan) {
        S *A = As[st], *B = Bs[st];
        mask = 0;
        chan = -1;
        if (kt < nk0) {
            const int k = kt * BK + kv * VEC;
            const int tap = k / Cin, c = k - tap * Cin;
            const int ky = tap / KH, kx = tap - (tap / KH) * KH;
            const bool kok = tap < KH * KH;
            chan = c;
#pragma unroll
            for (int i = 0; i < AP; ++i) {
                const int vy = oy[i] * ST + ky - PAD, vx = ox[i] * ST + kx - PAD;
                const bool ok = kok && vy >= 0 && vy < Hin * UP && vx >= 0 && vx < Win * UP;
                const int iy = UP == 2 ? (vy >> 1) : vy, ix = UP == 2 ? (vx >> 1) : vx;
                const S *src = ok ? x + ((size_t)(b * Hin + iy) * Win + ix) * ldx + c : wt;
                if (a_row_ok) cp_async16(&A[L::off(r0 + i * RPP, kv * VEC)], src, ok);
                mask |= (u32)ok << i;
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

    // After the wait: the thread normalizes the vectors it copied (its own cp.async writes are
    // visible to it after wait_group; the barrier that follows publishes them).
    auto normalize = [&](int st, u32 mask, int chan) {
        if (!norm || chan < 0 || !a_row_ok) return;
        float sc[VEC], sh[VEC];
#pragma unroll
        for (int j = 0; j < VEC; j += 4) {   // chan % 8 == 0, Cin % 8 == 0: 16-byte aligned
            const float4 a = *reinterpret_cast<const float4 *>(gn_scale + chan + j);
            const float4 s = *reinterpret_cast<const float4 *>(gn_shift + chan + j);
            sc[j] = a.x; sc[j + 1] = a.y; sc[j + 2] = a.z; sc[j + 3] = a.w;
            sh[j] = s.x; sh[j + 1] = s.y; sh[j + 2] = s.z; sh[j + 3] = s.w;
        }
#pragma unroll
        for (int i = 0; i < AP; ++i) {
            if (!((mask >> i) & 1u)) continue;
            S *p = &As[st][L::off(r0 + i * RPP, kv * VEC)];
            Vec<S, VEC> v = vload<S, VEC>(p);
            gn_apply<D, VEC>(v, sc, sh);
            vstore<S, VEC>(p, v);
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

    // ---- pipeline. Tile i lives in stage i % STAGES; qmask/qchan hold the masks of the STAGES-1
    // tiles in flight, oldest first (a shift register: constant indices, stays in registers).
    // One commit per slot even when nothing was issued, so wait_group counts stay uniform.
    const int nk = nk0 + nk1, kb = sk * nk / splits, ke = (sk + 1) * nk / splits, ntiles = ke - kb;
    u32 qmask[STAGES - 1];
    int qchan[STAGES - 1];
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        qmask[s] = 0;
        qchan[s] = -1;
        if (s < ntiles) issue(kb + s, s, qmask[s], qchan[s]);
        cp_async_commit();
    }
    // the epilogue's operands and the GroupNorm merge overlap the first copies (independent of them)
    EpiloguePrefetch<BN, NT, GATE, true> pre;
    pre.load(bias, tbias, tb_stride, t_idx, psi_w, b, n0, N);
    if (norm) conv_gn_prologue<NT, 4>(gn_part, gn_P, gn_eps, gn_w, gn_b, Cin, b, mean_rstd, dred);

    int st = 0;
    for (int i = 0; i < ntiles; ++i) {
        cp_async_wait<STAGES - 2>();   // this thread's copies of tile i have landed
        normalize(st, qmask[0], qchan[0]);
        __syncthreads();   // tile i visible to all; every warp is done with tile i-1 (its stage is reused next)
#pragma unroll
        for (int s = 0; s + 1 < STAGES - 1; ++s) {
            qmask[s] = qmask[s + 1];
            qchan[s] = qchan[s + 1];
        }
        qmask[STAGES - 2] = 0;
        qchan[STAGES - 2] = -1;
        const int wst = st == 0 ? STAGES - 1 : st - 1;   // the stage of tile i-1 = of tile i+STAGES-1
        if (i + STAGES - 1 < ntiles) issue(kb + i + STAGES - 1, wst, qmask[STAGES - 2], qchan[STAGES - 2]);
        cp_async_commit();
        mma_ktile<D, MF, NF, BK, L, L>(acc, As[st], Bs[st], wm * WTM, wn * WTN, lane);
        st = st + 1 == STAGES ? 0 : st + 1;
    }
    cp_async_wait<0>();   // only empty groups remain; leave nothing in flight

    conv_finish<D, BM, BN, WM, WN, VEC, GATE>(acc, mtiles, mt, sk, red, pre, CONV_ARGS);
}

// One extern "C" kernel per instantiation, as CONV_INSTANCE; symbols end in _s<STAGES>.
#define CONV_PIPE_INSTANCE(name, D, BM, BN, BK, WM, WN, KH, ST, UP, VEC, GATE, STAGES)           \
    extern "C" __global__ void __launch_bounds__(32 * WM * WN) name(CONV_PARAMS) {               \
        conv_gemm_pipe<D, BM, BN, BK, WM, WN, KH, ST, UP, VEC, GATE, STAGES>(CONV_ARGS);         \
    }

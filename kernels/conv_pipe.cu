// conv_pipe.cu: conv_gemm (conv.cu) with a cp.async multi-stage shared-memory pipeline. The default
// for 16-bit vectorized convs and gates (3 stages; JETSON_UNET_CONV_STAGES, runtime/gpu/ops.py; 0
// turns it off): the loader appends this file after conv.cu only to modules that instantiate it.
//
// Computes exactly what conv_gemm computes (same GEMM, K order, in_map, fused GroupNorm, residual K
// segment, split-K, epilogue and statistics: those are conv.cu's shared device functions; with k
// slices, the same sums in another order), for fp16/bf16 with 16-byte vectors (channels % 8 == 0,
// 16-byte aligned strides and view offsets); everything else keeps conv_gemm. Same parameter list
// (CONV_PARAMS) and launch shape: grid (ceil(M/BM) * splits, ceil(N/BN), B), block 32*WM*WN*KS (KS
// k slices, below), dynamic smem when normalized: 8*Cin bytes (table), 2*Cin (folded: FOLD).
//
// Why: conv_gemm stages one k-tile in registers, so every k-tile costs one exposed global-memory
// latency (~60 TFLOP/s at batch 16 on an H200, ~14 us per GEMM conv at batch 1). Here STAGES-1 k-tiles are in flight while the tensor cores work on the oldest:
//   cp.async.cg 16 B global -> smem (zero-fill: src-size 0 for padded taps, rows past M, K
//   padding), commit_group per k-tile, wait_group STAGES-2, one barrier per k-tile; ldmatrix +
//   mma.sync m16n8k16 through conv.cu's mma_ktile. sm_80+ only (valid on sm_87); nothing of Hopper.
// Smem: a ring of STAGES x (A[BM][BK] + B[BN][BK]) 16-bit tiles, XOR-swizzled (SwizzledTile)
//   instead of padded; the built-in tiles (ops.pipe_tile) keep the ring <= 40 KB so that ring +
//   GroupNorm scale/shift + scratch stays under the 48 KB of static + dynamic smem that needs no
//   opt-in, and two CTAs fit on an SM with 100 KB. A larger ring (a tuner candidate: DEEP_RING
//   below) lives in dynamic smem after the GroupNorm table, with the opt-in (ops.pipe_smem).
// GroupNorm: cp.async cannot transform data in flight. Two ways were open: (a) normalize in smem
//   after the wait, each thread the vectors it copied, before the barrier the loop has anyway; (b)
//   apply scale/shift to the fragments after ldmatrix. (b) repeats the work WN (or WM) times, one
//   warp per fragment, needs the per-(row, tap) padding mask in smem (padded taps must stay 0 in
//   the normalized domain) and breaks the bit-for-bit rounding of conv_gemm. (a) touches every
//   element once, with the thread's own masks (kept in registers for the STAGES-1 tiles in
//   flight), the same GnCoef expression as conv_gemm (so both round alike), no extra barrier;
//   and since the copies do not depend on the statistics, the first STAGES-1 tiles are issued
//   before the GroupNorm merge, hiding its latency chain behind theirs. (a) it is.
//   Folded (FOLD, gn_fold: conv.cu conv_gn_prologue): the same pass touches only the thread's padded
//   vectors, which it overwrites with the pad vector; its in-bounds vectors stay as loaded (the
//   results then differ from conv_gemm's by the roundings: gn_w * x is stored rounded, and the
//   normalization is applied to the sum, not to each input).
// Reference: runtime.reference.run_conv / run_gate (as conv.cu).

// Per A row of the thread, computed once: the element offset of its tap (0, 0) from the sample's
// base (negative in the top/left padding; only ever used offset back into the image) and one bit
// per tap that is inside the image. A k-tile's source is then base + row offset + the k position's
// offset, and its bounds test one bit test, where the general form costs a division, four
// comparisons and 64-bit index arithmetic per row. That needs the tap grid to be linear in
// (ky, kx): 3x3, 1x1, the 2x2 stride-2 taps of pixel_unshuffle2 and the 2x2 sub-pixel taps of up2
// (below: their padding, pad_y / pad_x, depends on the tile's output parity).
// Everything is pinned (common.cuh): left alone, the compiler recomputes the bits in the k loop.
// Offsets within a sample are 32-bit: one sample's activation stays under 2^31 elements (4 GB).
template <class S, int AP, int KH, int ST> struct ATaps {
    static_assert(KH * KH <= 32, "one bit per tap");
    const S *xs;
    int off[AP];
    u32 ok[AP];
    template <class AR>
    __device__ __forceinline__ ATaps(const AR &ar, const S *xs_, int Hin, int Win, int ldx, int pad_y, int pad_x)
        : xs(xs_) {
        pin(xs);
#pragma unroll
        for (int i = 0; i < AP; ++i) {
            const int y0 = ar.oy[i] * ST - pad_y, x0 = ar.ox[i] * ST - pad_x;
            // separable: the kx in the image as a mask, repeated for each ky in it (one unsigned
            // compare tests both bounds)
            u32 xm = 0, bits = 0;
#pragma unroll
            for (int kx = 0; kx < KH; ++kx) xm |= (u32)((unsigned)(x0 + kx) < (unsigned)Win) << kx;
#pragma unroll
            for (int ky = 0; ky < KH; ++ky)
                if ((unsigned)(y0 + ky) < (unsigned)Hin) bits |= xm << (ky * KH);
            ok[i] = bits;   // 0 for a row past M (its oy is far out of range)
            off[i] = !bits ? 0 : (y0 * Win + x0) * ldx;
            pin(ok[i]);
            pin(off[i]);
        }
    }
    // Source of row i at the thread's k position (k_off = (ky * Win + kx) * ldx + c), or the sample's
    // base, from which nothing is read, when the tap is in the padding (the 32-bit offset is
    // selected: two moves fewer than a pointer).
    __device__ __forceinline__ const S *src(int i, int k_off, u32 bit, bool &in) const {
        in = (ok[i] & bit) != 0;
        return xs + (in ? off[i] + k_off : 0);
    }
};

// up2 + 3x3 as sub-pixel convs (UP == 2, KH == 2): output pixel (2 iy + py, 2 ix + px) of a 3x3 conv
// on the nearest-upsampled input reads input rows iy - 1, iy, iy (py = 0) or iy, iy, iy + 1 (py = 1),
// and columns alike: a 2x2 conv of the input itself whose weights sum the 3x3 taps that land on the
// same input pixel (ops.conv.subpixel_weights: 4 of the 9 multiply-adds per output, and no
// per-tap division), one weight matrix per parity class (py, px). The GEMM's M is the output
// pixels ordered (parity, iy, ix): each class a contiguous range of Hin x Win rows that a whole
// number of BM-row tiles covers (the host checks Hin * Win % BM == 0), so a CTA has one class, with
// padding 1 - py above and 1 - px left, and its weights at rows parity x Npad of the B matrix.
// conv_finish<..., 2> stores row m at its output pixel.
struct SubPixel {
    int parity, m_in;   // the tile's class; its first row within the class
    __device__ __forceinline__ SubPixel(int m0, int Hin, int Win) {
        const int mi = Hin * Win;
        parity = div_small(m0, mi);
        m_in = m0 - parity * mi;
    }
    __device__ __forceinline__ int pad_y() const { return 1 - (parity >> 1); }
    __device__ __forceinline__ int pad_x() const { return 1 - (parity & 1); }
};

__device__ __forceinline__ void cp_async16(saddr smem, const void *gmem, bool full) {
    // src-size 0: nothing is read, the 16 bytes are zero-filled (padding and out-of-bounds rows)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
                 "r"(full ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// The weights' (B) copies of one k-tile, shared with the halo conv: thread tid copies BP 16-byte
// vectors, rows n = v / KV of the [BN][BK] swizzled tile (RPP rows apart, so they share the
// swizzle); sources at column 0, pinned (weights are padded on upload, never out of bounds). A tile
// of fewer vectors than threads (k slices: 8 warps on a 32x32x32 tile) leaves the spare threads idle.
template <class S, int BN, int BK, int VEC, int NT> struct BCopies {
    static constexpr int KV = BK / VEC, BVEC = BN * BK / VEC, BP = BVEC >= NT ? BVEC / NT : 1, RPP = NT / KV;
    static_assert(BVEC % NT == 0 || NT % BVEC == 0, "B tile split");
    static constexpr u32 ROWS_STEP = RPP * BK * sizeof(S);
    const S *src[BP];
    u32 dst;   // byte offset of the thread's first vector within a tile
    bool on;   // the thread has vectors to copy
    __device__ __forceinline__ BCopies(const S *wt, int ldw, int n0, int tid) : on(BVEC >= NT || tid < BVEC) {
#pragma unroll
        for (int i = 0; i < BP; ++i) {
            const int v = on ? tid + i * NT : 0;
            src[i] = wt + (size_t)(n0 + v / KV) * ldw + (v % KV) * VEC;
            pin(src[i]);
        }
        dst = SwizzledTile<BK>::off(tid / KV, (tid % KV) * VEC) * sizeof(S);
    }
    // the k-tile at weights column `col`; `to`: the thread's first destination (a tile base + dst)
    __device__ __forceinline__ void issue(saddr to, int col) const {
        if (BVEC < NT && !on) return;
#pragma unroll
        for (int i = 0; i < BP; ++i) cp_async16(to + i * ROWS_STEP, src[i] + col, true);
    }
};

// k slices (KS > 1): KS warps share each warp tile, warp (wm, wn, slice) taking every KS-th 16-deep
// k step of every k-tile, so the CTA has KS times the warps, each with 1/KS of the mma work and of
// the copies (the thread -> copy maps spread over all KS * WM * WN warps). After the k loop the
// slices trade partial sums through the (then idle) ring: slice s keeps its 1/KS of the warp tile's
// columns (n fragments s * NF/KS ..) and adds the other slices' partials of them to its own in a
// fixed order (deterministic). The result is a tile of WM x (WN * KS) warps of WTN / KS columns each,
// and conv_finish runs it as such: the epilogue's work is spread over all the warps too.
// Why: at batch 1 a conv is a latency chain (~2200 instructions per warp, 1-2 warps per scheduler):
// half the chain per warp, where split-K over CTAs pays a global
// round trip to merge.
template <int MF, int NF, int KS>
__device__ __forceinline__ void slice_exchange(const float (&acc)[MF][NF][4], float (&mine)[MF][NF / KS][4],
                                               float *xb, int wpos, int slice, int lane) {
    constexpr int NFK = NF / KS, PER = MF * NFK * 4;   // floats a warp receives from each other slice
    auto at = [&](int to, int from) {                  // [warp position][receiver][donor rank][PER][32]
        return xb + ((wpos * KS + to) * (KS - 1) + (from < to ? from : from - 1)) * PER * 32 + lane;
    };
#pragma unroll
    for (int to = 0; to < KS; ++to) {
        if (to == slice) continue;
        float *d = at(to, slice);
#pragma unroll
        for (int mf = 0; mf < MF; ++mf)
#pragma unroll
            for (int j = 0; j < NFK; ++j)
#pragma unroll
                for (int q = 0; q < 4; ++q) d[((mf * NFK + j) * 4 + q) * 32] = acc[mf][to * NFK + j][q];
    }
    __syncthreads();
#pragma unroll
    for (int mf = 0; mf < MF; ++mf)
#pragma unroll
        for (int j = 0; j < NFK; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                float sum = 0.0f;
#pragma unroll
                for (int s = 0; s < KS; ++s)   // constant acc indices: a select, not local memory
                    if (s == slice) sum = acc[mf][s * NFK + j][q];
#pragma unroll
                for (int s = 0; s < KS; ++s)
                    if (s != slice) sum += at(slice, s)[((mf * NFK + j) * 4 + q) * 32];
                mine[mf][j][q] = sum;
            }
}

// A ring of more than DEEP_RING bytes (ops.PIPE_RING_LIMIT) lives in dynamic smem: after the GroupNorm
// table (8 * Cin bytes when normalized), at a 128-byte boundary (the swizzle's; the host adds the
// slack). Why: the bytes a CTA has in flight are bounded by its ring, and the static ring stops at
// 48 KB of static + dynamic smem; deeper rings (BK 64 on 64x64 tiles, 128x128 tiles) trade CTAs
// per SM for k-tiles in flight.
#define DEEP_RING (40 * 1024)
template <class S> __device__ __forceinline__ S *dyn_ring(int table_bytes) {
    const size_t p = reinterpret_cast<size_t>(reinterpret_cast<char *>(dyn_smem) + table_bytes);
    return reinterpret_cast<S *>((p + 127) & ~(size_t)127);
}

template <class D, int BM, int BN, int BK, int WM, int WN, int KH, int ST, int UP, int VEC, int GATE, int STAGES,
          int KS, bool FOLD, int ACT>
__device__ __forceinline__ void conv_gemm_pipe(CONV_PARAMS) {
    typedef typename D::S S;
    typedef SwizzledTile<BK> L;
    static_assert(D::TC && VEC * sizeof(S) == 16, "16-bit types with 16-byte vectors only");
    static_assert(STAGES >= 2, "at least two stages");
    static_assert(KS == 1 || KS == 2 || KS == 4, "k slices");
    constexpr int NT = 32 * WM * WN * KS;
    // the ring: STAGES A tiles, then STAGES B tiles (one array: the k slices' exchange reuses all of it)
    constexpr int RING = STAGES * (BM + BN) * BK;
    constexpr bool DEEP = RING * (int)sizeof(S) > DEEP_RING;
    __shared__ __align__(128) S ring_static[DEEP ? 8 : RING];
    S *const ring = DEEP ? dyn_ring<S>(gn_part ? 8 * Cin : 0) : ring_static;
    S(*As)[BM * BK] = reinterpret_cast<S(*)[BM * BK]>(ring);
    S(*Bs)[BN * BK] = reinterpret_cast<S(*)[BN * BK]>(ring + STAGES * BM * BK);
    __shared__ float red[33];   // block_sum scratch (the statistics epilogue)
    __shared__ float fcol[FOLD ? BN + 1 : 1];   // the folded GroupNorm's column term, rstd (conv_gn_prologue)

    const S *x = (const S *)x_, *xr = (const S *)xr_, *wt = (const S *)w_;
    const int tid = threadIdx.x, b = blockIdx.z, lane = tid & 31, warp = tid >> 5;
    // first: its latency overlaps the set-up (later, ptxas spilled on sm_87)
    const GnPrefetch gp(gn_part ? gn_part + (size_t)b * gn_P : nullptr, gn_P);
    const int M = Hout * Wout, mtiles = (M + BM - 1) / BM;   // split-K as in conv_gemm
    const int sk = div_small(blockIdx.x, mtiles);
    const int mt = blockIdx.x - sk * mtiles, m0 = mt * BM;
    const int n0 = blockIdx.y * BN;
    const bool norm = gn_part != nullptr;
    static_assert(!FOLD || !GATE, "a gate has no GroupNorm");
    const int nk = nk0 + nk1, kb = div_small(sk * nk, splits),
              ke = div_small((sk + 1) * nk, splits), ntiles = ke - kb;

    // ---- A copies: the thread -> (rows, k vector) map of conv_gemm's loader ----------------------
    static_assert(UP == 1 || (UP == 2 && KH == 2 && ST == 1 && !FOLD && !GATE), "up2: the sub-pixel 2x2 convs");
    typedef ARows<BM, BK, VEC, NT> AR;
    constexpr int RPP = AR::RPP, AP = AR::AP;
    typedef ATaps<S, AP, KH, ST> AT;
    constexpr int PAD = ST == 1 ? KH / 2 : 0;
    const SubPixel sp(UP == 2 ? m0 : 0, Hin, Win);
    // kv, r0, ok: of tid only; rows in input pixels of the class (up2) or output pixels
    const AR ar = UP == 2 ? AR(tid, sp.m_in, Hin * Win, Win) : AR(tid, m0, M, Wout);
    const int kv = ar.kv, r0 = ar.r0;
    const bool a_row_ok = ar.ok;
    const AT at(ar, x + (size_t)b * Hin * Win * ldx, Hin, Win, ldx, UP == 2 ? sp.pad_y() : PAD,
                UP == 2 ? sp.pad_x() : PAD);
    // The thread's k position walks forward one k-tile per issue (tiles are issued in order kb,
    // kb+1, ...): channel c, tap (ky, kx), its bit and its element offset, updated by additions
    // (one division, here, per kernel instead of one per k-tile).
    int k_c, k_tap, k_kx, k_off;
    u32 k_bit;
    auto k_start = [&](int kt) {   // at k-tile kt (of segment 0)
        const int k = kt * BK + kv * VEC;
        k_tap = div_small(k, Cin);
        k_c = k - k_tap * Cin;
        const int ky = k_tap / KH;
        k_kx = k_tap - ky * KH;
        k_off = (ky * Win + k_kx) * ldx + k_c;
        k_bit = k_tap < 32 ? 1u << k_tap : 0u;
    };
    k_start(kb);
    const BCopies<S, BN, BK, VEC, NT> bc(UP == 2 ? wt + (size_t)sp.parity * gridDim.y * BN * ldw : wt, ldw, n0, tid);
    // smem destinations and fragment addresses, as .shared offsets (stage 0; stage st adds st * stride)
    constexpr u32 A_STAGE = BM * BK * sizeof(S), B_STAGE = BN * BK * sizeof(S);
    const saddr a_s0 = smem_u32(As[0]), b_s0 = smem_u32(Bs[0]);
    // row r0 + i * RPP (and B row n + i * RPP) lies i * RPP * BK elements further: same swizzle
    static_assert(RPP % 8 == 0 || (AP == 1 && bc.BP == 1), "rows RPP apart share the swizzle");
    saddr a_dst = a_s0 + L::off(r0, kv * VEC) * sizeof(S), b_dst = b_s0 + bc.dst;
    pin(a_dst);
    pin(b_dst);
    constexpr u32 ROWS_STEP = RPP * BK * sizeof(S);

    // Issue k-tile kt's A copies (= the next in order) into stage st; issue_b its weights. mask: rows
    // whose vector is real segment-0 data (to normalize); chan: its channel, -1 in segment 1
    // (residual_conv columns are not normalized).
    auto issue = [&](int kt, int st, u32 &mask, int &chan) {
        const saddr A = a_dst + st * A_STAGE;
        mask = 0;
        chan = -1;
        if (kt < nk0) {
            chan = k_c;
#pragma unroll
            for (int i = 0; i < AP; ++i) {
                bool ok;
                const S *src = at.src(i, k_off, k_bit, ok);
                if (a_row_ok) cp_async16(A + i * ROWS_STEP, src, ok);
                mask |= (u32)ok << i;
            }
            k_c += BK;   // to the next k-tile
            k_off += BK;
            while (k_c >= Cin) {
                k_c -= Cin;
                k_off += ldx - Cin;
                k_bit <<= 1;   // 0 after 32 taps: K padding past the last tap is never in bounds
                ++k_tap;
                if (++k_kx == KH) { k_kx = 0; k_off += (Win - KH) * ldx; }
            }
        } else if constexpr (UP == 1) {   // (up2 has no residual segment: the host checks)
            const int c = (kt - nk0) * BK + kv * VEC;
#pragma unroll
            for (int i = 0; i < AP; ++i) {
                const int m = m0 + r0 + i * RPP;
                const bool ok = a_row_ok && m < M && c < Cr;
                const S *src = ok ? xr + ((size_t)b * M + m) * ldr + c : wt;
                if (a_row_ok) cp_async16(A + i * ROWS_STEP, src, ok);
            }
        }
    };
    auto issue_b = [&](int kt, int st) { bc.issue(b_dst + st * B_STAGE, kt * BK); };

    // After the wait: the thread normalizes the vectors it copied (its own cp.async writes are
    // visible to it after wait_group; the barrier that follows publishes them). Folded: it writes
    // the pad vector over its padded ones (the zero-filled taps, rows past M, K padding).
    auto normalize = [&](int st, u32 mask, int chan) {
        if (!norm || chan < 0 || !a_row_ok) return;
        S *p = &As[st][L::off(r0, kv * VEC)];   // row r0 + i * RPP lies i * RPP * BK further (same swizzle)
        if constexpr (FOLD) {
            // a branch, not predicated stores: nearly every k-tile of a thread has no padded vector
            // (the border rows and columns of the image only), and the predicated load and stores
            // were ~7% of the k loop's instructions (Nsight Compute)
            if ((mask & ((2u << (AP - 1)) - 1u)) == ((2u << (AP - 1)) - 1u)) return;
            const Vec<S, VEC> pad = vload<S, VEC>(reinterpret_cast<const S *>(dyn_smem) + chan);
#pragma unroll
            for (int i = 0; i < AP; ++i)
                if (!((mask >> i) & 1u)) vstore<S, VEC>(p + i * RPP * BK, pad);
            return;
        }
        GnCoef<D, VEC> g;
        g.load(Cin, chan);
        // two rows per step, both loaded before either is stored (one per step was a chain of smem
        // round trips: the compiler keeps a load after a store to the same array); all AP at once
        // held registers that ptxas spilled for on sm_87 (128x32 up2 tile)
        constexpr int NN = AP < 2 ? AP : 2;
#pragma unroll
        for (int i0 = 0; i0 < AP; i0 += NN) {
            Vec<S, VEC> v[NN];
#pragma unroll
            for (int u = 0; u < NN; ++u)
                if (i0 + u < AP && ((mask >> (i0 + u)) & 1u)) v[u] = vload<S, VEC>(p + (i0 + u) * RPP * BK);
#pragma unroll
            for (int u = 0; u < NN; ++u)
                if (i0 + u < AP && ((mask >> (i0 + u)) & 1u)) {
                    g.apply(v[u]);
                    vstore<S, VEC>(p + (i0 + u) * RPP * BK, v[u]);
                }
        }
    };

    constexpr int WTM = BM / WM, WTN = BN / WN, MF = WTM / 16, NF = WTN / 8;
    static_assert(WTM % 16 == 0 && WTN % 16 == 0 && NF % KS == 0, "warp tile");
    // warp -> (wm, wn, slice), ordered so that (wm, wn * KS + slice) is conv_finish's warp position
    const int wm = warp / (WN * KS), wr = warp % (WN * KS), wn = wr / KS, slice = wr % KS;
    const FragOffsets<S, BK, L, L, KS, !GATE> fo(wm * WTM, wn * WTN, lane, slice);
    float acc[MF][NF][4];
    zero_acc(acc);

    // ---- pipeline. Tile i lives in stage i % STAGES; qmask/qchan hold the masks of the STAGES-1
    // tiles in flight, oldest first (a shift register: constant indices, stays in registers).
    // One commit per slot even when nothing was issued, so wait_group counts stay uniform.
    // Each tile's weights are issued before its A copies (H200, a batch-1 call: 0.391 -> 0.388 ms). Not
    // in the gates: at the 128-register cap sm_87 ptxas spilled for it in some of their tiles (as for
    // all tiles' weights first, and for tile 0's weights issued outside the loop).
    u32 qmask[STAGES - 1];
    int qchan[STAGES - 1];
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {   // the first STAGES-1 k-tiles into stages 0..
        qmask[s] = 0;
        qchan[s] = -1;
        if (!GATE && s < ntiles) issue_b(kb + s, s);
        if (s < ntiles) issue(kb + s, s, qmask[s], qchan[s]);
        if (GATE && s < ntiles) issue_b(kb + s, s);
        cp_async_commit();
    }
    // the epilogue's operands and the GroupNorm merge overlap the first copies (independent of them)
    EpiloguePrefetch<BN, NT, (GATE != 0), true> pre;
    pre.load(bias, psi_w, n0);
    if (norm) conv_gn_prologue<D, NT, 4, BN, FOLD>(gn_part, gn_P, gp, gn_eps, gn_w, gn_b, gn_fold, fcol, Cin, b, n0);

    // Large conv tiles (the batch-16 ones, >= 64 x 64 outputs over >= 4 warps): the loop unrolled by
    // STAGES (tile i0 + u in stage u), so every stage offset is a constant of the code, not
    // arithmetic of each k-tile: 10-20% fewer instructions. Others:
    // one tile per trip, the stage counted. Unrolled everywhere, a batch-1 call went 3 us slower
    // (every kernel starts with a cold instruction cache, and three copies of the body cost more
    // there than they save), the 2x1-warp tile (255 registers) got slower, and sm_87 ptxas spilled
    // 12 bytes in the gate gaten 64x64x32_s4. This rule, on the H200: batch 16 -8 us,
    // batch 1 unchanged.
    constexpr int U = (GATE || BM * BN < 64 * 64 || WM * WN < 4) ? 1 : STAGES;
    for (int i0 = 0, st0 = 0; i0 < ntiles; i0 += U) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int i = i0 + u, st = U == STAGES ? u : st0;
            if (i >= ntiles) break;
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
            if (i + STAGES - 1 < ntiles) {
                issue(kb + i + STAGES - 1, wst, qmask[STAGES - 2], qchan[STAGES - 2]);
                issue_b(kb + i + STAGES - 1, wst);
            }
            cp_async_commit();
            mma_ktile<D, MF, NF>(acc, a_s0 + st * A_STAGE, b_s0 + st * B_STAGE, fo);
            if constexpr (FOLD)
                if (last_seg0_tile(kb + i, i, ntiles, nk0)) scale_acc(acc, fcol[BN]);
            st0 = st0 + 1 == STAGES ? 0 : st0 + 1;   // (U == STAGES: unused)
        }
    }
    cp_async_wait<0>();   // only empty groups remain; leave nothing in flight

    if constexpr (KS == 1) {
        conv_finish<D, BM, BN, WM, WN, VEC, GATE, UP, 1, ACT>(acc, mtiles, mt, sk, red, pre, FOLD ? fcol : nullptr, CONV_ARGS);
    } else {
        static_assert(RING * sizeof(S) >= 4u * BM * BN * (KS - 1), "the slices' exchange fits in the ring");
        __syncthreads();   // every warp is done with the ring
        float mine[MF][NF / KS][4];
        slice_exchange<MF, NF, KS>(acc, mine, reinterpret_cast<float *>(ring), wm * WN + wn, slice, lane);
        conv_finish<D, BM, BN, WM, WN * KS, VEC, GATE, UP, 1, ACT>(mine, mtiles, mt, sk, red, pre, FOLD ? fcol : nullptr,
                                                           CONV_ARGS);
    }
}

// One extern "C" kernel per instantiation, as CONV_INSTANCE; symbols end in _s<STAGES> (and _k<KS>).
// Tiles with at most 32 accumulators per thread are held to 128 registers (16 warps per SM): left
// alone, ptxas lands a few registers above, which costs a CTA per SM (measured: the 128x32 tile
// at 134 registers ran 17% slower than at 128).
#define PIPE_MIN_CTAS(BM, BN, WM, WN, KS) ((BM) * (BN) <= 1024 * (WM) * (WN) ? 16 / ((WM) * (WN) * (KS)) : 1)
#define CONV_PIPE_INSTANCE(name, D, BM, BN, BK, WM, WN, KH, ST, UP, VEC, GATE, STAGES, KS, FOLD, F)        \
    extern "C" __global__ void __launch_bounds__(32 * WM * WN * KS, PIPE_MIN_CTAS(BM, BN, WM, WN, KS))     \
        name(CONV_PARAMS) {                                                                                \
        conv_gemm_pipe<D, BM, BN, BK, WM, WN, KH, ST, UP, VEC, GATE, STAGES, KS, FOLD, FT_ACT(F)>(CONV_FEATURE_ARGS(F)); \
    }

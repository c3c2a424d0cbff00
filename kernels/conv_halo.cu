// conv_halo.cu: the 3x3 stride-1 conv (up2 folded in or not) with its A operand staged once per
// channel chunk as a normalized halo tile in shared memory, instead of once per tap (im2col).
// Appended after conv.cu and conv_pipe.cu to modules that instantiate it (ConvKey.halo).
//
// Computes what conv_gemm / conv_gemm_pipe compute (same CONV_PARAMS, launch grid, weights layout,
// fused GroupNorm, residual K segment, split-K, epilogue and statistics: conv.cu's conv_finish),
// for fp16/bf16 with 16-byte vectors, KH = 3, ST = 1, Cin % BK == 0, and an M tile of whole image
// rows or of a row segment (BM % Wout == 0 or Wout % BM == 0: the tile's BM pixels are then the
// TH x TW rectangle m0 .. m0 + BM - 1, so conv_finish's row map is unchanged).
//
// Why: the im2col kernels fetch and normalize each input vector once per tap (9 times) and spend
// ~19 instructions per mma on it. Here the CTA loads the
// (TH + 2) x (TW + 2) pixel halo of BK channels once (cp.async, zero-filled outside the image),
// normalizes it once in place, and runs the 9 taps as 9 k-units whose A fragments are the same
// halo read at a constant pixel shift: each lane's ldmatrix row address is its pixel's, plus
// (ky * (TW + 2) + kx) pixels. Only the weights (B) stream through the cp.async ring per unit.
// Measured on the H100: the 64x64-level conv1 at batch 16 43 -> 33 us; it wins where the grid fills
// the GPU, never at batch 1 (latency chains): the built-in rules and jetson-tune decide per op. Its loop bookkeeping is walked by additions (divisions per unit or per halo
// vector cost as many instructions as the mma did, per Nsight Compute's source view).
//
// K order: unit u = chunk * 9 + tap (chunk = BK channels), then the residual segment's units, each
// BK columns of the packed weights: unit u of segment 0 reads columns tap * Cin + chunk * BK. With
// Cin == BK this is exactly conv_gemm's k-tile order (bit-identical results); with more chunks the
// sum runs in another order (same terms). nk0 (= 9 * Cin / BK) + nk1 units, split-K as conv_gemm.
//
// Dynamic shared memory (bytes; runtime/gpu/ops.py halo_smem computes the same):
//   [GroupNorm table 8 * Cin (folded, FOLD: 2 * Cin), when normalized; then up to 127 bytes to a 128-byte boundary]
//   [NH halo buffers of HR * HC pixels of PS bytes]   NH = 2 when Cin > BK (the next chunk's halo
//        lands while this one is read), else 1; PS = 2 * BK + 16: rows 16 bytes apart in bank
//        terms, so the 8 rows of an ldmatrix phase (8 consecutive pixels) hit distinct banks
//   [STAGES ring slots: B[BN][BK] (+ A[BM][BK] of the residual segment when nk1 > 0), swizzled]
// Halo chunk j is issued with the first unit of chunk j in the split (STAGES - 1 units ahead of
// its use, in the same commit group) into buffer j % NH; the buffer's previous chunk (j - 2) ended
// 9 units earlier, so with STAGES <= 10 every warp is past it at the barrier before the issue.
// Each thread normalizes the halo vectors it copied after its wait (padding stays 0); with the
// GroupNorm folded (conv.cu conv_gn_prologue) it writes the pad vector over its padded ones instead,
// and leaves the in-bounds ones as loaded.
// sm_80+ (cp.async, ldmatrix, mma.sync); nothing of Hopper.

template <class D, int BM, int BN, int BK, int WM, int WN, int UP, int STAGES, bool FOLD, int ACT>
__device__ __forceinline__ void conv_gemm_halo(CONV_PARAMS) {
    typedef typename D::S S;
    typedef SwizzledTile<BK> L;
    constexpr int VEC = 8, KV = BK / VEC, NT = 32 * WM * WN, PS = 2 * BK + 16;
    static_assert(D::TC && sizeof(S) == 2, "16-bit types only");
    static_assert(STAGES >= 2 && STAGES <= 10, "ring depth (halo buffer reuse needs <= 10)");
    static_assert(NT % KV == 0, "a thread's halo vectors share one channel group");
    __shared__ float red[33];   // block_sum scratch (the statistics epilogue)
    __shared__ float fcol[FOLD ? BN + 1 : 1];   // the folded GroupNorm's column term, rstd (conv_gn_prologue)

    const S *x = (const S *)x_, *xr = (const S *)xr_, *wt = (const S *)w_;
    const int tid = threadIdx.x, b = blockIdx.z, lane = tid & 31, warp = tid >> 5;
    const GnPrefetch gp(gn_part ? gn_part + (size_t)b * gn_P : nullptr, gn_P);   // first: its latency overlaps the set-up
    const int M = Hout * Wout, mtiles = (M + BM - 1) / BM;
    const int sk = div_small(blockIdx.x, mtiles), mt = blockIdx.x - sk * mtiles;
    const int m0 = mt * BM, n0 = blockIdx.y * BN;
    const bool norm = gn_part != nullptr;
    const int nk = nk0 + nk1, kb = div_small(sk * nk, splits),
              ke = div_small((sk + 1) * nk, splits), ntiles = ke - kb;

    // ---- geometry: the tile is TH x TW output pixels from (y0, x0); its halo HR x HC ------------
    const int TW = min(BM, Wout), TH = div_small(BM, TW), HC = TW + 2, HR = TH + 2;
    const int y0 = div_small(m0, Wout), x0 = m0 - y0 * Wout;
    const int NH = Cin > BK ? 2 : 1;
    const u32 HALO = ((u32)(HR * HC * PS) + 127u) & ~127u;
    const u32 SLOT_B = BN * BK * 2, SLOT = SLOT_B + (nk1 > 0 ? BM * BK * 2 : 0);
    // the halo buffers start 128-byte aligned (the swizzled B slots' bank pattern assumes it)
    const saddr dyn0 = smem_u32(dyn_smem);
    const u32 hoff = (u32)(((dyn0 + (norm ? (FOLD ? 2u : 8u) * Cin : 0u) + 127u) & ~(saddr)127) - dyn0);
    char *halo_p = reinterpret_cast<char *>(dyn_smem) + hoff;   // generic pointer of buffer 0
    const saddr halo0 = dyn0 + hoff, ring0 = halo0 + NH * HALO;
    auto buf = [&](int j) -> u32 { return (NH == 2 && (j & 1)) ? HALO : 0u; };   // chunk j's buffer offset
    const S *xs = x + (size_t)b * Hin * Win * ldx;
    const int kvv = tid % KV;   // the thread's channel group in every halo vector it copies
    constexpr int PSTEP = NT / KV;   // pixels between a thread's halo vectors

    // Halo of chunk j into buffer j % NH: the thread's pixels p = tid / KV + i * PSTEP, walked by
    // additions (no division per vector); which of them lie inside the image is kept as a bit mask
    // (one per buffer parity: two chunks can be in flight) for the normalization after the wait
    // (folded: the vectors outside it, for the pad).
    u32 hmask0 = 0, hmask1 = 0;
    auto issue_halo = [&](int j) {
        const saddr h = halo0 + buf(j) + kvv * 16;
        const int c = j * BK + kvv * VEC, npix = HR * HC;
        int hy = 0, hx = tid / KV;
        while (hx >= HC) { hx -= HC; ++hy; }
        u32 mask = 0;
        int i = 0;
        for (int p = tid / KV; p < npix; p += PSTEP, ++i) {
            const int Y = y0 - 1 + hy, X = x0 - 1 + hx;
            const bool ok = Y >= 0 && Y < Hout && X >= 0 && X < Wout;
            const S *src = ok ? xs + ((size_t)(Y / UP) * Win + X / UP) * ldx + c : wt;
            cp_async16(h + p * PS, src, ok);
            mask |= (u32)ok << i;
            hx += PSTEP;
            while (hx >= HC) { hx -= HC; ++hy; }
        }
        if constexpr (FOLD) mask = ~mask & (i >= 32 ? ~0u : (1u << i) - 1u);   // the i vectors outside the image
        if (j & 1) hmask1 = mask; else hmask0 = mask;
    };
    auto normalize_halo = [&](int j) {
        if (!norm) return;
        if constexpr (FOLD) {   // the pad vector over the thread's padded halo vectors
            const Vec<S, VEC> pad = vload<S, VEC>(reinterpret_cast<const S *>(dyn_smem) + j * BK + kvv * VEC);
            char *q = halo_p + buf(j) + kvv * 16 + (tid / KV) * PS;
            for (u32 mask = (j & 1) ? hmask1 : hmask0; mask; mask >>= 1, q += PSTEP * PS)
                if (mask & 1u) vstore<S, VEC>(reinterpret_cast<S *>(q), pad);
            return;
        }
        GnCoef<D, VEC> g;
        g.load(Cin, j * BK + kvv * VEC);
        // NN vectors per trip, all loaded before any is stored: the compiler keeps a load after the
        // previous store to the same array, so one per trip made a chain of smem round trips (4 per
        // trip: batch 1 ~3 us faster on the H100; no sm_87 spill)
        constexpr int NN = 4;
        char *q = halo_p + buf(j) + kvv * 16 + (tid / KV) * PS;
        for (u32 mask = (j & 1) ? hmask1 : hmask0; mask; mask >>= NN, q += NN * PSTEP * PS) {
            Vec<S, VEC> v[NN];
#pragma unroll
            for (int u = 0; u < NN; ++u)
                if ((mask >> u) & 1u) v[u] = vload<S, VEC>(reinterpret_cast<S *>(q + u * PSTEP * PS));
#pragma unroll
            for (int u = 0; u < NN; ++u)
                if ((mask >> u) & 1u) {   // padding stays 0
                    g.apply(v[u]);
                    vstore<S, VEC>(reinterpret_cast<S *>(q + u * PSTEP * PS), v[u]);
                }
        }
    };

    // ---- B (weights) and residual-A copies into ring slot st -----------------------------------
    typedef BCopies<S, BN, BK, VEC, NT> BC;
    static_assert(BC::RPP % 8 == 0 || BC::BP == 1, "rows RPP apart share the swizzle");
    const BC bc(wt, ldw, n0, tid);

    // Unit positions, walked by additions on both sides of the ring (the issue runs STAGES - 1
    // units ahead of the compute): chunk j, tap t (kx its column), the A offset of the tap within
    // the chunk's halo buffer, and the weights column t * Cin + j * BK.
    struct Pos { int u, j, tap, kx, col; u32 a; };
    auto start = [&](int u) {
        Pos q;
        q.u = u;
        q.j = u / 9;
        q.tap = u - q.j * 9;
        const int ky = q.tap / 3;
        q.kx = q.tap - ky * 3;
        q.col = u < nk0 ? q.tap * Cin + q.j * BK : u * BK;
        q.a = buf(q.j) + (u32)((ky * HC + q.kx) * PS);
        return q;
    };
    auto advance = [&](Pos &q) {
        ++q.u;
        if (q.u >= nk0) {                     // residual segment (or past the end)
            q.col = q.u * BK;
        } else if (++q.tap == 9) {            // next chunk, tap 0
            q.tap = 0; q.kx = 0; ++q.j;
            q.col = q.j * BK;
            q.a = buf(q.j);
        } else {
            q.col += Cin;
            if (++q.kx == 3) { q.kx = 0; q.a += (u32)((HC - 2) * PS); } else { q.a += PS; }
        }
    };
    Pos ip = start(kb);   // the next unit to issue

    auto issue = [&](int st) {
        const saddr slot = ring0 + st * SLOT;
        if (ip.u < nk0) {
            if (ip.tap == 0 || ip.u == kb) issue_halo(ip.j);
        } else {
            const int c = (ip.u - nk0) * BK + kvv * VEC;   // residual segment: A rows of the tile
            const saddr a = slot + SLOT_B;
            for (int r = tid / KV; r < BM; r += BC::RPP) {
                const int m = m0 + r;
                const bool ok = m < M && c < Cr;
                cp_async16(a + L::off(r, kvv * VEC) * 2, ok ? xr + ((size_t)b * M + m) * ldr + c : wt, ok);
            }
        }
        bc.issue(slot + bc.dst, ip.col);
        advance(ip);
    };

    // ---- fragments: each lane's A row pixel in the halo, B offsets as conv_gemm_pipe -------------
    constexpr int WTM = BM / WM, WTN = BN / WN, MF = WTM / 16, NF = WTN / 8;
    static_assert(WTM % 16 == 0 && WTN % 16 == 0, "warp tile");
    const int wm = warp / WN, wn = warp % WN;
    const FragOffsets<S, BK, L, L> fo(wm * WTM, wn * WTN, lane);
    u32 apix[MF];
#pragma unroll
    for (int mf = 0; mf < MF; ++mf) {
        const int r = wm * WTM + mf * 16 + (lane & 15), py = div_small(r, TW), px = r - py * TW;
        apix[mf] = (u32)((py * HC + px) * PS + (lane >> 4) * 16);
    }
    float acc[MF][NF][4];
    zero_acc(acc);

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ntiles) issue(s);
        cp_async_commit();
    }
    EpiloguePrefetch<BN, NT, false, true> pre;
    pre.load(bias, psi_w, n0);
    if (norm) conv_gn_prologue<D, NT, 4, BN, FOLD>(gn_part, gn_P, gp, gn_eps, gn_w, gn_b, gn_fold, fcol, Cin, b, n0);

    Pos cp = start(kb);   // the unit to compute
    int st = 0;
    for (int i = 0; i < ntiles; ++i) {
        cp_async_wait<STAGES - 2>();   // unit i's copies (and its chunk's halo) have landed
        if (cp.u < nk0 && (cp.tap == 0 || i == 0)) normalize_halo(cp.j);
        __syncthreads();   // visible to all; every warp is done with unit i-1 (its slot is reused next)
        const int wst = st == 0 ? STAGES - 1 : st - 1;
        if (i + STAGES - 1 < ntiles) issue(wst);
        cp_async_commit();
        const saddr B = ring0 + st * SLOT;
        if (cp.u < nk0) {
            const saddr A = halo0 + cp.a;
#pragma unroll
            for (int q = 0; q < BK / 16; ++q) {   // A: each lane's pixel row of the halo, shifted by the tap
                u32 af[MF][4];
#pragma unroll
                for (int mf = 0; mf < MF; ++mf) ldmatrix_x4(af[mf], A + apix[mf] + q * 32);
                mma_kstep<D, MF, NF>(acc, af, B + fo.b[q], decltype(fo)::B16);
            }
        } else {
            mma_ktile<D, MF, NF>(acc, B + SLOT_B, B, fo);
        }
        if constexpr (FOLD)
            if (last_seg0_tile(kb + i, i, ntiles, nk0)) scale_acc(acc, fcol[BN]);
        st = st + 1 == STAGES ? 0 : st + 1;
        advance(cp);
    }
    cp_async_wait<0>();

    conv_finish<D, BM, BN, WM, WN, VEC, false, 1, 0, ACT>(acc, mtiles, mt, sk, red, pre, FOLD ? fcol : nullptr, CONV_ARGS);
}

// One extern "C" kernel per instantiation; symbols end in _h<STAGES>. Register cap for tiles with
// <= 32 accumulators per thread: 4 warps at 168 (3 CTAs per SM; at 128 ptxas spilled a few bytes,
// and the halo's shared memory admits 2-4 CTAs per SM anyway), 8 warps at 128 (2 CTAs per SM).
#define HALO_MIN_CTAS(BM, BN, WM, WN) ((BM) * (BN) <= 1024 * (WM) * (WN) ? ((WM) * (WN) <= 4 ? 3 : 2) : 1)
#define CONV_HALO_INSTANCE(name, D, BM, BN, BK, WM, WN, UP, STAGES, FOLD, F)                      \
    extern "C" __global__ void __launch_bounds__(32 * WM * WN, HALO_MIN_CTAS(BM, BN, WM, WN))         \
        name(CONV_PARAMS) {                                                                      \
        conv_gemm_halo<D, BM, BN, BK, WM, WN, UP, STAGES, FOLD, FT_ACT(F)>(CONV_FEATURE_ARGS(F));           \
    }

// ---- the row-tile halo conv (conv_gemm_halo_rows, ConvKey.rows) ---------------------------------
// The same conv (3x3, stride 1, no up2) with another warp layout. The CTA's tile is TH whole image
// rows (BM = TH x Wout, Wout = TW = 16 x WM) by BN channels; warp (wm, wn) owns all TH rows of the
// 16 pixels wm * 16 .. and WTN = BN / WN channels. A stage holds one 16-channel chunk: the
// (TH + 2) x (TW + 2) halo and the weights of all 9 taps. For each kx the warp loads the A fragments
// of the TH + 2 halo rows once and uses each for the three ky taps (row r + ky of output row r),
// so a 16-channel chunk costs (TH + 2) x 3 A and 9 x NF / 2 B ldmatrix for 9 x TH x NF mma, where
// the GEMM tiles load one A and NF / 2 B per MF x NF mma with nothing reused across taps.
// Why: on the H100's 8-SM slice the GEMM convs' k loops run the mma at 36-43% of the mma.sync
// rate, and they move ~290 bytes of shared memory per mma (ldmatrix 192, cp.async writes 96) where
// an SM moves 128 per clock and issues an mma every ~1.6 clocks: shared memory bandwidth, not the
// tensor pipe, bounds them. Here it is ~155 bytes (docs/kernels.md has the figures).
// K order: chunk j (channels 16 j ..), taps in the order (kx, ky), then the residual segment's
// 16-column units (its A the tile's own pixels, read through the halo's interior and the centre
// tap's weight slot). No split-K (the host keeps splits 1). Dynamic shared memory (runtime/ops/
// conv_halo.py rows_smem): [GroupNorm table, when normalized][to 128 bytes][STAGES x (halo of
// (TH + 2) x (TW + 8) pixels of 32 bytes | weights 9 x BN x 32 bytes)]; a pixel's (and a weight
// row's) two 16-byte halves swap with bit 2 of its index, so the 8 rows of an ldmatrix phase hit
// distinct banks at any pixel shift (the row pitch TW + 8 keeps that bit across rows).
__device__ __forceinline__ u32 rows_swz(int row, int h) { return (u32)(row * 32 + ((h ^ ((row >> 2) & 1)) << 4)); }

template <class D, int BM, int BN, int WM, int WN, int STAGES, bool FOLD, int ACT>
__device__ __forceinline__ void conv_gemm_halo_rows(CONV_PARAMS) {
    typedef typename D::S S;
    constexpr int BK = 16, VEC = 8, NT = 32 * WM * WN;
    constexpr int TW = 16 * WM, TH = BM / TW, WP = TW + 8, WTN = BN / WN, MF = TH, NF = WTN / 8;
    static_assert(D::TC && sizeof(S) == 2, "16-bit types only");
    static_assert(BM % TW == 0 && WTN % 16 == 0 && STAGES >= 2, "row tile");
    constexpr u32 HALO = (TH + 2) * WP * 32, STAGE = HALO + 9 * BN * 32;
    constexpr int HV = (TH + 2) * (TW + 2) * 2, HPT = (HV + NT - 1) / NT;   // halo vectors per chunk
    constexpr int WV = 9 * BN * 2, WPT = (WV + NT - 1) / NT, RV = BM * 2, RPT = (RV + NT - 1) / NT;
    static_assert(HPT <= 32, "one mask bit per halo vector");
    __shared__ float red[33];
    __shared__ float fcol[FOLD ? BN + 1 : 1];

    const S *x = (const S *)x_, *xr = (const S *)xr_, *wt = (const S *)w_;
    const int tid = threadIdx.x, b = blockIdx.z, lane = tid & 31, warp = tid >> 5, kv = tid & 1;
    const GnPrefetch gp(gn_part ? gn_part + (size_t)b * gn_P : nullptr, gn_P);
    const int M = Hout * Wout, mtiles = M / BM, mt = blockIdx.x, m0 = mt * BM, n0 = blockIdx.y * BN;
    const int y0 = mt * TH;
    const bool norm = gn_part != nullptr;
    const int nc0 = Cin / BK, nu = nc0 + nk1;   // units: the 16-channel chunks, then the residual's
    const saddr dyn0 = smem_u32(dyn_smem);
    const u32 toff = (u32)(((dyn0 + (norm ? (FOLD ? 2u : 8u) * Cin : 0u) + 127u) & ~(saddr)127) - dyn0);
    const saddr ring0 = dyn0 + toff;
    char *const ring_p = reinterpret_cast<char *>(dyn_smem) + toff;
    const S *xs = x + (size_t)b * Hin * Win * ldx;

    // the thread's halo vectors (the same pixels in every chunk): which lie in the image, their offsets
    u32 hin = 0;
    int hsrc[HPT];
    u32 hdst[HPT];
#pragma unroll
    for (int i = 0; i < HPT; ++i) {
        const int v = tid + i * NT, p = v >> 1, hy = p / (TW + 2), hx = p - hy * (TW + 2);
        const int Y = y0 - 1 + hy, X = hx - 1;
        const bool in = v < HV && Y >= 0 && Y < Hin && X >= 0 && X < Win;
        hin |= (u32)in << i;
        hsrc[i] = in ? (Y * Win + X) * ldx + kv * VEC : 0;
        hdst[i] = v < HV ? rows_swz(hy * WP + hx, kv) : ~0u;
    }
    // The thread's weight copies. Where NT is a multiple of 2 BN (a tap's weight rows fill whole copy
    // rounds: every row tile but BN 128 over 4 warps), its row n and half kv are the same in every copy
    // and the tap advances by TS = NT / (2 BN) a copy: one source pointer and one smem offset, stepped
    // by constants, instead of each copy's tap, row and 64-bit address from the thread index in every
    // chunk (about 12 instructions a copy, all between a chunk's barrier and its first mma).
    constexpr bool WSTEP = NT % (2 * BN) == 0;
    constexpr int TS = WSTEP ? NT / (2 * BN) : 1;
    auto issue = [&](int u, int st) {
        const saddr base = ring0 + st * STAGE;
        if (u < nc0) {
            const int c = u * BK;
            // the chunk's base once (each copy rebuilt the sample's 64-bit base in a branch of its own);
            // copy rounds that lie wholly in the halo need no test, so their copies share one block
            const S *const xc = xs + c;
#pragma unroll
            for (int i = 0; i < HPT; ++i)
                if ((i + 1) * NT <= HV || hdst[i] != ~0u) cp_async16(base + hdst[i], xc + hsrc[i], (hin >> i) & 1u);
            if constexpr (WSTEP) {
                // the first copy's tap and the thread's row, from tid in each chunk (a dozen instructions:
                // held across the loop they take registers the 128-register tiles lack); a 32-bit offset,
                // one op's weights staying under 2^31 elements
                const int wt0 = tid / (2 * BN), wrow = (tid >> 1) % BN;
                const u32 wdst0 = HALO + wt0 * BN * 32 + rows_swz(wrow, kv);
                const S *src = wt + ((n0 + wrow) * ldw + wt0 * Cin + c + kv * VEC);
#pragma unroll
                for (int i = 0; i < WPT; ++i, src += TS * Cin)
                    if (wt0 + i * TS < 9) cp_async16(base + wdst0 + i * TS * BN * 32, src, true);
            } else {
#pragma unroll
                for (int i = 0; i < WPT; ++i) {
                    const int v = tid + i * NT, t = v / (2 * BN), n = (v >> 1) - t * BN;
                    if (v < WV) cp_async16(base + HALO + t * BN * 32 + rows_swz(n, kv), wt + (size_t)(n0 + n) * ldw + t * Cin + c + kv * VEC, true);
                }
            }
        } else {   // residual unit: the tile's pixels into the halo's interior, weights into the centre tap
            const int c = (u - nc0) * BK + kv * VEC;
#pragma unroll
            for (int i = 0; i < RPT; ++i) {
                const int v = tid + i * NT, p = v >> 1, py = p / TW, px = p - py * TW;
                const bool ok = c < Cr;
                if (v < RV) cp_async16(base + rows_swz((py + 1) * WP + px + 1, kv), ok ? xr + ((size_t)b * M + m0 + p) * ldr + c : wt, ok);
            }
#pragma unroll
            for (int i = 0; i < (2 * BN + NT - 1) / NT; ++i) {
                const int v = tid + i * NT, n = v >> 1;
                if (v < 2 * BN) cp_async16(base + HALO + 4 * BN * 32 + rows_swz(n, kv), wt + (size_t)(n0 + n) * ldw + nk0 * BK + (u - nc0) * BK + kv * VEC, true);
            }
        }
    };
    // after the wait: the thread's own halo vectors of chunk j normalized (table), or its padded
    // ones overwritten with the pad vector (folded; conv.cu conv_gn_prologue)
    auto normalize = [&](int st, int j) {
        if (!norm) return;
        char *h = ring_p + st * STAGE;
        if constexpr (FOLD) {
            const Vec<S, VEC> pad = vload<S, VEC>(reinterpret_cast<const S *>(dyn_smem) + j * BK + kv * VEC);
#pragma unroll
            for (int i = 0; i < HPT; ++i)
                if (hdst[i] != ~0u && !((hin >> i) & 1u)) vstore<S, VEC>(reinterpret_cast<S *>(h + hdst[i]), pad);
            return;
        }
        GnCoef<D, VEC> g;
        g.load(Cin, j * BK + kv * VEC);
#pragma unroll
        for (int i = 0; i < HPT; i += 2) {   // two vectors per step, both loaded before either is stored
            Vec<S, VEC> v[2];
#pragma unroll
            for (int q = 0; q < 2; ++q)
                if (i + q < HPT && ((hin >> (i + q)) & 1u)) v[q] = vload<S, VEC>(reinterpret_cast<S *>(h + hdst[i + q]));
#pragma unroll
            for (int q = 0; q < 2; ++q)
                if (i + q < HPT && ((hin >> (i + q)) & 1u)) {
                    g.apply(v[q]);
                    vstore<S, VEC>(reinterpret_cast<S *>(h + hdst[i + q]), v[q]);
                }
        }
    };

    const int wm = warp / WN, wn = warp % WN;
    // the lane's ldmatrix row at halo row 0 for tap column kx (row r: + r * WP * 32)
    auto aad = [&](int kx) { return rows_swz(wm * 16 + kx + (lane & 15), lane >> 4); };
    const u32 bad = HALO + rows_swz(wn * WTN + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
    float acc[MF][NF][4];
    zero_acc(acc);
    // output rows 0 .. TH - 1 from the fragments af[0 ..] times one tap's weights at B (conv.cu mma_kstep;
    // a weight row is 32 bytes, so n-fragment pairs lie 16 x 32 bytes apart)
    auto mma_tap = [&](const u32 (*af)[4], saddr B) {
        mma_kstep<D, MF, NF>(acc, *reinterpret_cast<const u32(*)[MF][4]>(af), B, 16 * 32);
    };

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nu) issue(s, s);
        cp_async_commit();
    }
    EpiloguePrefetch<BN, NT, false, true> pre;
    pre.load(bias, psi_w, n0);
    if (norm) conv_gn_prologue<D, NT, 4, BN, FOLD>(gn_part, gn_P, gp, gn_eps, gn_w, gn_b, gn_fold, fcol, Cin, b, n0);

    for (int u = 0, st = 0; u < nu; ++u) {
        cp_async_wait<STAGES - 2>();
        if (u < nc0) normalize(st, u);
        __syncthreads();   // chunk u visible to all; every warp is done with unit u - 1 (its stage is reused next)
        if (u + STAGES - 1 < nu) issue(u + STAGES - 1, st == 0 ? STAGES - 1 : st - 1);
        cp_async_commit();
        const saddr base = ring0 + st * STAGE;
        if (u < nc0) {
            // one kx per trip, not unrolled: unrolled, the next kx's fragments were loaded under this
            // one's mma and ptxas spilled on sm_87
#pragma unroll 1
            for (int kx = 0; kx < 3; ++kx) {
                u32 af[MF + 2][4];
                const saddr a = base + aad(kx);
#pragma unroll
                for (int r = 0; r < MF + 2; ++r) ldmatrix_x4(af[r], a + r * WP * 32);
#pragma unroll
                for (int ky = 0; ky < 3; ++ky) mma_tap(af + ky, base + bad + (ky * 3 + kx) * BN * 32);
            }
            if constexpr (FOLD)
                if (u + 1 == nc0) scale_acc(acc, fcol[BN]);
        } else {
            u32 af[MF][4];
#pragma unroll
            for (int r = 0; r < MF; ++r) ldmatrix_x4(af[r], base + aad(1) + (r + 1) * WP * 32);
            mma_tap(af, base + bad + 4 * BN * 32);
        }
        st = st + 1 == STAGES ? 0 : st + 1;
    }
    cp_async_wait<0>();
    conv_finish<D, BM, BN, WM, WN, VEC, false, 3, 2, ACT>(acc, mtiles, mt, 0, red, pre, FOLD ? fcol : nullptr, CONV_ARGS);
}

// Symbols end in _r<STAGES>. Register cap: 8 or more warps 128 (16 warps per SM), fewer 168 (as the
// GEMM-tile halo conv's 4-warp tiles: at 128, ptxas spilled up to 100 bytes on sm_87).
#define ROWS_MIN_CTAS(WM, WN) ((WM) * (WN) >= 8 ? 16 / ((WM) * (WN)) : 12 / ((WM) * (WN)))
#define CONV_HALO_ROWS_INSTANCE(name, D, BM, BN, WM, WN, STAGES, FOLD, F)                           \
    extern "C" __global__ void __launch_bounds__(32 * WM * WN, ROWS_MIN_CTAS(WM, WN)) name(CONV_PARAMS) {  \
        conv_gemm_halo_rows<D, BM, BN, WM, WN, STAGES, FOLD, FT_ACT(F)>(CONV_FEATURE_ARGS(F));               \
    }

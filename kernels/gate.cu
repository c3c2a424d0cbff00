// gate.cu: the attention gate of a skip connection, 16-bit: gate_rows for the narrow gates (Cg <= 64
// output channels, Cg + Cr <= 128 input channels: the 64x64 and 32x32 levels of the shipped model),
// gate_wide (below) for Cg of 96-256 (the 16x16 and 8x8 levels).
//
// Computes out[m, :] = sigmoid(psi . relu(Wg x[m] + Wr skip[m] + b) + psi_b) * skip[m, :] for every
// pixel m of the batch (a 1x1 op: the batch's pixels are one M), as conv.cu's gate epilogue does:
// the GEMM over K = [x | skip] in k order, fp32 accumulation, then the psi dot, the sigmoid and the
// scaled skip rounded once to the activation dtype. Inputs and output may be views of concat buffers
// (pixel strides ldx, lds, ldo; 16-byte aligned, chosen on the host).
// Layout: a warp owns 16 pixel rows at a time: it loads their x and skip vectors (16-byte loads) into
// its own smem rows ([16][Cg + Cr + 8] 16-bit words: rows 16 bytes of banks apart, so ldmatrix is
// conflict-free), takes the A fragments with ldmatrix, the B fragments (host-packed in mma order,
// ops.gate.pack_gate_rows) from the CTA's smem copy of the weights, and runs K / 16 x Cg / 8 mma. The
// psi dot of rows g and g + 8 is summed over the quad of lanes that holds them (two shuffles), the
// skip rows come back from the same smem rows, scaled, as 16-byte stores. The warps are persistent
// (grid-stride over the batch's row tiles), with the next tile's loads in registers under this
// tile's mma and epilogue.
// Why: the GEMM-conv gate (conv.cu) spends ~46 instructions per output on its generic im2col set-up,
// cp.async ring, cross-warp psi reduction and a second read of the skip rows (Nsight Compute, batch
// 64 on the H200: 22.3 us for a gate whose bytes take ~12).
// Launch: grid min(ceil(tiles / 4), SMs x 8) with tiles = ceil(M / 16), block 128, no dynamic smem.
// Reference: runtime.reference.run_gate.

#define GATE_ROWS_PARAMS                                                                        \
    const void *x_, int ldx, const void *s_, int lds, const uint2 *w, const float *bias,        \
    const float *psi, float psi_b, void *out_, int ldo, int M
#define GATE_ROWS_ARGS x_, ldx, s_, lds, w, bias, psi, psi_b, out_, ldo, M

// psi . relu(acc + bias) of rows g (c0, c1) and g + 8 (c2, c3) of a warp's m16 tile, over the NJ n8
// tiles of the lane's quad (bv, pv: bias and psi of the lane's columns 8 j + 2 t, + 1), summed over
// the quad by two shuffles: (row g, row g + 8) in every lane of the quad.
template <int NJ>
__device__ __forceinline__ float2 gate_psi_rows(const float (&acc)[NJ][4], const float (&bv)[NJ][2],
                                                const float (&pv)[NJ][2]) {
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        s0 += fmaxf(acc[j][0] + bv[j][0], 0.0f) * pv[j][0] + fmaxf(acc[j][1] + bv[j][1], 0.0f) * pv[j][1];
        s1 += fmaxf(acc[j][2] + bv[j][0], 0.0f) * pv[j][0] + fmaxf(acc[j][3] + bv[j][1], 0.0f) * pv[j][1];
    }
    s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
    s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
    s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
    s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
    return make_float2(s0, s1);
}

// One gated skip vector: the 8 skip values at `src` (smem) times the gate, rounded once, stored at dst.
template <class D>
__device__ __forceinline__ void gate_store(const typename D::S *src, float gate, typename D::S *dst, bool ok) {
    Vec<typename D::S, 8> v = vload<typename D::S, 8>(src);
#pragma unroll
    for (int e = 0; e < 8; ++e) v.v[e] = D::from_f(D::to_f(v.v[e]) * gate);
    if (ok) vstore<typename D::S, 8>(dst, v);
}

template <class D, int CG, int CR>
__device__ __forceinline__ void gate_rows(GATE_ROWS_PARAMS) {
    typedef typename D::S S;
    constexpr int WARPS = 4, K = CG + CR, KS = K / 16, NJ = CG / 8;
    constexpr int PITCH = K + 8;                              // 16-bit words per smem row
    constexpr int XV = CG / 8, SV = CR / 8, RV = XV + SV;     // 16-byte vectors per row: x, skip, both
    constexpr int LPL = 16 * RV / 32, OPL = 16 * SV / 32;     // a lane's loads and stores per tile
    static_assert(sizeof(S) == 2 && CG % 16 == 0 && CR % 16 == 0 && CG <= 64 && K <= 128, "narrow 16-bit gates");
    __shared__ __align__(16) uint2 wsm[KS * NJ * 32];
    __shared__ __align__(16) S abuf[WARPS][16 * PITCH];
    const S *x = (const S *)x_, *sk = (const S *)s_;
    S *out = (S *)out_;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, t = lane & 3;
    const int tiles = (M + 15) / 16, step = (int)gridDim.x * WARPS;
    int tile = (int)blockIdx.x * WARPS + warp;

    // a lane's loads: vector v = lane + 32 i of the tile's 16 rows x RV vectors (x first, then skip)
    uint4 ld[LPL];
    auto load = [&](int tl) {
#pragma unroll
        for (int i = 0; i < LPL; ++i) {
            const int v = lane + 32 * i, r = v / RV, c = v % RV, m = tl * 16 + r;
            ld[i] = make_uint4(0u, 0u, 0u, 0u);
            if (m < M)
                ld[i] = c < XV ? *reinterpret_cast<const uint4 *>(x + (size_t)m * ldx + 8 * c)
                               : *reinterpret_cast<const uint4 *>(sk + (size_t)m * lds + 8 * (c - XV));
        }
    };
    if (tile < tiles) load(tile);
    for (int i = tid; i < KS * NJ * 32; i += 32 * WARPS) wsm[i] = w[i];
    float bv[NJ][2], pv[NJ][2];   // bias and psi of the lane's columns 8 j + 2 t, + 1
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            bv[j][e] = bias[8 * j + 2 * t + e];
            pv[j][e] = psi[8 * j + 2 * t + e];
        }
    __syncthreads();

    S *rows = abuf[warp];
    // ldmatrix.x4 of k step ks: lane l gives row l % 16, columns 8 (l / 16) + 16 ks (a0..a3)
    const saddr arow = smem_u32(rows) + (u32)(((lane & 15) * PITCH + 8 * (lane >> 4)) * 2);
    for (; tile < tiles; tile += step) {
#pragma unroll
        for (int i = 0; i < LPL; ++i) {
            const int v = lane + 32 * i, r = v / RV, c = v % RV;
            *reinterpret_cast<uint4 *>(rows + r * PITCH + 8 * c) = ld[i];
        }
        __syncwarp();
        const int m0 = tile * 16;
        if (tile + step < tiles) load(tile + step);   // in flight under this tile's work

        float acc[NJ][4];
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[j][q] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            u32 a[4];
            ldmatrix_x4(a, arow + (u32)(ks * 32));
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
                const uint2 b = wsm[(ks * NJ + j) * 32 + lane];
                const u32 bb[2] = {b.x, b.y};
                D::mma(acc[j], a, bb);
            }
        }
        const float2 sp = gate_psi_rows<NJ>(acc, bv, pv);
        const float g0 = 1.0f / (1.0f + expf(-(psi_b + sp.x))), g1 = 1.0f / (1.0f + expf(-(psi_b + sp.y)));
        // the gated skip: vector u = lane + 32 i of the 16 rows x SV skip vectors, from the smem rows
#pragma unroll
        for (int i = 0; i < OPL; ++i) {
            const int u = lane + 32 * i, r = u / SV, c = u % SV;
            const float ga = __shfl_sync(0xffffffffu, g0, 4 * (r & 7)), gb = __shfl_sync(0xffffffffu, g1, 4 * (r & 7));
            const float gr = r < 8 ? ga : gb;
            gate_store<D>(rows + r * PITCH + CG + 8 * c, gr, out + (size_t)(m0 + r) * ldo + 8 * c, m0 + r < M);
        }
        __syncwarp();   // every lane is done with the rows before the next tile's stores
    }
}

// ---- the wide gates (Cg of 96-256 in multiples of 32: the 16x16 and 8x8 levels) ----------------
// The same gate, a CTA of Cg / 32 warps per 16 pixel rows: warp w computes columns 32 w .. 32 w + 31
// (4 n8 tiles) over the whole K from the CTA's smem rows (loaded as gate_rows loads them), its B
// fragments (the same packing, ops.gate.pack_gate_rows) streamed from global memory PF k steps
// ahead of the mma (a CTA's whole weights, 24-196 KB, do not fit its smem). Each warp sums its
// columns' psi terms as gate_rows does (the quad's two shuffles); the warps' sums meet in smem and
// are added in warp order, then the sigmoid and the scaled skip rows, 16-byte stores.
// Why: these gates ran conv.cu's GEMM gate, N split over 4 CTAs whose psi partials met through a
// ticket (a second round trip), 5.4 / 3.5 us at batch 1 on 8 SMs (the 8x8 and 16x16 levels).
// Launch: grid ceil(M / 16), block Cg, no dynamic smem.
template <class D, int CG, int CR>
__device__ __forceinline__ void gate_wide(GATE_ROWS_PARAMS) {
    typedef typename D::S S;
    constexpr int NW = CG / 32, NT = 32 * NW, K = CG + CR, KS = K / 16, NJ = 4, PF = KS < 8 ? KS : 8;
    constexpr int PITCH = K + 8;                              // 16-bit words per smem row
    constexpr int XV = CG / 8, SV = CR / 8, RV = XV + SV;     // 16-byte vectors per row: x, skip, both
    constexpr int LPT = (16 * RV + NT - 1) / NT, OPT = (16 * SV + NT - 1) / NT;   // a thread's loads, stores
    static_assert(sizeof(S) == 2 && CG % 32 == 0 && CR % 16 == 0 && NW <= 8, "wide 16-bit gates");
    __shared__ __align__(16) S rows[16 * PITCH];
    __shared__ float ps[NW][16];
    const S *x = (const S *)x_, *sk = (const S *)s_;
    S *out = (S *)out_;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, t = lane & 3, g = lane >> 2;
    const int m0 = (int)blockIdx.x * 16;

    uint4 ld[LPT];   // vector v = tid + NT i of the 16 rows x RV vectors (x first, then skip)
#pragma unroll
    for (int i = 0; i < LPT; ++i) {
        const int v = tid + NT * i, r = v / RV, c = v % RV, m = m0 + r;
        ld[i] = make_uint4(0u, 0u, 0u, 0u);
        if (v < 16 * RV && m < M)
            ld[i] = c < XV ? *reinterpret_cast<const uint4 *>(x + (size_t)m * ldx + 8 * c)
                           : *reinterpret_cast<const uint4 *>(sk + (size_t)m * lds + 8 * (c - XV));
    }
    // B fragment (k step q, the warp's n8 tile j): w[(q * CG / 8 + NJ warp + j) * 32 + lane]
    const uint2 *wb = w + (size_t)warp * NJ * 32 + lane;
    uint2 bq[PF][NJ];
#pragma unroll
    for (int q = 0; q < PF; ++q)
#pragma unroll
        for (int j = 0; j < NJ; ++j) bq[q][j] = wb[(q * (CG / 8) + j) * 32];
    float bv[NJ][2], pv[NJ][2];   // bias and psi of the lane's columns 32 warp + 8 j + 2 t, + 1
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            bv[j][e] = bias[32 * warp + 8 * j + 2 * t + e];
            pv[j][e] = psi[32 * warp + 8 * j + 2 * t + e];
        }
#pragma unroll
    for (int i = 0; i < LPT; ++i) {
        const int v = tid + NT * i, r = v / RV, c = v % RV;
        if (v < 16 * RV) *reinterpret_cast<uint4 *>(rows + r * PITCH + 8 * c) = ld[i];
    }
    __syncthreads();

    // ldmatrix.x4 of k step q: lane l gives row l % 16, columns 8 (l / 16) + 16 q (a0..a3)
    const saddr arow = smem_u32(rows) + (u32)(((lane & 15) * PITCH + 8 * (lane >> 4)) * 2);
    float acc[NJ][4];
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
#pragma unroll
    for (int q = 0; q < KS; ++q) {
        u32 a[4];
        ldmatrix_x4(a, arow + (u32)(q * 32));
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            const u32 bb[2] = {bq[q % PF][j].x, bq[q % PF][j].y};
            D::mma(acc[j], a, bb);
        }
        if (q + PF < KS)
#pragma unroll
            for (int j = 0; j < NJ; ++j) bq[q % PF][j] = wb[((q + PF) * (CG / 8) + j) * 32];
    }
    const float2 sp = gate_psi_rows<NJ>(acc, bv, pv);   // over the warp's 32 columns
    if (t == 0) {
        ps[warp][g] = sp.x;
        ps[warp][g + 8] = sp.y;
    }
    __syncthreads();
    // the gated skip: vector u = tid + NT i of the 16 rows x SV skip vectors, from the smem rows
#pragma unroll
    for (int i = 0; i < OPT; ++i) {
        const int u = tid + NT * i, r = u / SV, c = u % SV;
        if (u >= 16 * SV) break;
        float sum = 0.0f;
#pragma unroll
        for (int v = 0; v < NW; ++v) sum += ps[v][r];
        const float gr = 1.0f / (1.0f + expf(-(psi_b + sum)));
        gate_store<D>(rows + r * PITCH + CG + 8 * c, gr, out + (size_t)(m0 + r) * ldo + 8 * c, m0 + r < M);
    }
}

#define GATE_ROWS_INSTANCE(name, D, CG, CR)                                                     \
    extern "C" __global__ void __launch_bounds__(128) name(GATE_ROWS_PARAMS) { gate_rows<D, CG, CR>(GATE_ROWS_ARGS); }
#define GATE_WIDE_INSTANCE(name, D, CG, CR)                                                     \
    extern "C" __global__ void __launch_bounds__(CG) name(GATE_ROWS_PARAMS) { gate_wide<D, CG, CR>(GATE_ROWS_ARGS); }

// simt.h: just enough of CUDA to run kernels/conv.cu, conv_pipe.cu, conv_halo.cu and dwconv.cu on the
// CPU, one std::thread per CUDA thread, one CTA at a time (tests/test_*_emulated.py). Not a GPU
// model: it has the semantics the kernels rely on (barriers, warp-collective ldmatrix / mma.sync /
// shuffles, the fragment layouts of m16n8k16, cp.async groups) and nothing of the timing.
//   cp.async is deferred: a copy lands when its group is waited for (wait_group), never earlier,
//   so reading a stage before its wait, or a wait that is too weak, shows up as stale data.
// The test substitutes the inline-PTX helpers of common.cuh / conv_pipe.cu with the emu_* below;
// everything else in the kernel files compiles unchanged.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct Dim3 { int x, y, z; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
// PRMT's default mode: result byte i is byte s[4 i + 3 : 4 i] (0-3 of x, 4-7 of y) of the pair (x, y)
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
}

thread_local Dim3 threadIdx, blockIdx;
Dim3 blockDim, gridDim;
alignas(16) float dyn_smem[65536];   // 256 KB: the halo conv's dynamic smem goes past 48 KB

using std::min;
#ifdef EMU_FDIV_ERR   // __fdividef off by this relative error (tests/test_common_emulated.py: div_small)
inline float __fdividef(float a, float b) { return (float)((double)a / b * (1.0 + EMU_FDIV_ERR)); }
#else
inline float __fdividef(float a, float b) { return a / b; }
#endif
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }   // the device's MUFU.RSQ is within 2 ulp
inline int __float2int_rz(float f) { return (int)f; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
template <class T> inline T __ldcg(const T *p) { return *p; }
inline int emu_atomic_add_acq_rel(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL); }

// ---- one CTA's threads ----------------------------------------------------------------------------
struct Warp {
    std::barrier<> bar{32};
    uint64_t slot[32][8];
};
struct Cta {
    std::barrier<> bar;
    std::vector<Warp> warps;
    explicit Cta(int nt) : bar(nt), warps(nt / 32) {}
};
Cta *g_cta;
thread_local int t_lane, t_warp;

inline void __syncthreads() { g_cta->bar.arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu);
inline Warp &my_warp() { return g_cta->warps[t_warp]; }
inline void __syncwarp(unsigned) { my_warp().bar.arrive_and_wait(); }

// Every lane of the warp posts its value, then reads the one it asked for (its own past the warp).
template <class T> inline T emu_shfl(T v, int src_lane) {
    Warp &w = my_warp();
    static_assert(sizeof(T) <= 8, "one slot");
    std::memcpy(&w.slot[t_lane][0], &v, sizeof(T));
    w.bar.arrive_and_wait();
    T r = v;
    if (src_lane >= 0 && src_lane < 32) std::memcpy(&r, &w.slot[src_lane][0], sizeof(T));
    w.bar.arrive_and_wait();
    return r;
}
template <class T> inline T __shfl_xor_sync(unsigned, T v, int o) { return emu_shfl(v, t_lane ^ o); }
template <class T> inline T __shfl_sync(unsigned, T v, int src) { return emu_shfl(v, src); }

// ---- fp16 / bf16 bit conversions (round to nearest even, as cvt.rn) --------------------------------
inline float emu_h2f(uint16_t h) { _Float16 x; std::memcpy(&x, &h, 2); return (float)x; }
inline uint16_t emu_f2h(float f) { _Float16 x = (_Float16)f; uint16_t h; std::memcpy(&h, &x, 2); return h; }
inline float emu_b2f(uint16_t b) { return __uint_as_float(((unsigned)b) << 16); }
inline uint16_t emu_f2b(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);   // NaN stays NaN
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// fma.rn.{f16,bf16}[x2]: the exact a*b + c (in double) rounded once to float, then to 16 bits (a
// double rounding the hardware does not do; it differs only in ties that tests never rely on).
template <float (*TOF)(uint16_t), uint16_t (*FROMF)(float)>
inline uint16_t emu_fma16(uint16_t a, uint16_t b, uint16_t c) {
    return FROMF((float)((double)TOF(a) * (double)TOF(b) + (double)TOF(c)));
}
template <float (*TOF)(uint16_t), uint16_t (*FROMF)(float)>
inline uint32_t emu_fma16x2(uint32_t a, uint32_t b, uint32_t c) {
    return (uint32_t)emu_fma16<TOF, FROMF>(a & 0xffffu, b & 0xffffu, c & 0xffffu) |
           ((uint32_t)emu_fma16<TOF, FROMF>(a >> 16, b >> 16, c >> 16) << 16);
}

// ---- ldmatrix.x4 / .x2: lanes 8j..8j+7 give the 8 row addresses of matrix j; lane l receives, in
// r[j], row l/4, columns 2*(l%4) and +1 of matrix j.
template <int N> inline void emu_ldmatrix(uint32_t r[N], const void *p) {
    Warp &w = my_warp();
    w.slot[t_lane][0] = (uint64_t)(uintptr_t)p;
    w.bar.arrive_and_wait();
    for (int j = 0; j < N; ++j) {
        const uint16_t *row = (const uint16_t *)(uintptr_t)w.slot[8 * j + t_lane / 4][0];
        r[j] = (uint32_t)row[2 * (t_lane % 4)] | ((uint32_t)row[2 * (t_lane % 4) + 1] << 16);
    }
    w.bar.arrive_and_wait();
}
inline void emu_ldmatrix_x4(uint32_t r[4], const void *p) { emu_ldmatrix<4>(r, p); }
inline void emu_ldmatrix_x2(uint32_t r[2], const void *p) { emu_ldmatrix<2>(r, p); }

// ---- mma.sync.m16n8k16 row.col, fp32 accumulate. Fragments (g = lane/4, t = lane%4):
// A a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..); B b0 (k 2t.., n g), b1 (k 2t+8..,
// n g); C c0,c1 (g, 2t..2t+1), c2,c3 (g+8, 2t..).
template <float (*TOF)(uint16_t)>
inline void emu_mma(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    Warp &w = my_warp();
    for (int i = 0; i < 4; ++i) w.slot[t_lane][i] = a[i];
    w.slot[t_lane][4] = b[0];
    w.slot[t_lane][5] = b[1];
    w.bar.arrive_and_wait();
    auto half = [&](int lane, int reg, int h) { return TOF((uint16_t)(w.slot[lane][reg] >> (16 * h))); };
    auto A = [&](int r, int k) { return half((r % 8) * 4 + (k % 8) / 2, (r >= 8) + 2 * (k >= 8), k % 2); };
    auto B = [&](int k, int n) { return half(n * 4 + (k % 8) / 2, 4 + (k >= 8), k % 2); };
    const int g = t_lane / 4, t = t_lane % 4;
    float out[4];
    for (int q = 0; q < 4; ++q) {
        const int r = g + 8 * (q >> 1), n = 2 * t + (q & 1);
        float s = c[q];
        for (int k = 0; k < 16; ++k) s += A(r, k) * B(k, n);
        out[q] = s;
    }
    w.bar.arrive_and_wait();
    for (int q = 0; q < 4; ++q) c[q] = out[q];
}

// ---- cp.async: per-thread groups of deferred 16-byte copies --------------------------------------
struct Copy { void *dst; const void *src; int bytes; };
thread_local std::vector<Copy> t_open;
thread_local std::deque<std::vector<Copy>> t_groups;
inline void emu_cp_async16(void *dst, const void *src, bool full) {
    t_open.push_back({dst, src, full ? 16 : 0});
}
inline void emu_commit() { t_groups.push_back(std::move(t_open)); t_open.clear(); }
inline void emu_wait(int n) {
    while ((int)t_groups.size() > n) {
        for (const Copy &c : t_groups.front()) {
            std::memset(c.dst, 0, 16);
            if (c.bytes) std::memcpy(c.dst, c.src, c.bytes);
        }
        t_groups.pop_front();
    }
}

// ---- a launch: every CTA in turn, NT threads each --------------------------------------------------
inline void emu_launch(const std::function<void()> &kernel, int gx, int gy, int gz, int nt) {
    blockDim = {nt, 1, 1};
    gridDim = {gx, gy, gz};
    for (int z = 0; z < gz; ++z)
        for (int y = 0; y < gy; ++y)
            for (int x = 0; x < gx; ++x) {
                Cta cta(nt);
                g_cta = &cta;
                std::vector<std::thread> ts;
                for (int t = 0; t < nt; ++t)
                    ts.emplace_back([&, t] {
                        threadIdx = {t, 0, 0};
                        blockIdx = {x, y, z};
                        t_lane = t & 31;
                        t_warp = t >> 5;
                        t_open.clear();
                        t_groups.clear();
                        kernel();
                    });
                for (auto &th : ts) th.join();
            }
}

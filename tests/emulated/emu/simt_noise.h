// simt_noise.h: what kernels/noise.cu uses beyond simt.h (included after it): warp votes and
// shuffles, 64-bit high multiply, bit counts, IEEE-rounded float/double operations (plain C++
// operators: the test compiles with -ffp-contract=off, so none is fused), global atomicOr.
#include <climits>

using std::max;

inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __ffs(unsigned v) { return __builtin_ffs((int)v); }
inline int __clz(unsigned v) { return v ? __builtin_clz(v) : 32; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __double2float_rn(double d) { return (float)d; }
inline long long __double_as_longlong(double d) { long long i; std::memcpy(&i, &d, 8); return i; }
inline unsigned atomicOr(unsigned *p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }

template <class T> inline T __shfl_up_sync(unsigned, T v, int d) { return emu_shfl(v, t_lane >= d ? t_lane - d : t_lane); }
inline unsigned __ballot_sync(unsigned, bool pred) {
    Warp &w = my_warp();
    w.slot[t_lane][1] = pred ? 1u : 0u;
    w.bar.arrive_and_wait();
    unsigned m = 0;
    for (int l = 0; l < 32; ++l) m |= (unsigned)w.slot[l][1] << l;
    w.bar.arrive_and_wait();
    return m;
}
inline bool __any_sync(unsigned mask, bool pred) { return __ballot_sync(mask, pred) != 0u; }

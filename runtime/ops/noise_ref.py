"""kernels/noise.cu's algorithm in NumPy, and the checks that this process's NumPy draws the stream
that algorithm reproduces.

The stream is `numpy.random.Generator(PCG64(seed)).standard_normal(n, dtype=float32)`: PCG64 64-bit
outputs split into 32-bit words (low half first; a high half left over is kept in the state as
has_uint32 / uinteger), fed to NumPy's float ziggurat. `draw` computes it as the kernels do:
every word of the draw (`stream_words`), the "specials" (words whose attempt needs more words)
each evaluated as if an attempt started there (`attempt`), the walk over them in order (`walk`),
then every other word is a normal at index p - (holes before p). The tables and constants are
parsed out of kernels/noise.cu, so the CPU tests check the very numbers the GPU uses.

Which libm NumPy calls matters in two places. The wedge test compares a float with a double
exp(): a comparison within 2^window ulps of flipping is "ambiguous" (the device sets a flag and
the host redraws). The tail calls log1pf: glibc's is fdlibm's float algorithm, not correctly
rounded (1 ulp off for 7% of the tail's inputs), newer libms round correctly; `numpy_noise_mode`
asks NumPy itself, through generator states crafted to take the tail with chosen words. NumPy's own
stream depends on the platform's libm in exactly these places. The wedge's float d * u + f is NumPy's
only if NumPy's C was compiled without FP contraction (GCC in ISO C mode, as NumPy builds on Linux;
a clang build may fuse it into an fma).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, List, Optional, Tuple

import numpy as np

from jetson_unet.paths import kernels_dir
from jetson_unet.errors import NoiseUnsupported

FLAG_AMBIGUOUS, FLAG_SHORT = 1, 2
LOG1PF_FDLIBM, LOG1PF_ROUNDED = 0, 1
WINDOW_LOG2 = 3          # ambiguous within 8 ulps: CUDA's exp/log1p are within 1 ulp, glibc's within 0.52
MIN_NUMPY = (1, 22)      # next_float with 24 bits (NumPy PR 20314) and log1pf in the tail (PR 17020)
# Words a draw of n normals may use: per normal the holes (words that yield no normal) have mean
# 0.0222 and variance 0.0365 (measured over 6e5 normals); mean + 12 sigma + 64 is never reached in
# practice (the tail of the sum decays at least exponentially), and W - 1 >= consumed is required.
HOLE_MEAN, HOLE_SD = 0.023, 0.2
MULT = 0x2360ED051FC65DA44385DF649FCCF645


def n_words(n: int) -> int:
    """W: the words noise_words draws for n normals (a multiple of 32)."""
    margin = HOLE_MEAN * n + 12 * HOLE_SD * math.sqrt(n) + 64
    return -(-(n + int(math.ceil(margin)) + 1) // 32) * 32


@dataclass(frozen=True)
class Tables:
    ki: np.ndarray      # uint32[256]
    wi: np.ndarray      # float32[256]
    fi: np.ndarray      # float32[256]
    const: Dict[str, int]

    def f32(self, name: str) -> np.float32:
        return np.uint32(self.const[name]).view(np.float32)


@lru_cache(maxsize=1)
def tables() -> Tables:
    text = (kernels_dir() / "noise.cu").read_text()

    def table(name: str) -> np.ndarray:
        body = re.search(r"%s\[256\] = \{(.*?)\};" % name, text, re.S).group(1)
        vals = [int(v, 16) for v in re.findall(r"0x[0-9a-fA-F]+", body)]
        assert len(vals) == 256, name
        return np.array(vals, dtype=np.uint32)

    const = {k: int(v, 16) for k, v in re.findall(r"#define (\w+) 0x([0-9a-fA-F]+)", text)}
    return Tables(table("ZIG_KI"), table("ZIG_WI").view(np.float32), table("ZIG_FI").view(np.float32), const)


# ---- PCG64 over uint64 arrays (128-bit numbers as (hi, lo)), as noise.cu's mul128 / pcg_jump ----
def _mulhi(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    m32 = np.uint64(0xFFFFFFFF)
    a0, a1, b0, b1 = a & m32, a >> np.uint64(32), b & m32, b >> np.uint64(32)
    p00, p01, p10 = a0 * b0, a0 * b1, a1 * b0
    mid = (p00 >> np.uint64(32)) + (p01 & m32) + (p10 & m32)
    return a1 * b1 + (p01 >> np.uint64(32)) + (p10 >> np.uint64(32)) + (mid >> np.uint64(32))


def _mul(a: Tuple[np.ndarray, np.ndarray], b: Tuple[np.ndarray, np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    (ah, al), (bh, bl) = a, b
    return _mulhi(al, bl) + al * bh + ah * bl, al * bl


def _add(a: Tuple[np.ndarray, np.ndarray], b: Tuple[np.ndarray, np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    lo = a[1] + b[1]
    return a[0] + b[0] + (lo < a[1]).astype(np.uint64), lo


def _u128(v: int, size: int = 1) -> Tuple[np.ndarray, np.ndarray]:
    return np.full(size, v >> 64, np.uint64), np.full(size, v & 0xFFFFFFFFFFFFFFFF, np.uint64)


def pcg_jump(s: Tuple[np.ndarray, np.ndarray], inc: Tuple[np.ndarray, np.ndarray], d: np.ndarray):
    """Each state advanced by its own number of steps d (uint64 array), by squaring."""
    size, d = len(s[0]), np.asarray(d, np.uint64).copy()
    am, ap, cm, cp = _u128(1, size), _u128(0, size), _u128(MULT, size), inc
    with np.errstate(over="ignore"):
        while d.any():
            odd = (d & np.uint64(1)).astype(bool)
            nm, np_ = _mul(am, cm), _add(_mul(ap, cm), cp)
            am = tuple(np.where(odd, x, y) for x, y in zip(nm, am))
            ap = tuple(np.where(odd, x, y) for x, y in zip(np_, ap))
            cp = _mul(_add(cm, _u128(1, size)), cp)
            cm = _mul(cm, cm)
            d >>= np.uint64(1)
        return _add(_mul(am, s), ap)


def pcg_output(s: Tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """XSL-RR: rotate hi ^ lo right by the top 6 bits of the state."""
    x, r = s[0] ^ s[1], s[0] >> np.uint64(58)
    return (x >> r) | (x << ((np.uint64(64) - r) & np.uint64(63)))


def stream_words(state: dict, W: int) -> np.ndarray:
    """The first W 32-bit words a draw from this PCG64 state dict reads (uint32[W])."""
    b = int(state["has_uint32"])
    k = -(-(W - b) // 2)                         # outputs needed
    blocks = -(-k // 16)
    st, inc = state["state"]["state"], state["state"]["inc"]
    s = pcg_jump(_u128(st, blocks), _u128(inc, blocks), np.arange(blocks, dtype=np.uint64) * np.uint64(16))
    inc_v = _u128(inc, blocks)
    outs = np.empty((blocks, 16), np.uint64)
    with np.errstate(over="ignore"):
        for i in range(16):
            s = _add(_mul(s, _u128(MULT, blocks)), inc_v)
            outs[:, i] = pcg_output(s)
    words = outs.reshape(-1)[:k].view(np.uint32)   # little-endian: low half first
    if b:
        words = np.concatenate([[np.uint32(state["uinteger"])], words])
    return words[:W].copy()


# ---- the ziggurat ------------------------------------------------------------------------------
def next_float(w) -> np.ndarray:
    return (np.asarray(w, np.uint32) >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)


def fast_values(words: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(value of each word as a first word, whether it is special)."""
    t = tables()
    layer, rabs = words & np.uint32(0xFF), (words >> np.uint32(9)) & np.uint32(0x7FFFFF)
    x = rabs.astype(np.float32) * t.wi[layer]
    x = np.where((words >> np.uint32(8)) & np.uint32(1), -x, x)
    return x, rabs >= t.ki[layer]


def log1pf_fdlibm(x: np.ndarray) -> np.ndarray:
    """noise.cu's log1pf_fdlibm over a float32 array in (-1, 0] (glibc's float algorithm)."""
    t, x = tables(), np.asarray(x, np.float32)
    c32 = lambda name: t.f32(name)   # noqa: E731
    one, hx = np.float32(1), x.view(np.int32)
    with np.errstate(all="ignore"):
        red = hx > np.int32(-1097468385)           # bits 0xbe95f61f: x < -0.2929
        u = one + x
        hu = u.view(np.int32)
        k = (hu >> 23) - 127
        c = (x - (u - one)) / u
        hu = hu & 0x7FFFFF
        big = hu >= 0x3504F7
        un = np.where(big, (hu | 0x3F000000).astype(np.int32).view(np.float32),
                      (hu | 0x3F800000).astype(np.int32).view(np.float32))
        k = np.where(red, np.where(big, k + 1, k), 0)
        hu = np.where(red, np.where(big, (0x00800000 - hu) >> 2, hu), 1)
        f = np.where(red, un - one, x)
        c = np.where(red, c, np.float32(0))
        kf, ln2_hi, ln2_lo = k.astype(np.float32), c32("L1P_LN2_HI"), c32("L1P_LN2_LO")
        hfsq = np.float32(0.5) * f * f
        s = f / (np.float32(2) + f)
        z = s * s
        R = z * c32("L1P_LP7")
        for name in ("L1P_LP6", "L1P_LP5", "L1P_LP4", "L1P_LP3", "L1P_LP2", "L1P_LP1"):
            R = z * (c32(name) + R)
        sr = s * (hfsq + R)
        out = np.where(k == 0, f - (hfsq - sr), kf * ln2_hi - ((hfsq - (sr + (kf * ln2_lo + c))) - f))
        R2 = hfsq * (one - c32("L1P_TWO3RD") * f)
        small = np.where(f == 0, np.where(k == 0, np.float32(0), kf * ln2_hi + (c + kf * ln2_lo)),
                         np.where(k == 0, f - R2, kf * ln2_hi - ((R2 - (kf * ln2_lo + c)) - f)))
        out = np.where(hu == 0, small, out)
        return np.where((hx & 0x7FFFFFFF) < 0x31000000, x, out).astype(np.float32)


def within_ulps(a: np.ndarray, b: np.ndarray, window: int) -> np.ndarray:
    """|a - b| <= 2^window ulps, for float64 arrays of one sign (as noise.cu's within_ulps)."""
    d = np.asarray(a, np.float64).view(np.int64) - np.asarray(b, np.float64).view(np.int64)
    return np.abs(d) <= (1 << window)


def log1pf_rounded(x: np.ndarray, window: int) -> Tuple[np.ndarray, np.ndarray]:
    """noise.cu's log1pf_rounded: (float32 results, ambiguous) for x in (-1, 0]."""
    x = np.asarray(x, np.float32)
    d = np.log1p(x.astype(np.float64))
    f = d.astype(np.float32)
    g = (f.view(np.int32) + np.where(d < f, 1, -1)).astype(np.int32).view(np.float32)
    amb = within_ulps(d, 0.5 * (f.astype(np.float64) + g.astype(np.float64)), window) & (x != 0)
    return np.where(x == 0, x, f), amb


def numpy_log1pf(x: np.ndarray, mode: int, window: int) -> Tuple[np.ndarray, np.ndarray]:
    if mode == LOG1PF_ROUNDED:
        return log1pf_rounded(x, window)
    return log1pf_fdlibm(x), np.zeros(np.shape(x), bool)


@dataclass
class Attempts:
    """Per special word p: words consumed (0: runs past W), accepted, ambiguous, value."""
    p: np.ndarray
    cons: np.ndarray
    acc: np.ndarray
    amb: np.ndarray
    value: np.ndarray


def attempt(words: np.ndarray, p: np.ndarray, mode: int = LOG1PF_FDLIBM, window: int = WINDOW_LOG2) -> Attempts:
    """noise.cu's zig_attempt for every position in p (each as if an attempt started there)."""
    t, W = tables(), len(words)
    p = np.asarray(p, np.int64)
    x, _ = fast_values(words[p])
    layer = words[p] & np.uint32(0xFF)
    cons, acc, amb = np.zeros(len(p), np.int64), np.zeros(len(p), bool), np.zeros(len(p), bool)
    value = x.copy()
    wedge = (layer != 0) & (p + 1 < W)
    if wedge.any():                                 # accept when the uniform point is under the curve
        lw = layer[wedge]
        lhs = (t.fi[lw - 1] - t.fi[lw]) * next_float(words[p[wedge] + 1]) + t.fi[lw]
        xd = x[wedge].astype(np.float64)
        e = np.exp(-0.5 * xd * xd)
        cons[wedge], acc[wedge] = 2, lhs.astype(np.float64) < e
        amb[wedge] = within_ulps(lhs, e, window)
    r_f, ninv = t.f32("ZIG_R_F"), -t.f32("ZIG_INV_R_F")
    for j in np.nonzero(layer == 0)[0]:            # tail: r + Exp / r, two words per try (rare)
        q, r = int(p[j]) + 1, int(words[p[j]])
        while q + 1 < W:
            (l1, l2), a = numpy_log1pf(-next_float(words[q:q + 2]), mode, window)
            amb[j] |= bool(a.any())
            xx, yy = ninv * l1, -l2
            if yy + yy > xx * xx:
                v = r_f + xx
                value[j] = -v if (r >> 17) & 1 else v      # bit 8 of rabs, not the sign bit
                cons[j], acc[j] = q + 2 - int(p[j]), True
                break
            q += 2
    return Attempts(p, cons, acc, amb, value)


def walk(att: Attempts, n: int) -> Tuple[List[int], List[Tuple[int, float]], int, int]:
    """The attempt starts among the specials, in order: (holes, [(output index, value)], words
    consumed, flags)."""
    floor = h = flags = 0
    holes: List[int] = []
    outs: List[Tuple[int, float]] = []
    for p, cons, acc, amb, val in zip(att.p.tolist(), att.cons.tolist(), att.acc.tolist(), att.amb.tolist(),
                                      att.value):
        if p < floor:                               # inside an earlier attempt's words
            continue
        if p - h >= n:                              # the n-th normal came from a plain word
            return holes, outs, n + h, flags
        if cons == 0:
            return holes, outs, n + h, flags | FLAG_SHORT
        flags |= FLAG_AMBIGUOUS if amb else 0
        if acc:
            outs.append((p - h, val))
        holes.extend(range(p + 1 if acc else p, p + cons))
        h += cons - int(acc)
        floor = p + cons
        if acc and outs[-1][0] == n - 1:
            return holes, outs, floor, flags
    return holes, outs, n + h, flags


def draw(state: dict, n: int, mode: int = LOG1PF_FDLIBM, window: int = WINDOW_LOG2,
         W: Optional[int] = None) -> Tuple[np.ndarray, dict, int]:
    """n normals from a PCG64 state dict: (float32[n], the state dict after, NOISE flags)."""
    if n == 0:
        return np.zeros(0, np.float32), state, 0
    W = W or n_words(n)
    words = stream_words(state, W)
    x, special = fast_values(words)
    att = attempt(words, np.nonzero(special)[0], mode, window)
    holes, outs, used, flags = walk(att, n)
    hole = np.zeros(W, bool)
    hole[holes] = True
    idx = np.arange(W) - (np.cumsum(hole) - hole)
    plain = ~special & ~hole & (idx < n)
    out = np.full(n, np.nan, np.float32)
    out[idx[plain]] = x[plain]
    for i, v in outs:
        out[i] = v
    if used >= W:
        flags |= FLAG_SHORT
    return out, (state if flags & FLAG_SHORT else advance(state, words, used)), flags


def advance(state: dict, words: np.ndarray, used: int) -> dict:
    """The state dict after `used` words (noise_walk's last step)."""
    fresh = used - int(state["has_uint32"])
    st = state["state"]
    s = pcg_jump(_u128(st["state"]), _u128(st["inc"]), np.array([(fresh + 1) // 2], np.uint64))
    return {"bit_generator": "PCG64", "state": {"state": (int(s[0][0]) << 64) | int(s[1][0]), "inc": st["inc"]},
            "has_uint32": fresh & 1, "uinteger": int(words[used if fresh & 1 else used - 1])}


# ---- does this NumPy draw the stream noise.cu reproduces? -----------------------------------------
def tail_state(w1: int, w2: int) -> dict:
    """A PCG64 state whose next normal takes the tail at once (buffered word: layer 0, rabs max)
    and tries it with words w1 (for xx) and w2 (for yy)."""
    inc = np.random.PCG64(0).state["state"]["inc"]
    hi = 0x0123456789ABCDEF                        # top 6 bits 0: XSL-RR rotates by 0
    want = (w2 << 32) | w1
    post = (hi << 64) | (hi ^ want)                # pcg_output(post) == want
    pre = ((post - inc) * pow(MULT, -1, 1 << 128)) % (1 << 128)
    return {"bit_generator": "PCG64", "state": {"state": pre, "inc": inc}, "has_uint32": 1,
            "uinteger": 0xFFFFFE00}


def _tail_value(log1pf: np.ndarray) -> np.ndarray:
    """The tail's normal for tries accepted at once, from log1pf(-u1) (sign: rabs bit 8 = 1)."""
    t = tables()
    return -(t.f32("ZIG_R_F") + (-t.f32("ZIG_INV_R_F")) * log1pf)


@lru_cache(maxsize=1)
def numpy_noise_mode() -> Tuple[int, bool]:
    """(log1pf mode, exact) for this process's NumPy; raises NoiseUnsupported when NumPy's float32
    normals are not the stream noise.cu computes. exact is False when NumPy's log1pf is neither
    glibc's nor correctly rounded: then ~1e-5 of the normals (tail values) may differ by 1 ulp."""
    ver = tuple(int(v) for v in re.findall(r"\d+", np.__version__)[:2])
    if ver < MIN_NUMPY:
        raise NoiseUnsupported(f"device noise needs NumPy >= {'.'.join(map(str, MIN_NUMPY))} (its float32 "
                               f"normal stream); this is NumPy {np.__version__}")
    # log1pf: inputs where glibc's and the correctly rounded log1pf give different normals
    k = np.arange(1, 1 << 24, 2053, dtype=np.int64)
    u = -next_float(k << 8)
    fd, (cr, amb) = log1pf_fdlibm(u), log1pf_rounded(u, WINDOW_LOG2)
    pick = np.nonzero((_tail_value(fd) != _tail_value(cr)) & ~amb)[0][:24]
    rng = np.random.Generator(np.random.PCG64(0))
    got = []
    for kk in k[pick]:
        rng.bit_generator.state = tail_state(int(kk) << 8, 0xFFFFFF00)
        got.append(rng.standard_normal(dtype=np.float32))
    got = np.array(got, np.float32)
    if np.array_equal(got, _tail_value(fd[pick])):
        mode, exact = LOG1PF_FDLIBM, True
    elif np.array_equal(got, _tail_value(cr[pick])):
        mode, exact = LOG1PF_ROUNDED, True
    else:
        mode, exact = LOG1PF_FDLIBM, False
    # the whole algorithm on a known draw (wedges accepted and rejected, tails)
    state = np.random.PCG64(20240607).state
    want = np.random.Generator(np.random.PCG64(20240607)).standard_normal(30000, dtype=np.float32)
    mine, _, flags = draw(state, 30000, mode)
    same = mine.view(np.uint32) == want.view(np.uint32)
    if not exact:
        same |= np.abs(want) > tables().f32("ZIG_R_F")
    if not same.all() or flags:
        raise NoiseUnsupported(f"NumPy {np.__version__} draws another float32 normal stream than the device "
                               f"generator (first difference at normal {int(np.argmin(same))})")
    return mode, exact

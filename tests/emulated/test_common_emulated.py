"""Helpers of kernels/common.cuh run on the CPU by tests/emu/simt.h (see
tests/test_conv_pipe_emulated.py): the GroupNorm statistics merge and the CTA sum (gn_merge,
block_sum) against float64, and the small-integer division (div_small) against Python's.

gn_merge turns a sample's per-CTA partials (count, sum, M2 about the tile mean, as the producers
write them in fp32) into (mean, rstd) in fp32, each warp on its own, in one pass about a shift (partial 0's mean), or two (the mean, then
M2 about it) where the shift is far from the mean. Cases: one partial, fewer partials than a warp's lanes, several per lane (ragged), past
the entry prefetch, CTAs of 2, 4 and 8 warps (every warp must agree), data
centred and offset by 100 and 1000 standard deviations (where the naive sum(s^2 / n) - S^2 / N in
fp32 would keep no digit of the variance), and one tile far from the rest (which a one-pass merge
about a shift would lose digits to: M2 there comes from a second pass about the merged mean,
and in one pass where partial 0, the shift, is near enough). Every
thread must return the same bits. block_sum is called twice in a row on the same scratch, as the
kernels' statistics epilogue does. div_small is built with __fdividef off by +-1.5 * 2^-23 (the bound
its comment claims for rcp.approx and the product), so its correction step is exercised both ways."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tests.emulated.test_conv_pipe_emulated import compile_emu, emu_source

pytestmark = pytest.mark.slow

HARNESS = r"""
extern "C" void emu_gn_merge(const float4 *part, int P, float eps, float *out, int nt) {
    emu_launch([&] {
        const GnPrefetch pre(part, P);
        const float2 mr = gn_merge(part, P, pre, eps);
        out[2 * threadIdx.x] = mr.x;
        out[2 * threadIdx.x + 1] = mr.y;
    }, 1, 1, 1, nt);
}
extern "C" void emu_block_sums(const float *a, const float *b, float *out, int nt) {
    emu_launch([&] {
        __shared__ float red[33];
        const float s = block_sum(a[threadIdx.x], red);
        const float t = block_sum(b[threadIdx.x], red);
        out[2 * threadIdx.x] = s;
        out[2 * threadIdx.x + 1] = t;
    }, 1, 1, 1, nt);
}
"""

EPS = 1e-5
# fp32 sums of at most a few terms per thread, then trees of <= 8 warps: a few 1e-7 relative. The
# variance is relative to itself (M2 is a sum of non-negative terms); the mean is relative to
# the spread, as a normalized value x - mean sees it, plus one fp32 spacing of the mean (a float mean
# of 1000 cannot be nearer than ~3e-5; the former double merge rounded it to float too).
MEAN_TOL, RSTD_TOL = 2e-6, 5e-6


DIV_HARNESS = r"""
extern "C" void emu_div_small(const int *a, const int *d, int *q, int n) {
    for (int i = 0; i < n; ++i) q[i] = div_small(a[i], d[i]);
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return compile_emu(emu_source([]) + HARNESS, tmp_path_factory.mktemp("emu-gn"))


def partials(rng, P: int, offset: float, outlier: float):
    """P tiles of random sizes of data with mean `offset` and std ~1 (tile means spread by ~0.3),
    tile 0 moved by `outlier`: the fp32 partials as a producer writes them and the float64 mean /
    variance of all the data."""
    sizes = rng.integers(1, 300, size=P)
    tiles = [offset + 0.3 * rng.standard_normal() + rng.standard_normal(n) for n in sizes]
    tiles[0] = tiles[0] + outlier
    part = np.zeros((P, 4), dtype=np.float32)
    for i, t in enumerate(tiles):
        part[i] = (len(t), t.sum(), ((t - t.mean()) ** 2).sum(), 0.0)
    # the float64 statistics of what the fp32 partials say (n_i, s_i, M2_i), so the test measures the
    # merge, not the producer's rounding
    p = part.astype(np.float64)
    n, s = p[:, 0].sum(), p[:, 1].sum()
    mean = s / n
    m2 = (p[:, 2] + p[:, 0] * (p[:, 1] / p[:, 0] - mean) ** 2).sum()
    return part, mean, m2 / n


@pytest.mark.parametrize("nt", [64, 128, 256])
@pytest.mark.parametrize("P", [1, 5, 129, 700])
# tile 0 (the merge's shift) 2.5 std off: one pass (d^2 / n <= 8 M2); 40 std off: the second pass
@pytest.mark.parametrize("offset,outlier", [(0.0, 0.0), (100.0, 0.0), (1000.0, 0.0), (1000.0, 2.5), (3.0, 2.5),
                                            (3.0, 40.0)])
def test_gn_merge_matches_float64(lib, nt, P, offset, outlier):
    rng = np.random.default_rng(P * 7 + nt)
    part, mean, var = partials(rng, P, offset, outlier)
    out = np.full((nt, 2), np.nan, dtype=np.float32)
    lib.emu_gn_merge(part.ctypes.data_as(ctypes.c_void_p), ctypes.c_int(P), ctypes.c_float(EPS),
                     out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int(nt))
    assert (out == out[0]).all(), "threads disagree"
    got_mean, got_rstd = out[0].astype(np.float64)
    std = np.sqrt(var)
    want_rstd = 1.0 / np.sqrt(var + EPS)
    assert abs(got_mean - mean) <= MEAN_TOL * std + np.spacing(np.float32(mean)), (got_mean, mean, std)
    assert abs(got_rstd - want_rstd) <= RSTD_TOL * want_rstd, (got_rstd, want_rstd)


@pytest.mark.parametrize("nt", [32, 96, 256])
def test_block_sum_twice(lib, nt):
    rng = np.random.default_rng(nt)
    a = rng.standard_normal(nt).astype(np.float32)
    b = (5.0 + rng.standard_normal(nt)).astype(np.float32)
    out = np.full((nt, 2), np.nan, dtype=np.float32)
    lib.emu_block_sums(a.ctypes.data_as(ctypes.c_void_p), b.ctypes.data_as(ctypes.c_void_p),
                       out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int(nt))
    assert (out == out[0]).all(), "threads disagree"
    np.testing.assert_allclose(out[0], [a.astype(np.float64).sum(), b.astype(np.float64).sum()], rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("err", ["1.5e0 / 8388608.0", "-1.5e0 / 8388608.0", "0.0"])
def test_div_small_is_exact_below_2_22(tmp_path, err):
    lib = compile_emu(f"#define EMU_FDIV_ERR ({err})\n" + emu_source([]) + DIV_HARNESS, tmp_path)
    rng = np.random.default_rng(3)
    d = np.concatenate([np.arange(1, 600), rng.integers(1, 1 << 22, 3000)]).astype(np.int32)
    d = np.repeat(d, 4)
    # per divisor: exact multiples and their neighbours (where truncation errs), and random dividends
    k = rng.integers(0, (1 << 22) // d + 1)
    a = np.clip(np.stack([k * d, k * d - 1, k * d + d - 1, rng.integers(0, 1 << 22, d.size)])[np.arange(d.size) % 4,
                                                                                            np.arange(d.size)],
                0, (1 << 22) - 1).astype(np.int32)
    q = np.empty_like(a)
    lib.emu_div_small(a.ctypes.data_as(ctypes.c_void_p), d.ctypes.data_as(ctypes.c_void_p),
                      q.ctypes.data_as(ctypes.c_void_p), ctypes.c_int(a.size))
    np.testing.assert_array_equal(q, a // d)

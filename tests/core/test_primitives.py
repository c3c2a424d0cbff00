"""Each primitive of runtime/reference.py against an independent naive implementation.

The naive versions are explicit Python loops over plain floats (float64), written from the spec's
"Primitives" section, never from the vectorized code. Inputs are fresh random values on odd,
non-square shapes so that a swapped axis or a wrong padding cannot pass by symmetry.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from jetson_unet.model import reference as R

DTYPES = (np.float32, np.float64)

# Tolerances, per dtype, written once. The naive side is float64 from the SAME (exactly widened)
# inputs, so the error is the vectorized code's own rounding:
# - float32: sums of up to C*k*k = 245 products of O(1) values, ~sqrt(245) * 6e-8 * |terms| ~ 1e-6;
#   2e-5 leaves margin for BLAS summation order.
# - float64: the same sums at eps64 ~ 1e-16; 1e-11 leaves margin for BLAS order.
TOL = {np.float32: dict(atol=2e-5, rtol=2e-5), np.float64: dict(atol=1e-11, rtol=1e-11)}
# Element-wise maps (gelu, one erf per element): float32 rounds once or twice (~1e-7 relative).
TOL_ELEMENTWISE = {np.float32: dict(atol=1e-6, rtol=1e-6), np.float64: dict(atol=1e-13, rtol=1e-13)}
# sinusoidal is float64 by contract; its argument t * f_i is formed the same way on both sides.
TOL_SINUSOIDAL = dict(atol=1e-12, rtol=1e-12)
EPS = 1e-5  # the spec's norm_eps default


def _rand(rng: np.random.Generator, shape, dtype, scale: float = 1.0, shift: float = 0.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale + shift).astype(dtype)


# ---- conv2d --------------------------------------------------------------------------------

def naive_conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray, groups: int) -> np.ndarray:
    """torch.nn.Conv2d semantics: cross-correlation, stride 1, zero padding k//2, with bias."""
    B, C, H, W = x.shape
    O, Cg, k, _ = w.shape
    pad, per_group_out = k // 2, O // groups
    xs, ws, bs = x.astype(np.float64).tolist(), w.astype(np.float64).tolist(), b.astype(np.float64).tolist()
    out = np.empty((B, O, H, W), dtype=np.float64)
    for n in range(B):
        for o in range(O):
            c_base = (o // per_group_out) * Cg
            for y in range(H):
                for xx in range(W):
                    acc = bs[o]
                    for c in range(Cg):
                        plane, wk = xs[n][c_base + c], ws[o][c]
                        for ky in range(k):
                            iy = y + ky - pad
                            if not 0 <= iy < H:
                                continue
                            row = plane[iy]
                            for kx in range(k):
                                ix = xx + kx - pad
                                if 0 <= ix < W:
                                    acc += row[ix] * wk[ky][kx]
                    out[n, o, y, xx] = acc
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("C,O,H,W,k", [(3, 5, 7, 7, 1), (3, 5, 7, 5, 3), (5, 3, 5, 7, 7), (3, 3, 5, 5, 3)])
def test_conv2d_dense(rng, assert_close, dtype, C, O, H, W, k):
    x = _rand(rng, (2, C, H, W), dtype)
    w = _rand(rng, (O, C, k, k), dtype, scale=0.3)
    b = _rand(rng, (O,), dtype)
    got = R.conv2d(x, w, b, groups=1)
    assert_close(f"conv2d k={k} {C}->{O} {H}x{W}", got, naive_conv2d(x, w, b, 1), dtype, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("C,H,W,k", [(5, 7, 7, 7), (3, 5, 7, 7), (5, 7, 5, 3)])
def test_conv2d_depthwise(rng, assert_close, dtype, C, H, W, k):
    x = _rand(rng, (2, C, H, W), dtype)
    w = _rand(rng, (C, 1, k, k), dtype, scale=0.3)
    b = _rand(rng, (C,), dtype)
    got = R.conv2d(x, w, b, groups=C)
    assert_close(f"depthwise k={k} C={C} {H}x{W}", got, naive_conv2d(x, w, b, C), dtype, **TOL[dtype])


# ---- gelu ----------------------------------------------------------------------------------

def _gelu_exact(v: float) -> float:
    return 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))


def _gelu_tanh(v: float) -> float:
    return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_gelu_is_the_exact_erf_form(rng, assert_close, dtype):
    x = _rand(rng, (2, 5, 7, 7), dtype, scale=3.0)
    x.flat[:4] = np.array([-9.5, -5.25, 4.75, 8.5], dtype)   # far tails: ~0 and ~x
    want = np.vectorize(_gelu_exact)(x.astype(np.float64))
    assert_close("gelu", R.gelu(x), want, dtype, **TOL_ELEMENTWISE[dtype])
    # A tanh-approximation GELU must fail this test: it departs from erf by far more than the tolerance.
    tanh_err = np.abs(np.vectorize(_gelu_tanh)(x.astype(np.float64)) - want).max()
    assert tanh_err > 100 * TOL_ELEMENTWISE[np.float32]["atol"], f"inputs do not separate erf from tanh ({tanh_err:.2g})"


def test_erf_providers_and_sigmoid_agree_with_scipy():
    """gelu's two erf providers (SciPy's ufunc for activations, libm's for the time MLP: a GPU process
    then never imports SciPy) agree within float64 rounding, and the gate's sigmoid is SciPy's expit
    within 4 ulps, without overflow warnings at +-1000, in float32 and float64."""
    from scipy.special import expit
    x = np.concatenate([np.linspace(-9.0, 9.0, 20001), [0.0, -0.0, 30.0, -30.0]])
    assert np.abs(R.erf_libm(x) - R.erf_scipy(x)).max() <= 4.5e-16
    for dtype in DTYPES:
        v = np.concatenate([np.linspace(-50.0, 50.0, 10001), [-1000.0, 1000.0, 0.0]]).astype(dtype)
        with np.errstate(over="raise", invalid="raise", divide="raise"):   # underflow to 0 is right
            got = R.sigmoid(v)
        assert got.dtype == dtype
        np.testing.assert_allclose(got, expit(v), rtol=4 * np.finfo(dtype).eps, atol=0)


def test_a_gpu_process_does_not_import_scipy():
    """The GPU path's host work (the time tables, weight packing) needs no SciPy: its import is
    0.2-0.25 s of a cold start on the 2-core host. Nor does it make a float64 copy of every
    parameter (127 MB for the shipped model) for those tables."""
    import subprocess
    import sys
    code = """
import sys
from tests.helpers.fakes import FakeBackend
import jetson_unet.cli, jetson_unet.pipeline, jetson_unet.sampling.gpu
from jetson_unet.executor.executor import GpuExecutor
from jetson_unet.model.config import UNetConfig
from jetson_unet.model.weights import random_params
import jetson_unet.model.reference as R
made = []
class Spy(R.CastParams):
    def __getitem__(self, name):
        made.append(name)
        return super().__getitem__(name)
R.CastParams = Spy
class W:
    config = UNetConfig(image_size=16, dim=8, dim_mults=(1, 2), time_dim=32)
    params = random_params(config, 0)
GpuExecutor(W(), "fp16", batch=1, backend=FakeBackend(sms=8))
assert "scipy" not in sys.modules, "scipy imported"
assert made and all(n.startswith("time_mlp.") or n.endswith(".mlp.weight") or n.endswith(".mlp.bias") for n in made), made
"""
    from pathlib import Path
    r = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


# ---- gn1 -----------------------------------------------------------------------------------

def naive_gn1(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """Per sample: ONE mean and biased variance over all of C, H, W (GroupNorm(1, C))."""
    B, C, H, W = x.shape
    out = np.empty(x.shape, dtype=np.float64)
    for n in range(B):
        vals = [float(v) for v in x[n].ravel()]
        mean = math.fsum(vals) / len(vals)
        var = math.fsum((v - mean) ** 2 for v in vals) / len(vals)
        inv = 1.0 / math.sqrt(var + eps)
        for c in range(C):
            for y in range(H):
                for xx in range(W):
                    out[n, c, y, xx] = (float(x[n, c, y, xx]) - mean) * inv * float(w[c]) + float(b[c])
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(2, 3, 7, 5), (2, 5, 5, 5)])
def test_gn1_against_loops(rng, assert_close, dtype, shape):
    # Per-channel offsets and a common shift: a per-channel (instance) norm or a norm without
    # the mean subtraction gives visibly different numbers.
    x = (_rand(rng, shape, np.float64, scale=2.0, shift=3.0)
         + rng.uniform(-2, 2, size=(1, shape[1], 1, 1))).astype(dtype)
    w = _rand(rng, (shape[1],), dtype, scale=0.5, shift=1.0)
    b = _rand(rng, (shape[1],), dtype, scale=0.5)
    assert_close(f"gn1 {shape}", R.gn1(x, w, b, EPS), naive_gn1(x, w, b, EPS), dtype, **TOL[dtype])


def test_gn1_statistics_span_channels(rng):
    """GroupNorm(1) semantics: with w = 1, b = 0 the whole (C, H, W) map of each sample has mean 0
    and biased variance var/(var + eps); single channels keep their offsets (not an instance norm)."""
    C = 5
    x = rng.standard_normal((2, C, 7, 7)) + np.arange(C)[None, :, None, None] * 2.0
    y = R.gn1(x, np.ones(C), np.zeros(C), EPS)
    var = x.reshape(2, -1).var(axis=1)
    np.testing.assert_allclose(y.reshape(2, -1).mean(axis=1), 0.0, atol=1e-12, err_msg="per-sample mean")
    np.testing.assert_allclose(y.reshape(2, -1).var(axis=1), var / (var + EPS), rtol=1e-12, err_msg="per-sample var")
    per_channel_means = y.mean(axis=(2, 3))
    assert np.abs(per_channel_means).max() > 0.5, "channels were normalized separately"


def test_primitives_match_torch_when_available(rng, assert_close):
    """Cross-check against torch (only where installed; the runtime itself never imports it)."""
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((2, 5, 6, 10)) * 2.0 + 1.0
    w, b = rng.standard_normal(5), rng.standard_normal(5)
    gn = torch.nn.GroupNorm(1, 5, eps=EPS).double()
    with torch.no_grad():
        gn.weight.copy_(torch.from_numpy(w))
        gn.bias.copy_(torch.from_numpy(b))
        want_gn = gn(torch.from_numpy(x)).numpy()
        want_un = torch.nn.functional.pixel_unshuffle(torch.from_numpy(x), 2).numpy()
        want_gelu = torch.nn.functional.gelu(torch.from_numpy(x)).numpy()
    assert_close("gn1 vs torch GroupNorm(1)", R.gn1(x, w, b, EPS), want_gn, np.float64, atol=1e-12, rtol=1e-12)
    assert_close("pixel_unshuffle2 vs torch", R.pixel_unshuffle2(x), want_un, np.float64, atol=0, rtol=0)
    assert_close("gelu vs torch (erf)", R.gelu(x), want_gelu, np.float64, **TOL_ELEMENTWISE[np.float64])


# ---- pixel_unshuffle2 / up2 ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_pixel_unshuffle2_order(rng, dtype):
    B, C, H, W = 2, 3, 6, 10
    x = _rand(rng, (B, C, H, W), dtype)
    y = R.pixel_unshuffle2(x)
    assert y.shape == (B, 4 * C, H // 2, W // 2), f"pixel_unshuffle2 shape {y.shape}"
    assert y.dtype == np.dtype(dtype), f"pixel_unshuffle2 dtype {y.dtype}"
    for n in range(B):
        for c in range(C):
            for dy in range(2):
                for dx in range(2):
                    for i in range(H // 2):
                        for j in range(W // 2):
                            assert y[n, c * 4 + dy * 2 + dx, i, j] == x[n, c, 2 * i + dy, 2 * j + dx], \
                                f"pixel_unshuffle2 out[{n}, {c * 4 + dy * 2 + dx}, {i}, {j}]"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_up2_nearest(rng, dtype):
    B, C, H, W = 2, 5, 3, 5
    x = _rand(rng, (B, C, H, W), dtype)
    y = R.up2(x)
    assert y.shape == (B, C, 2 * H, 2 * W), f"up2 shape {y.shape}"
    assert y.dtype == np.dtype(dtype), f"up2 dtype {y.dtype}"
    for n in range(B):
        for c in range(C):
            for i in range(2 * H):
                for j in range(2 * W):
                    assert y[n, c, i, j] == x[n, c, i // 2, j // 2], f"up2 out[{n}, {c}, {i}, {j}]"


# ---- sinusoidal / linear -------------------------------------------------------------------

@pytest.mark.parametrize("dim", [6, 8, 32])
def test_sinusoidal_matches_spec_formula(rng, assert_close, dim):
    t = rng.integers(0, 1000, size=5)
    half = dim // 2
    want = np.empty((5, dim))
    for n, tv in enumerate(t.tolist()):
        for i in range(half):
            f = math.exp(-math.log(10000.0) * i / (half - 1))
            want[n, i] = math.sin(tv * f)
            want[n, half + i] = math.cos(tv * f)
    assert_close(f"sinusoidal dim={dim}", R.sinusoidal(t, dim), want, np.float64, **TOL_SINUSOIDAL)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_linear(rng, assert_close, dtype):
    x, w, b = _rand(rng, (3, 7), dtype), _rand(rng, (5, 7), dtype), _rand(rng, (5,), dtype)
    want = np.empty((3, 5))
    for n in range(3):
        for o in range(5):
            want[n, o] = float(b[o]) + math.fsum(float(x[n, i]) * float(w[o, i]) for i in range(7))
    assert_close("linear", R.linear(x, w, b), want, dtype, **TOL[dtype])

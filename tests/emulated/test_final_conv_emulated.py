"""The final 1x1 conv (kernels/io.cu final_conv) run on the CPU by tests/emu/simt.h (see
tests/test_conv_pipe_emulated.py) against NumPy in float64: 16-byte and scalar loads, fp16 / bf16 /
fp32, the input a view of a wider buffer (pixel stride > Cin, offset window), a ragged last CTA, and
the fp32 output NaN-poisoned (every element must be written); then the sampling step it takes for the
gpu mode (xs = c_x xs + c_eps eps + sigma z, z an NCHW noise row, or none) against schedule.p_sample."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from jetson_unet.ops.common import cdiv, padded, to_device
from jetson_unet.ops.io import FINAL_THREADS
from jetson_unet.ops.keys import SimpleKey
from tests.emulated.test_conv_pipe_emulated import kernel_lib, macro_params
from tests.emulated.test_dwconv_emulated import as_float

pytestmark = pytest.mark.slow

# (name, dtype, vec, pixels, Cin, Cout, input pixel stride, input channel offset)
CASES = [
    ("fp16-v8-view", "fp16", 8, 200, 32, 3, 48, 8),
    ("fp16-scalar-odd", "fp16", 1, 77, 13, 5, 13, 0),
    ("bf16-v8", "bf16", 8, 130, 64, 8, 64, 0),
    ("fp32-v4-view", "fp32", 4, 129, 20, 3, 28, 4),
]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return kernel_lib("io.cu", [SimpleKey("final", dt, 0, v) for _, dt, v, *_ in CASES], "FINAL_PARAMS",
                      "FINAL_ARGS", tmp_path_factory.mktemp("emu-final"))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_final_conv_matches_numpy(lib, case):
    name, dt, vec, npix, cin, cout, ldx, x0 = case
    rng = np.random.default_rng(11)
    xbuf = to_device(rng.standard_normal((npix, ldx)), dt)
    if dt == "fp16":
        xbuf = xbuf.view(np.uint16)
    w = rng.standard_normal((cout, cin)).astype(np.float32)
    bias = padded(rng.standard_normal(cout).astype(np.float32), 8)
    out = np.full((npix, cout), np.nan, dtype=np.float32)
    esize = 4 if dt == "fp32" else 2
    args = [ctypes.c_void_p(xbuf.ctypes.data + x0 * esize), npix, cin, ldx, ctypes.c_void_p(w.ctypes.data),
            ctypes.c_void_p(bias.ctypes.data), ctypes.c_void_p(out.ctypes.data), cout,
            ctypes.c_void_p(0), ctypes.c_void_p(0), ctypes.c_void_p(0), npix]
    kinds = macro_params("io.cu", "FINAL_PARAMS")
    cargs = [a if k == "p" else ctypes.c_int(a) for k, a in zip(kinds, args)]
    sym = SimpleKey("final", dt, 0, vec).symbol
    getattr(lib, "emu_" + sym)(cdiv(npix, FINAL_THREADS), 1, 1, FINAL_THREADS, *cargs)
    x = as_float(xbuf[:, x0:x0 + cin], dt)
    want = x @ w.astype(np.float64).T + bias[:cout]
    assert not np.isnan(out).any(), f"{name}: outputs unwritten"
    err = np.abs(out - want).max() / np.abs(want).max()
    assert err < 1e-5, f"{name}: rel error {err:.3g}"   # fp32 sums of <= 64 products


@pytest.mark.parametrize("row", [1, -1], ids=["noise-row-1", "last-step-no-noise"])
def test_final_conv_takes_the_sampling_step(lib, row):
    """Two 9x9 images of 3 channels, fp16 activations: xs (fp32 NHWC) updated in place with the step
    of the float4 (c_x, c_eps, sigma, row bits) from the eps values, as schedule.p_sample would."""
    from jetson_unet.model.schedule import Step, p_sample
    dt, vec, b, hw, cin, cout = "fp16", 8, 2, 81, 32, 3
    npix = b * hw
    rng = np.random.default_rng(5)
    xbuf = to_device(rng.standard_normal((npix, cin)), dt).view(np.uint16)
    w = rng.standard_normal((cout, cin)).astype(np.float32)
    bias = padded(rng.standard_normal(cout).astype(np.float32), 8)
    eps = np.full((npix, cout), np.nan, dtype=np.float32)
    xs = rng.standard_normal((npix, cout)).astype(np.float32)                 # NHWC image
    noise = rng.standard_normal((2, b, cout, hw)).astype(np.float32)          # NCHW rows
    c_x, c_eps, sigma = 1.02, -0.31, 0.4
    step = np.array([c_x, c_eps, sigma, np.array(row, np.int32).view(np.float32)], dtype=np.float32)
    x_before = xs.copy()
    args = [ctypes.c_void_p(xbuf.ctypes.data), npix, cin, cin, ctypes.c_void_p(w.ctypes.data),
            ctypes.c_void_p(bias.ctypes.data), ctypes.c_void_p(eps.ctypes.data), cout, ctypes.c_void_p(xs.ctypes.data),
            ctypes.c_void_p(noise.ctypes.data), ctypes.c_void_p(step.ctypes.data), hw]
    cargs = [a if k == "p" else ctypes.c_int(a) for k, a in zip(macro_params("io.cu", "FINAL_PARAMS"), args)]
    getattr(lib, "emu_" + SimpleKey("final", dt, 0, vec).symbol)(cdiv(npix, FINAL_THREADS), 1, 1,
                                                                   FINAL_THREADS, *cargs)
    assert not np.isnan(eps).any()
    nchw = lambda a: a.reshape(b, hw, cout).transpose(0, 2, 1).astype(np.float64)   # noqa: E731
    z = noise[row].astype(np.float64) if row >= 0 else None
    want = p_sample(nchw(x_before), nchw(eps), Step(t=0, c_x=c_x, c_eps=c_eps, sigma=sigma if row >= 0 else 0.0), z)
    err = np.abs(nchw(xs) - want).max() / np.abs(want).max()
    assert err < 1e-6, f"rel error {err:.3g}"   # fp32 fma of the stored eps

"""The final 1x1 conv (kernels/io.cu final_conv) run on the CPU by tests/emu/simt.h (see
tests/test_conv_pipe_emulated.py) against NumPy in float64: 16-byte and scalar loads, fp16 / bf16 /
fp32, the input a view of a wider buffer (pixel stride > Cin, offset window), a ragged last CTA, and
the fp32 output NaN-poisoned (every element must be written)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from runtime.gpu import ops
from runtime.gpu.kernels import SimpleKey
from test_conv_pipe_emulated import kernel_lib, macro_params
from test_dwconv_emulated import as_float

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
    xbuf = ops.to_device(rng.standard_normal((npix, ldx)), dt)
    if dt == "fp16":
        xbuf = xbuf.view(np.uint16)
    w = rng.standard_normal((cout, cin)).astype(np.float32)
    bias = ops.padded(rng.standard_normal(cout).astype(np.float32), 8)
    out = np.full((npix, cout), np.nan, dtype=np.float32)
    esize = 4 if dt == "fp32" else 2
    args = [ctypes.c_void_p(xbuf.ctypes.data + x0 * esize), npix, cin, ldx, ctypes.c_void_p(w.ctypes.data),
            ctypes.c_void_p(bias.ctypes.data), ctypes.c_void_p(out.ctypes.data), cout]
    kinds = macro_params("io.cu", "FINAL_PARAMS")
    cargs = [a if k == "p" else ctypes.c_int(a) for k, a in zip(kinds, args)]
    sym = SimpleKey("final", dt, 0, vec).symbol
    getattr(lib, "emu_" + sym)(ops.cdiv(npix, ops.FINAL_THREADS), 1, 1, ops.FINAL_THREADS, *cargs)
    x = as_float(xbuf[:, x0:x0 + cin], dt)
    want = x @ w.astype(np.float64).T + bias[:cout]
    assert not np.isnan(out).any(), f"{name}: outputs unwritten"
    err = np.abs(out - want).max() / np.abs(want).max()
    assert err < 1e-5, f"{name}: rel error {err:.3g}"   # fp32 sums of <= 64 products

"""The image-input conv (kernels/io.cu init_conv) run on the CPU by tests/emu/simt.h (see
tests/test_conv_pipe_emulated.py) against the NumPy reference's conv2d in float64: tiles 8 and 16
pixels wide (ops.init_tw), ragged last row and column tiles, an output channel count that is not a
multiple of 8 (a partial last group, scalar stores), the output a view of a wider buffer, two
samples, fp16 / bf16 / fp32 outputs. Outputs are NaN-poisoned: every element the kernel owns must be
written, and nothing outside its channel window may be."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from runtime.gpu import ops
from runtime.gpu.kernels import SimpleKey
from runtime.reference import conv2d
from test_conv_pipe_emulated import kernel_lib, macro_params
from test_dwconv_emulated import as_float, poison

pytestmark = pytest.mark.slow
K, CIN = 7, 3
# (name, dtype, tile width, H, W, Cout, output pixel stride, output channel offset, batch)
CASES = [
    ("fp16-w8-ragged-view", "fp16", 8, 19, 21, 13, 24, 8, 2),
    ("fp16-w16-ragged-view", "fp16", 16, 19, 21, 13, 24, 8, 2),
    ("bf16-w16-whole-groups", "bf16", 16, 16, 16, 32, 64, 0, 1),
    ("fp32-w16", "fp32", 16, 11, 9, 8, 8, 0, 2),
]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return kernel_lib("io.cu", [SimpleKey("init", dt, K, CIN, tw) for _, dt, tw, *_ in CASES], "INIT_PARAMS",
                      "INIT_ARGS", tmp_path_factory.mktemp("emu-init"))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_init_conv_matches_reference(lib, case):
    name, dt, tw, h, w, cout, ldo, o0, b = case
    rng = np.random.default_rng(5)
    x = rng.standard_normal((b, h, w, CIN)).astype(np.float32)   # the fp32 NHWC image
    wt = (rng.standard_normal((cout, CIN, K, K)) / K).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    coutp = ops.round_up(cout, 8)
    wp = np.zeros((K, K, CIN, coutp), dtype=np.float32)
    wp[..., :cout] = wt.transpose(2, 3, 1, 0)
    bp = ops.padded(bias, coutp)
    out = poison((b, h, w, ldo), dt)
    esize = 4 if dt == "fp32" else 2
    args = [ctypes.c_void_p(x.ctypes.data), h, w, CIN, ctypes.c_void_p(wp.ctypes.data),
            ctypes.c_void_p(bp.ctypes.data), ctypes.c_void_p(out.ctypes.data + o0 * esize), cout, coutp, ldo]
    cargs = [a if k == "p" else ctypes.c_int(a) for k, a in zip(macro_params("io.cu", "INIT_PARAMS"), args)]
    sym = SimpleKey("init", dt, K, CIN, tw).symbol
    getattr(lib, "emu_" + sym)(ops.cdiv(h, ops.INIT_TILE) * ops.cdiv(w, tw), 1, b, 256, *cargs)

    want = conv2d(x.transpose(0, 3, 1, 2).astype(np.float64), wt.astype(np.float64),
                  bias.astype(np.float64)).transpose(0, 2, 3, 1)
    got_all = as_float(out, dt)
    got = got_all[..., o0:o0 + cout]
    assert not np.isnan(got).any(), f"{name}: {np.isnan(got).sum()} outputs unwritten"
    assert np.isnan(np.delete(got_all, np.s_[o0:o0 + cout], axis=3)).all(), f"{name}: wrote outside its window"
    # fp32 sums of 147 products, then one rounding to the output dtype
    tol = {"fp32": 1e-5, "fp16": 2.0 ** -10, "bf16": 2.0 ** -7}[dt] * 2 * np.abs(want).max()
    err = np.abs(got - want).max()
    assert err <= tol, f"{name}: max error {err:.3g} > {tol:.3g}"

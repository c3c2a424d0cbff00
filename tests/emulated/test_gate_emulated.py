"""The narrow attention gate (kernels/gate.cu) run on the CPU by tests/emu/simt.h (see
tests/test_conv_pipe_emulated.py), against the gate in float64 on the same 16-bit inputs and
weights: sigmoid(psi . relu(Wg x + Wr skip + b) + psi_b) * skip. Cases: the shipped model's two
shapes (32 + 32 and 64 + 32 channels; the wide kernel: 128 + 64, 256 + 128, and 96 + 32), fp16
and bf16, views of concat buffers on all three tensors (pixel strides past the channels, offset
channel windows), a ragged last row tile, and grids that leave each warp several row tiles (the
persistent loop and its register prefetch).
Outputs are NaN-poisoned: every owned element must be written, nothing outside the window."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from jetson_unet.ops.common import to_device
from jetson_unet.ops.gate import GATE_ROWS_WARPS, pack_gate_rows
from jetson_unet.ops.keys import SimpleKey, narrow_gate
from tests.emulated.test_conv_pipe_emulated import kernel_lib, macro_params
from tests.emulated.test_dwconv_emulated import as_float, poison

pytestmark = pytest.mark.slow

# (name, dtype, Cg, Cr, pixels M, (ldx, x0), (lds, s0), (ldo, o0), CTAs)
CASES = [
    ("g32-r32-views-ragged", "fp16", 32, 32, 150, (64, 32), (48, 8), (64, 32), 1),
    ("g64-r32-views-ragged", "fp16", 64, 32, 71, (96, 0), (96, 64), (96, 64), 2),
    ("g32-r32-bf16-dense", "bf16", 32, 32, 128, (32, 0), (32, 0), (32, 0), 2),
    ("g16-r16-one-tile-per-warp", "fp16", 16, 16, 40, (24, 8), (16, 0), (40, 8), 1),
    # gate_wide (a CTA of Cg / 32 warps per 16 rows; CTAs = the row tiles): the 16x16 and 8x8
    # levels' shapes, a ragged last tile, views
    ("wide-g128-r64-views-ragged", "fp16", 128, 64, 41, (200, 8), (72, 8), (96, 16), 0),
    ("wide-g256-r128-bf16", "bf16", 256, 128, 32, (256, 0), (384, 256), (384, 256), 0),
    ("wide-g96-r32-fp16", "fp16", 96, 32, 20, (96, 0), (32, 0), (32, 0), 0),
]


def key(dt, g, r):
    return SimpleKey("gate_rows", dt, 0, g, r)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return kernel_lib("gate.cu", [key(dt, g, r) for _, dt, g, r, *_ in CASES], "GATE_ROWS_PARAMS",
                      "GATE_ROWS_ARGS", tmp_path_factory.mktemp("emu-gate"))


def test_pack_gate_rows_is_the_b_fragment_layout():
    """Read back through mma.m16n8k16's B map (lane l holds column l // 4, k pairs 2 (l % 4) and
    + 8), the packed weights are [Wg | Wr][n][k]."""
    rng = np.random.default_rng(2)
    wg, wr = rng.standard_normal((16, 16)), rng.standard_normal((16, 32))
    f = pack_gate_rows(wg, wr, "fp16").astype(np.float32)
    assert f.shape == (3, 2, 32, 2, 2)
    w = np.concatenate([wg, wr], axis=1)
    for s in range(3):
        for j in range(2):
            for lane in range(32):
                for r in range(2):
                    for e in range(2):
                        k, n = 16 * s + 2 * (lane % 4) + 8 * r + e, 8 * j + lane // 4
                        assert f[s, j, lane, r, e] == np.float16(w[n, k])


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gate_rows_matches_float64(lib, case):
    name, dt, g, r, m, (ldx, x0), (lds, s0), (ldo, o0), ctas = case
    rng = np.random.default_rng(11)
    x16 = to_device(rng.standard_normal((m, ldx)), dt)
    s16 = to_device(rng.standard_normal((m, lds)), dt)
    wg = rng.standard_normal((g, g)) / np.sqrt(g)
    wr = rng.standard_normal((g, r)) / np.sqrt(r)
    bias = (rng.standard_normal(g) * 0.3).astype(np.float32)
    psi = (rng.standard_normal(g) / np.sqrt(g)).astype(np.float32)
    psi_b = 0.25
    w = np.ascontiguousarray(pack_gate_rows(wg, wr, dt).reshape(-1))
    out = poison((m, ldo), dt)
    ptr = lambda a, off=0: ctypes.c_void_p(a.ctypes.data + 2 * off)   # noqa: E731
    args = [ptr(x16, x0), ldx, ptr(s16, s0), lds, ptr(w), ptr(bias), ptr(psi), psi_b, ptr(out, o0), ldo, m]
    cargs = [a if k == "p" else (ctypes.c_float(a) if k == "f" else ctypes.c_int(a))
             for k, a in zip(macro_params("gate.cu", "GATE_ROWS_PARAMS"), args)]
    grid, block = (ctas, 32 * GATE_ROWS_WARPS) if narrow_gate(g, r) else (-(-m // 16), g)
    getattr(lib, "emu_" + key(dt, g, r).symbol)(grid, 1, 1, block, *cargs)

    xs = as_float(x16, dt)[:, x0:x0 + g]
    sk = as_float(s16, dt)[:, s0:s0 + r]
    wq = as_float(to_device(np.concatenate([wg, wr], axis=1), dt), dt)   # the weights as packed: rounded
    h = np.maximum(np.concatenate([xs, sk], axis=1) @ wq.T + bias, 0.0)
    gate = 1.0 / (1.0 + np.exp(-(h @ psi.astype(np.float64) + psi_b)))
    want = gate[:, None] * sk
    got_all = as_float(out, dt)
    got = got_all[:, o0:o0 + r]
    assert not np.isnan(got).any(), f"{name}: {np.isnan(got).sum()} outputs unwritten"
    assert np.isnan(np.delete(got_all, np.s_[o0:o0 + r], axis=1)).all(), f"{name}: wrote outside its window"
    # one rounding of s * skip to the 16-bit type, s from an fp32 GEMM of rounded inputs
    tol = {"fp16": 2.0 ** -10, "bf16": 2.0 ** -7}[dt] * 2 * np.abs(want).max()
    err = np.abs(got - want).max()
    assert err <= tol, f"{name}: max error {err:.3g} > {tol:.3g}"


def test_gates_compile_for_sm87_without_spills(ptxas87):
    """The shipped model's gates, fp16 and bf16, through ptxas for the Orin's sm_87."""
    keys = [key(dt, g, r) for dt in ("fp16", "bf16") for g, r in ((32, 32), (64, 32), (128, 64), (256, 128))]
    rep = ptxas87.report(keys)
    for k in keys:
        assert rep[k.symbol]["spill"] == 0 and rep[k.symbol]["stack"] == 0, (k.symbol, rep[k.symbol])

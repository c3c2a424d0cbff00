"""The final 1x1 conv (kernels/io.cu final_conv) run on the CPU by tests/emu/simt.h (see
tests/test_conv_pipe_emulated.py) against NumPy in float64: 16-byte and scalar loads, fp16 / bf16 /
fp32, the input a view of a wider buffer (pixel stride > Cin, offset window), a ragged last CTA, and
the fp32 output NaN-poisoned (every element must be written); then the sampling step it takes for the
gpu mode (xs = c_x xs + c_eps eps + c_h hist + sigma z and hist = d_x xs + d_eps eps, z image b's NCHW
noise row of the image-major rows [B][rows][C][H*W], or none) against schedule.p_sample."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from jetson_unet.ops.common import cdiv, padded, to_device
from jetson_unet.paths import kernels_dir
from jetson_unet.ops.io import FINAL_PIXELS, FINAL_THREADS
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
    return kernel_lib("io.cu", sorted({SimpleKey("final", dt, cout, v) for _, dt, v, _, _, cout, *_ in CASES}
                                     | {SimpleKey("final", "fp16", 3, 8)}, key=lambda k: k.symbol), "FINAL_PARAMS",
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
            ctypes.c_void_p(0), ctypes.c_void_p(0), ctypes.c_void_p(0), ctypes.c_void_p(0), 0, npix]   # no step
    kinds = macro_params("io.cu", "FINAL_PARAMS")
    cargs = [a if k == "p" else ctypes.c_int(a) for k, a in zip(kinds, args)]
    sym = SimpleKey("final", dt, cout, vec).symbol
    getattr(lib, "emu_" + sym)(cdiv(npix, FINAL_PIXELS), 1, 1, FINAL_THREADS, *cargs)
    x = as_float(xbuf[:, x0:x0 + cin], dt)
    want = x @ w.astype(np.float64).T + bias[:cout]
    assert not np.isnan(out).any(), f"{name}: outputs unwritten"
    err = np.abs(out - want).max() / np.abs(want).max()
    assert err < 1e-5, f"{name}: rel error {err:.3g}"   # fp32 sums of <= 64 products


def run_step(lib, b, hw, coefs, row, rows, hist, seed):
    """final_conv of b images of hw pixels (fp16 activations, 32 -> 3 channels) taking the step of
    cur = two float4: (c_x, c_eps, sigma, row bits), (c_h, d_x, d_eps, 0). Returns (x before, eps,
    x after, noise): xs is fp32 NHWC, the noise image-major [b][rows][3][hw]; hist is updated in place."""
    dt, vec, cin, cout = "fp16", 8, 32, 3
    npix = b * hw
    rng = np.random.default_rng(seed)
    xbuf = to_device(rng.standard_normal((npix, cin)), dt).view(np.uint16)
    w = rng.standard_normal((cout, cin)).astype(np.float32)
    bias = padded(rng.standard_normal(cout).astype(np.float32), 8)
    eps = np.full((npix, cout), np.nan, dtype=np.float32)
    xs = rng.standard_normal((npix, cout)).astype(np.float32)                 # NHWC image
    noise = rng.standard_normal((b, rows, cout, hw)).astype(np.float32)       # image-major NCHW rows
    c_x, c_eps, sigma, c_h, d_x, d_eps = coefs
    step = np.array([c_x, c_eps, sigma, np.array(row, np.int32).view(np.float32), c_h, d_x, d_eps, 0.0],
                    dtype=np.float32)
    x_before = xs.copy()
    args = [ctypes.c_void_p(xbuf.ctypes.data), npix, cin, cin, ctypes.c_void_p(w.ctypes.data),
            ctypes.c_void_p(bias.ctypes.data), ctypes.c_void_p(eps.ctypes.data), cout, ctypes.c_void_p(xs.ctypes.data),
            ctypes.c_void_p(noise.ctypes.data), ctypes.c_void_p(step.ctypes.data), ctypes.c_void_p(hist.ctypes.data),
            rows, hw]
    cargs = [a if k == "p" else ctypes.c_int(a) for k, a in zip(macro_params("io.cu", "FINAL_PARAMS"), args)]
    getattr(lib, "emu_" + SimpleKey("final", dt, cout, vec).symbol)(cdiv(npix, FINAL_PIXELS), 1, 1,
                                                                   FINAL_THREADS, *cargs)
    assert not np.isnan(eps).any()
    return x_before, eps, xs, noise


@pytest.mark.parametrize("row", [1, -1], ids=["noise-row-1", "last-step-no-noise"])
def test_final_conv_takes_the_sampling_step(lib, row):
    """Two 9x9 images of 3 channels, fp16 activations: xs (fp32 NHWC) updated in place with the step
    of cur (c_x, c_eps, sigma, row bits; c_h = d_x = d_eps = 0: DDPM / DDIM) from the eps values, as
    schedule.p_sample would; the history is neither read nor written (NaN-poisoned, it stays so)."""
    from jetson_unet.model.schedule import Step, p_sample
    b, hw, cout, rows = 2, 81, 3, 2
    c_x, c_eps, sigma = 1.02, -0.31, 0.4
    hist = np.full((b * hw, cout), np.nan, np.float32)
    x_before, eps, xs, noise = run_step(lib, b, hw, (c_x, c_eps, sigma, 0.0, 0.0, 0.0), row, rows, hist, seed=5)
    nchw = lambda a: a.reshape(b, hw, cout).transpose(0, 2, 1).astype(np.float64)   # noqa: E731
    z = noise[:, row].astype(np.float64) if row >= 0 else None                     # each image's row `row`
    want, h_next = p_sample(nchw(x_before), nchw(eps), Step(t=0, c_x=c_x, c_eps=c_eps,
                                                            sigma=sigma if row >= 0 else 0.0), z)
    assert h_next is None
    err = np.abs(nchw(xs) - want).max() / np.abs(want).max()
    assert err < 1e-6, f"rel error {err:.3g}"   # fp32 fma of the stored eps
    assert np.isnan(hist).all(), "no history term: hist untouched"


# (c_x, c_eps, sigma, c_h, d_x, d_eps, row): the steps of a multistep sampler (DPM-Solver++(2M)) and
# the history with noise as well (image-major rows)
HIST_CASES = {
    "first-step": ((1.7, -0.9, 0.0, 0.0, 2.3, -2.1), -1),     # saves D_0, reads nothing (hist poisoned)
    "middle-step": ((1.4, -0.6, 0.0, -0.35, 1.9, -1.2), -1),  # reads D_{k-1}, saves D_k
    "last-step": ((1.1, -0.2, 0.0, 0.0, 1.1, -0.2), -1),      # x' = D, saved too
    "history-and-noise": ((0.97, -0.4, 0.3, 0.25, 1.3, -0.8), 2),
    "read-only": ((0.9, 0.1, 0.0, 0.6, 0.0, 0.0), -1),        # reads h, saves nothing: hist stays
}


@pytest.mark.parametrize("case", list(HIST_CASES), ids=list(HIST_CASES))
def test_final_conv_takes_the_step_with_history(lib, case):
    """Three 7x7 images: x' = c_x x + c_eps eps + c_h h + sigma z and h' = d_x x + d_eps eps (x before
    the update), z image b's row of [B][rows][C][H*W], against schedule.p_sample in float64."""
    from jetson_unet.model.schedule import Step, p_sample
    (c_x, c_eps, sigma, c_h, d_x, d_eps), row = HIST_CASES[case]
    b, hw, cout, rows = 3, 49, 3, 4
    rng = np.random.default_rng(21)
    h_prev = rng.standard_normal((b * hw, cout)).astype(np.float32) * 3   # NHWC, as the image
    hist = h_prev.copy() if c_h else np.full_like(h_prev, np.nan)          # unread: poisoned
    x_before, eps, xs, noise = run_step(lib, b, hw, (c_x, c_eps, sigma, c_h, d_x, d_eps), row, rows, hist, seed=9)
    nchw = lambda a: a.reshape(b, hw, cout).transpose(0, 2, 1).astype(np.float64)   # noqa: E731
    z = noise[:, row].astype(np.float64) if row >= 0 else None
    st = Step(t=0, c_x=c_x, c_eps=c_eps, sigma=sigma if row >= 0 else 0.0, c_h=c_h, d_x=d_x, d_eps=d_eps)
    want, h_want = p_sample(nchw(x_before), nchw(eps), st, z, nchw(h_prev) if c_h else None)
    scale = np.abs(c_x * nchw(x_before)) + np.abs(c_eps * nchw(eps)) + (np.abs(c_h * nchw(h_prev)) if c_h else 0)
    err = np.abs(nchw(xs) - want).max() / scale.max()
    assert err < 1e-6, f"{case}: x' rel error {err:.3g}"   # fp32 fmas of the stored eps
    if d_x or d_eps:
        assert not np.isnan(hist).any(), f"{case}: every history element written"
        err = np.abs(nchw(hist) - h_want).max() / np.abs(h_want).max()
        assert err < 1e-6, f"{case}: h' rel error {err:.3g}"
    else:
        assert h_want is None
        np.testing.assert_array_equal(hist, h_prev, err_msg=f"{case}: a step that saves nothing keeps hist")
    if row >= 0:   # a wrong (row-major) noise index would read another image's or another row's z
        wrong = p_sample(nchw(x_before), nchw(eps), st, noise.reshape(rows, b, cout, hw)[row].astype(np.float64),
                         nchw(h_prev) if c_h else None)[0]
        assert np.abs(nchw(xs) - wrong).max() > 1e-3 * scale.max()


def test_image_u8_is_to_uint8(tmp_path):
    """image_u8 (kernels/io.cu, the gpu mode's image out) against schedule.to_uint8 byte for byte: values
    inside and outside [-1, 1], the exact ends, the half-way points of every level (where rint's half to
    even decides), their neighbours 1 ulp away, and a ragged last CTA (n not a multiple of 256)."""
    from jetson_unet.model.schedule import to_uint8
    from tests.emulated.test_conv_pipe_emulated import compile_emu, emu_source

    src = (kernels_dir() / "io.cu").read_text().replace("extern __shared__ __align__(16) float dyn_smem[];", "")
    wrap = ('extern "C" void emu_image_u8(int gx, int nt, const float *x, unsigned char *out, int n) '
            '{ emu_launch([&] { image_u8(x, out, n); }, gx, 1, 1, nt); }')
    lib = compile_emu("\n".join([emu_source([]), src, wrap]) + "\n", tmp_path)
    half = (np.arange(256) + 0.5) / 127.5 - 1.0                     # x whose 255 (x + 1) / 2 ends in .5
    edges = np.concatenate([half, [-1.0, 1.0, 0.0, -1.5, 1.5, -7.0, 7.0]]).astype(np.float32)
    near = np.concatenate([np.nextafter(edges, np.float32(-np.inf)), edges, np.nextafter(edges, np.float32(np.inf))])
    rng = np.random.default_rng(5)
    x = np.concatenate([near, rng.uniform(-1.2, 1.2, 3000).astype(np.float32)])
    n = x.size - x.size % 3                                          # whole (C = 3) pixels, n % 256 != 0
    x = x[:n].reshape(1, 1, -1, 3)                                   # NHWC, one image of one row
    out = np.full(n, 0xA5, dtype=np.uint8)
    lib.emu_image_u8(cdiv(n, 256), 256, ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(out.ctypes.data), n)
    want = to_uint8(x.transpose(0, 3, 1, 2))                         # NCHW in, NHWC out
    assert n % 256 and np.array_equal(out, want.reshape(-1))

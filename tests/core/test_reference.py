"""The NumPy reference executor on small random-weight models.

`spec_forward` below writes the spec's "Network" section out directly (from the primitives that
test_primitives.py checks against loops, NOT from the plan), so the plan's wiring and the
executor's epilogues are compared block by block against the spec text.
"""
from __future__ import annotations

import numpy as np
import pytest

from jetson_unet.model import reference as R
from jetson_unet.model.reference import Reference
from jetson_unet.model.weights import load_weights, save_weights

# float32 vs float64 on the same weights: per-op float32 rounding (~6e-8) accumulated over ~30
# layers with O(1) activations (measured ~5e-7); 1e-5 relative L2 is the bound set for fp32.
MAX_REL_L2_F32 = 1e-5
# The same float64 math in another order (batch size changes the BLAS blocking; the spec
# forward composes the same primitives in other groupings): a few ulp per op.
TOL_F64_REORDER = dict(atol=1e-10, rtol=1e-9)
# Batch independence in float32: only the BLAS blocking differs with the batch size (measured
# 1.4e-6 max abs on O(1) outputs here; another BLAS may sum in another order).
TOL_F32_REORDER = dict(atol=1e-5, rtol=1e-5)


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def inputs(rng, cfg, batch):
    x = rng.standard_normal((batch, cfg.channels, cfg.image_size, cfg.image_size)).astype(np.float32)
    t = rng.integers(0, cfg.timesteps, size=batch)
    return x, t


def spec_forward(p, cfg, x, t):
    """The spec's Network section, line by line, in float64; returns every block's output."""
    p = {k: v.astype(np.float64) for k, v in p.items()}
    out = {}

    def conv(name, h, groups=1):
        return R.conv2d(h, p[name + ".weight"], p[name + ".bias"], groups)

    def lin(name, h):
        return h @ p[name + ".weight"].T + p[name + ".bias"]

    temb = lin("time_mlp.2", R.gelu(lin("time_mlp.0", R.sinusoidal(t, cfg.dim))))

    def block(P, h_in, i, o):
        h = conv(P + ".ds_conv", h_in, groups=i) + lin(P + ".mlp", R.gelu(temb))[:, :, None, None]
        h = R.gelu(conv(P + ".conv1", R.gn1(h, p[P + ".norm1.weight"], p[P + ".norm1.bias"], cfg.norm_eps)))
        h = conv(P + ".conv2", R.gn1(h, p[P + ".norm2.weight"], p[P + ".norm2.bias"], cfg.norm_eps))
        out[P] = h + (conv(P + ".res_conv", h_in) if i != o else h_in)
        return out[P]

    def gate(P, skip, h):
        a = np.maximum(conv(P + ".gate_conv", h) + conv(P + ".residual_conv", skip), 0.0)
        return 1.0 / (1.0 + np.exp(-conv(P + ".psi", a))) * skip

    levels, L = cfg.levels, len(cfg.levels)
    h = conv("init_conv", x.astype(np.float64))
    r, skips = h, []
    for k, (i, o) in enumerate(levels):
        h = block(f"downs.{k}.block1", h, i, i); skips.append(h)
        h = block(f"downs.{k}.block2", h, i, i); skips.append(h)
        h = conv(f"downs.{k}.down.conv", h if k == L - 1 else R.pixel_unshuffle2(h))
    h = block("mid.block1", h, cfg.dims[-1], cfg.dims[-1])
    h = block("mid.block2", h, cfg.dims[-1], cfg.dims[-1])
    for j, (i, o) in enumerate(reversed(levels)):
        h = block(f"ups.{j}.block1", np.concatenate([h, gate(f"ups.{j}.gate", skips.pop(), h)], 1), o + i, o)
        h = block(f"ups.{j}.block2", np.concatenate([h, gate(f"ups.{j}.gate", skips.pop(), h)], 1), o + i, o)
        h = conv(f"ups.{j}.up.conv", h if j == L - 1 else R.up2(h))
    h = block("final_block", np.concatenate([h, r], 1), 2 * cfg.dim, cfg.dim)
    out["eps"] = conv("final_conv", h)
    return out


@pytest.fixture(params=["tiny", "odd"])
def weights(request, tiny_weights, odd_weights):
    return {"tiny": tiny_weights, "odd": odd_weights}[request.param]


def test_matches_spec_forward_per_block(rng, assert_close, weights):
    cfg = weights.config
    x, t = inputs(rng, cfg, 2)
    ref = Reference(weights, np.float64)
    env = ref.time_env(t)
    eps = ref.eps(x, t, env=env)
    want = spec_forward(weights.params, cfg, x, t)
    assert len(want) == 4 * len(cfg.levels) + 4        # every block and eps
    for name, value in want.items():                   # in execution order: the first bad block fails
        assert_close(f"{name}", env[name], value, np.float64, **TOL_F64_REORDER)
    assert eps is env["eps"]


def test_float32_vs_float64(rng, weights):
    cfg = weights.config
    x, t = inputs(rng, cfg, 2)
    e32, e64 = Reference(weights, np.float32).eps(x, t), Reference(weights, np.float64).eps(x, t)
    shape = (2, cfg.channels, cfg.image_size, cfg.image_size)
    assert e32.shape == shape and e64.shape == shape, (e32.shape, e64.shape)
    assert e32.dtype == np.float32 and e64.dtype == np.float64, (e32.dtype, e64.dtype)
    assert np.isfinite(e32).all() and np.abs(e64).max() > 1e-3, "degenerate output"
    assert rel_l2(e32, e64) < MAX_REL_L2_F32, f"relative L2 {rel_l2(e32, e64):.3g}"


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_batch_independence_and_per_sample_t(rng, assert_close, tiny_weights, dtype):
    cfg = tiny_weights.config
    ref = Reference(tiny_weights, dtype)
    x, _ = inputs(rng, cfg, 3)
    t = np.array([3, 61, 99])
    batch = ref.eps(x, t)
    tol = TOL_F32_REORDER if dtype == np.float32 else TOL_F64_REORDER
    for k in range(3):
        alone = ref.eps(x[k:k + 1], t[k:k + 1])
        assert_close(f"sample {k} of 3 vs alone", batch[k:k + 1], alone, dtype, **tol)
    same_t = ref.eps(x, np.full(3, t[0]))
    assert_close("sample 0, same t", same_t[:1], batch[:1], dtype, **tol)
    assert not np.allclose(same_t[1:], batch[1:], atol=1e-3), "the timestep has no effect"


def test_scalar_t_broadcasts(rng, assert_close, tiny_weights):
    ref = Reference(tiny_weights, np.float64)
    x, _ = inputs(rng, tiny_weights.config, 2)
    assert_close("t=7 vs [7, 7]", ref.eps(x, 7), ref.eps(x, np.array([7, 7])), np.float64, atol=0, rtol=0)


def test_deterministic_and_input_untouched(rng, tiny_weights):
    ref = Reference(tiny_weights, np.float32)
    x, t = inputs(rng, tiny_weights.config, 2)
    x_copy = x.copy()
    a, b = ref.eps(x, t), ref.eps(x, t)
    assert np.array_equal(x, x_copy), "eps() modified its input"
    assert np.array_equal(a, b), "two identical calls differ"
    assert np.array_equal(Reference(tiny_weights, np.float32).eps(x, t), a), "a second instance differs"


@pytest.mark.parametrize("shape", [(2, 2, 16, 16), (2, 3, 16, 15), (2, 3, 8, 8), (3, 16, 16), (1, 1, 3, 16, 16)])
def test_input_shape_errors(tiny_weights, shape):
    ref = Reference(tiny_weights, np.float32)
    with pytest.raises(ValueError):
        ref.eps(np.ones(shape, np.float32) * 0.5, 10)


def test_t_length_mismatch(rng, tiny_weights):
    x, _ = inputs(rng, tiny_weights.config, 3)
    with pytest.raises(ValueError):
        Reference(tiny_weights, np.float32).eps(x, np.array([1, 2]))


@pytest.mark.parametrize("dtype", [np.float16, np.int32])
def test_unsupported_dtype(tiny_weights, dtype):
    with pytest.raises(ValueError):
        Reference(tiny_weights, dtype)


def test_fp16_weights_run_in_float32(tmp_path, rng, tiny_weights):
    path = tmp_path / "w16.npz"
    save_weights(path, tiny_weights.config, tiny_weights.params, dtype="float16")
    w16 = load_weights(path)
    x, t = inputs(rng, w16.config, 1)
    e16, e32 = Reference(w16, np.float32).eps(x, t), Reference(tiny_weights, np.float32).eps(x, t)
    assert e16.dtype == np.float32
    # float16 weights carry ~5e-4 relative rounding each; the output moves by about that much
    assert 1e-6 < rel_l2(e16, e32) < 2e-2, rel_l2(e16, e32)

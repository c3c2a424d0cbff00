"""NumPy executor of the plan: the oracle for every GPU kernel, and the CPU backend.

float32 or float64 throughout. Convolutions go through im2col + matmul (BLAS); the depthwise 7x7
through 49 shifted multiply-adds over the whole batch (vectorized over channels and pixels).
"""
from __future__ import annotations

import math
from typing import Callable, Dict, Iterator, Mapping, Optional

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from jetson_unet.model import plan as P
from jetson_unet.model.plan import Op, Plan, build_plan


# ---- primitives (NCHW) ---------------------------------------------------------------------

def erf_scipy(x: np.ndarray) -> np.ndarray:
    """SciPy's erf ufunc (vectorized C), imported at the first call: a GPU process never makes one
    (its only host GELUs are the time MLP's, erf_libm), and SciPy's import is 0.2-0.25 s of a cold
    start on the 2-core host."""
    from scipy.special import erf
    return erf(x)


def erf_libm(x: np.ndarray) -> np.ndarray:
    """The C library's erf (math.erf), element by element in float64: ~90 ns per element where
    SciPy's takes ~20, for the time MLP (T x 512 and T x 128 values: ~6 ms for the GPU path's
    100-step tables); within 3.4e-16 of SciPy's."""
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def gelu(x: np.ndarray, erf: Callable[[np.ndarray], np.ndarray] = erf_scipy) -> np.ndarray:
    """Exact erf form: 0.5 x (1 + erf(x / sqrt 2))."""
    return (0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))).astype(x.dtype, copy=False)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) without overflow and within a few ulps everywhere: with e = exp(-|x|) in
    (0, 1], 1 / (1 + e) for x >= 0 and e / (1 + e) below."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype, copy=False)


def gn1(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """GroupNorm(1, C): per-sample mean and biased variance over C, H, W."""
    axes = tuple(range(1, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return (x - mean) / np.sqrt(var + eps) * w.reshape(shape) + b.reshape(shape)


def pixel_unshuffle2(x: np.ndarray) -> np.ndarray:
    """(B, C, H, W) -> (B, 4C, H/2, W/2); out channel c*4 + dy*2 + dx = x[c, 2i+dy, 2j+dx]."""
    B, C, H, W = x.shape
    return x.reshape(B, C, H // 2, 2, W // 2, 2).transpose(0, 1, 3, 5, 2, 4).reshape(B, 4 * C, H // 2, W // 2)


def up2(x: np.ndarray) -> np.ndarray:
    return x.repeat(2, axis=2).repeat(2, axis=3)


def conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray, groups: int = 1) -> np.ndarray:
    """Cross-correlation with pad = k // 2, stride 1 (torch.nn.Conv2d), w is (O, C/groups, k, k)."""
    B, C, H, W = x.shape
    O, _, k, _ = w.shape
    pad = k // 2
    if groups == C and groups == O:   # depthwise: k*k shifted multiply-adds
        xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        out = np.zeros_like(x)
        for dy in range(k):
            for dx in range(k):
                out += xp[:, :, dy:dy + H, dx:dx + W] * w[None, :, 0, dy, dx, None, None]
        return out + b[None, :, None, None]
    if groups != 1:
        raise NotImplementedError("only groups == 1 or depthwise convolutions occur in seed-unet")
    if k == 1:
        cols = x.transpose(0, 2, 3, 1).reshape(B * H * W, C)
    else:
        xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        win = sliding_window_view(xp, (k, k), axis=(2, 3))          # (B, C, H, W, k, k), no copy
        cols = win.transpose(0, 2, 3, 1, 4, 5).reshape(B * H * W, C * k * k)  # the im2col copy
    out = cols @ w.reshape(O, -1).T + b
    return np.ascontiguousarray(out.reshape(B, H, W, O).transpose(0, 3, 1, 2))


def sinusoidal(t: np.ndarray, dim: int) -> np.ndarray:
    """e(t) = [sin(t f), cos(t f)], f_i = exp(-ln(10000) i / (half - 1)), in float64."""
    half = dim // 2
    f = np.exp(-math.log(10000.0) * np.arange(half, dtype=np.float64) / (half - 1))
    arg = np.asarray(t, dtype=np.float64)[:, None] * f[None, :]
    return np.concatenate([np.sin(arg), np.cos(arg)], axis=1)


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    return x @ w.T + b


# ---- ops of the plan -----------------------------------------------------------------------

Env = Dict[str, np.ndarray]


def run_conv(op: Op, env: Env, p: Mapping[str, np.ndarray], eps: float) -> np.ndarray:
    x = env[op.x]
    if op.in_map == "unshuffle2":
        x = pixel_unshuffle2(x)
    elif op.in_map == "up2":
        x = up2(x)
    if op.norm:
        x = gn1(x, p[op.norm + ".weight"], p[op.norm + ".bias"], eps)
    y = conv2d(x, p[op.prefix + ".weight"], p[op.prefix + ".bias"], op.groups)
    if op.tbias:
        y = y + env[op.tbias][:, :, None, None]
    if op.act == "gelu":
        y = gelu(y)
    if op.residual:
        r = env[op.residual]
        if op.residual_conv:
            r = conv2d(r, p[op.residual_conv + ".weight"], p[op.residual_conv + ".bias"])
        y = y + r
    return y


def run_gate(op: Op, env: Env, p: Mapping[str, np.ndarray]) -> np.ndarray:
    x, skip = env[op.inputs[0]], env[op.inputs[1]]
    a = conv2d(x, p[op.prefix + ".gate_conv.weight"], p[op.prefix + ".gate_conv.bias"])
    a = a + conv2d(skip, p[op.prefix + ".residual_conv.weight"], p[op.prefix + ".residual_conv.bias"])
    psi = conv2d(np.maximum(a, 0), p[op.prefix + ".psi.weight"], p[op.prefix + ".psi.bias"])
    return skip * sigmoid(psi)                  # psi broadcast over channels


def run_time_op(op: Op, env: Env, p: Mapping[str, np.ndarray], dim: int) -> np.ndarray:
    """The time MLP and the blocks' time projections, their GELUs through erf_libm (no SciPy import
    for the GPU path, which computes these tables once per run). Every block's projection starts
    from gelu(temb): computed once per env, kept under "<x>:gelu"."""
    if op.kind == P.TIME_EMBED:
        e = sinusoidal(env["t"], dim).astype(p["time_mlp.0.weight"].dtype)
        h = gelu(linear(e, p["time_mlp.0.weight"], p["time_mlp.0.bias"]), erf_libm)
        return linear(h, p["time_mlp.2.weight"], p["time_mlp.2.bias"])
    key = op.x + ":gelu"
    if key not in env:
        env[key] = gelu(env[op.x], erf_libm)
    return linear(env[key], p[op.prefix + ".weight"], p[op.prefix + ".bias"])


def run_op(op: Op, env: Env, p: Mapping[str, np.ndarray], plan: Plan) -> np.ndarray:
    """Execute one op of the plan on `env` (tensor name -> array) and return its output."""
    if op.kind == P.CONV:
        return run_conv(op, env, p, plan.config.norm_eps)
    if op.kind == P.GATE:
        return run_gate(op, env, p)
    if op.kind == P.CAT:
        return np.concatenate([env[op.inputs[0]], env[op.inputs[1]]], axis=1)
    if op.kind in P.TIME_KINDS:
        return run_time_op(op, env, p, plan.config.dim)
    raise ValueError(f"unknown op kind {op.kind!r}")


class CastParams(Mapping):
    """The weights' parameters in the reference's dtype, each converted at its first use and kept:
    the GPU path's time tables use only the time MLP's and the projections', so it no longer makes a
    float64 copy of every parameter (127 MB for the shipped model: host memory that a Jetson
    shares with its GPU)."""

    def __init__(self, params: Mapping[str, np.ndarray], dtype: np.dtype) -> None:
        self._src, self._dtype = params, dtype
        self._cast: Dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        v = self._cast.get(name)
        if v is None:
            v = self._cast[name] = np.asarray(self._src[name], dtype=self._dtype)
        return v

    def __iter__(self) -> Iterator[str]:
        return iter(self._src)

    def __len__(self) -> int:
        return len(self._src)


class Reference:
    """`Reference(weights, dtype).eps(x, t)`: one U-Net call on the CPU."""

    def __init__(self, weights, dtype=np.float32) -> None:  # weights: jetson_unet.model.weights.Weights
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise ValueError(f"the reference runs float32 or float64, not {self.dtype}")
        self.config = weights.config
        self.plan = build_plan(self.config)
        self.params = CastParams(weights.params, self.dtype)

    def time_env(self, t: np.ndarray) -> Env:
        """The plan's time ops for timesteps t (B,): temb and every block's time bias."""
        env: Env = {"t": np.asarray(t)}
        for op in self.plan.time_ops:
            env[op.out] = run_op(op, env, self.params, self.plan).astype(self.dtype, copy=False)
        return env

    def eps(self, x: np.ndarray, t: np.ndarray, env: Optional[Env] = None) -> np.ndarray:
        c = self.config
        x = np.asarray(x, dtype=self.dtype)
        if x.ndim != 4 or x.shape[1:] != (c.channels, c.image_size, c.image_size):
            raise ValueError(f"x must be (B, {c.channels}, {c.image_size}, {c.image_size}), got {x.shape}")
        t = np.broadcast_to(np.asarray(t, dtype=np.int64), (x.shape[0],))
        if env is None and x.shape[0] > 1:
            # image by image: an image's eps is then the same bits whatever batch it is in (a matrix
            # product of another height may sum in another order), as the spec's per-image seeds promise
            return np.concatenate([self.eps(x[i:i + 1], t[i:i + 1]) for i in range(x.shape[0])])
        env = self.time_env(t) if env is None else env
        env[self.plan.input] = x
        for op in self.plan.ops:
            env[op.out] = run_op(op, env, self.params, self.plan).astype(self.dtype, copy=False)
        return env[self.plan.output]

"""Every kernel against the NumPy reference, op by op, on the plan's own shapes.

Teacher forcing: the reference runs the whole U-Net in float64 on fresh random inputs; each GPU op
then gets the reference's values of its inputs (rounded to the device dtype), its output is
poisoned with NaN, it runs alone, and is compared with `run_op` on the same rounded inputs. A
normalized conv first re-runs its producer, whose kernel writes the GroupNorm partials it reads. A
tensor whose producer has an output scale (blob oscale: the reader folds its GroupNorm) is held
times that scale, as the kernels hold it.
With $JETSON_UNET_CONV_STAGES set, every case also runs with the cp.async conv (conftest.py).
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.gpu import pipelined_symbols, report
from jetson_unet.model.config import UNetConfig
from jetson_unet.executor.executor import GpuExecutor
from jetson_unet.ops.common import from_device, to_device
from jetson_unet.model.plan import CAT
from jetson_unet.model.reference import Reference, run_op
from jetson_unet.model.weights import random_params

# Relative L2 error of one op vs float64 on the same rounded inputs, and the largest element error
# relative to max|ref| (catches a few wrong pixels that L2 would dilute):
#   fp32: fp32 accumulation over K <= 4608 terms gives ~1e-6.
#   fp16: operands (after the fused norm) and weights rounded to 11 significant bits (u = 4.9e-4)
#         and the output rounded once more: ~1e-3.
#   bf16: the same with 8 bits (u = 3.9e-3): ~8e-3.
OP_TOL = {"fp32": (1e-5, 1e-4), "fp16": (4e-3, 2e-2), "bf16": (3e-2, 1.2e-1)}

ODD = UNetConfig(dim=12, image_size=24, dim_mults=(1, 2, 3), time_dim=48)   # channels % 8 != 0
CASES = [("odd", ODD, 1), ("odd", ODD, 3), ("default", UNetConfig(), 3)]


class W:
    def __init__(self, cfg: UNetConfig, seed: int) -> None:
        self.config, self.params = cfg, random_params(cfg, seed)


def rounded(v: np.ndarray, precision: str, fp32: bool) -> np.ndarray:
    return v if fp32 else from_device(to_device(v, precision), precision).astype(np.float64)


def check_all_ops(ex: GpuExecutor, weights: W, seed: int) -> list:
    plan, cfg, b = ex.plan, ex.config, ex.batch
    rng = np.random.default_rng(seed)
    ref = Reference(weights, np.float64)
    t = rng.integers(0, cfg.timesteps, size=b)
    env = ref.time_env(t)
    ref.eps(rng.standard_normal((b, cfg.channels, cfg.image_size, cfg.image_size)), t, env)
    ex.set_timesteps(t)
    io = {plan.input, plan.output}
    writer = {op.out: op for op in plan.ops}
    scale = {s.op.out: s.blobs["oscale"] for s in ex.specs if "oscale" in s.blobs}

    def factor(n, v):   # tensor n's output scale as an NCHW factor, or 1
        s = scale.get(n)
        return 1.0 if s is None else s[:v.shape[1]].astype(np.float64).reshape(1, -1, 1, 1)

    def held(n, v):   # tensor n as the kernels hold it
        return v * factor(n, v)

    def seen(n, v):   # the input values a reader of the held, rounded tensor n works with
        f = np.broadcast_to(factor(n, v), v.shape)
        return np.divide(rounded(held(n, v), ex.precision, n in io), f, out=v.copy(), where=f != 0)

    def upload_reads(op):
        for n in op.reads():
            if plan.tensors[n].size:
                ex.upload_tensor(n, held(n, env[n]))

    errors = []
    for op in plan.ops:
        if op.kind == CAT:
            continue
        if op.norm:
            upload_reads(writer[op.x])
            ex.launch_op(op.x)
        upload_reads(op)
        ex.upload_tensor(op.out, np.full(env[op.out].shape, np.nan))
        ex.launch_op(op.out)
        got = ex.download_tensor(op.out).astype(np.float64)
        local = dict(env)
        for n in op.reads():
            if plan.tensors[n].size:
                local[n] = seen(n, env[n])
        want = held(op.out, run_op(op, local, ref.params, plan))
        finite = bool(np.isfinite(got).all())
        l2 = float(np.linalg.norm(got - want) / np.linalg.norm(want)) if finite else float("inf")
        mx = float(np.abs(got - want).max() / np.abs(want).max()) if finite else float("inf")
        errors.append((op.out, ex.launches[[L.name for L in ex.launches].index(op.out)].fn.symbol, l2, mx))
    return errors


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=[f"{n}-b{b}" for n, _, b in CASES])
def test_every_op_matches_reference(backend, precision, case):
    name, cfg, batch = case
    weights = W(cfg, seed=batch)
    with GpuExecutor(weights, precision, batch=batch, backend=backend) as ex:
        piped = pipelined_symbols(ex)
        errors = check_all_ops(ex, weights, seed=10 + batch)
    assert bool(piped) == (precision != "fp32") or name == "odd", piped   # default config: every conv is 16-byte
    l2_tol, max_tol = OP_TOL[precision]
    bad = [e for e in errors if not (e[2] < l2_tol and e[3] < max_tol)]
    worst = max(errors, key=lambda e: e[2])
    report(f"ops {name} b{batch} {precision} ({len(piped)} cp.async launches): "
           f"worst l2 {worst[2]:.2e} at {worst[0]} ({worst[1]}); "
           f"{len(bad)} bad: " + "; ".join(f"{o} [{s}] l2={l:.1e} max={m:.1e}" for o, s, l, m in bad[:12]))
    assert not bad, f"{len(bad)} ops off (first: {bad[:5]})"


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_depthwise_channel_pairs_match_reference(backend, precision, monkeypatch):
    """The two-channel depthwise conv (dwconv_cp; picked by grid depth, so batch 16 on the H100)
    forced onto every depthwise op of a batch-3 call (the tensor-core kernel off), op by op as above."""
    from jetson_unet.ops import dwconv
    monkeypatch.setattr(dwconv, "dwconv_tc", lambda *a, **k: False)
    monkeypatch.setattr(dwconv, "dwconv_cp", lambda size, channels, batch, sms, vec: 2 if vec > 1 else 1)
    check_depthwise(backend, precision, "pairs", lambda L: "_p2" in L.fn.symbol, lambda size: True)


def check_depthwise(backend, precision: str, label: str, is_variant, applies) -> None:
    """Every depthwise op of a batch-3 call whose input size `applies` must launch the variant
    (`is_variant(launch)`) and match the reference op by op (check_all_ops)."""
    weights = W(UNetConfig(), seed=5)
    with GpuExecutor(weights, precision, batch=3, backend=backend) as ex:
        n_dw = sum(op.out.endswith(".ds_conv") and applies(ex.plan.tensors[op.x].size) for op in ex.plan.ops)
        names = {L.name for L in ex.launches if L.name.endswith(".ds_conv") and is_variant(L)}
        errors = [e for e in check_all_ops(ex, weights, seed=17) if e[0] in names]
    l2_tol, max_tol = OP_TOL[precision]
    bad = [e for e in errors if not (e[2] < l2_tol and e[3] < max_tol)]
    worst = max(errors, key=lambda e: e[2])
    report(f"depthwise {label} b3 {precision}: {len(errors)} ops, worst l2 {worst[2]:.2e} at {worst[0]}; "
           f"{len(bad)} bad: " + "; ".join(f"{o} l2={l:.1e} max={m:.1e}" for o, _, l, m in bad[:8]))
    assert n_dw and len(names) == n_dw and not bad, (len(names), n_dw, bad[:5])


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_depthwise_on_tensor_cores_matches_reference(backend, precision, monkeypatch):
    """The tensor-core depthwise conv (the default; kernels/dwconv.cu dwconv_tc) on every
    depthwise op of images >= 16 rows in a batch-3 call, op by op as above (its weights are rounded
    to the activation dtype: within the same tolerance)."""
    from jetson_unet.ops.dwconv import DW_TC_TILE
    check_depthwise(backend, precision, "tensor cores", lambda L: "_tc" in L.fn.symbol,
                    lambda size: size >= DW_TC_TILE)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("case", [("odd", ODD), ("default", UNetConfig())], ids=["odd", "default"])
def test_gates_with_split_n_match_reference(backend, precision, case, monkeypatch):
    """Every gate of 64+ channels with its N split over CTAs, twice as many as the built-in tile's
    (a measured tile may pick that; psi's row partials meet through a ticket, kernels/conv.cu
    conv_finish), at batch 3, op by op as above: the GEMM gate forced where gate.cu would run."""
    from jetson_unet.ops import conv, gate
    plain = conv.choose_tile
    monkeypatch.setattr(gate, "rows_gate", lambda op, ctx: False)

    def halved(precision, m, n, batch, sms, gate, **kw):
        bm, bn, wm, wn = plain(precision, m, n, batch, sms, gate, **kw)
        return (bm, bn // 2, 2, 2) if gate and bn >= 64 else (bm, bn, wm, wn)

    monkeypatch.setattr(conv, "choose_tile", halved)
    name, cfg = case
    weights = W(cfg, seed=8)
    with GpuExecutor(weights, precision, batch=3, backend=backend) as ex:
        split = {L.name for L in ex.launches if ".gate" in L.name and L.grid[1] > 1}
        errors = [e for e in check_all_ops(ex, weights, seed=23) if e[0] in split]
    l2_tol, max_tol = OP_TOL[precision]
    bad = [e for e in errors if not (e[2] < l2_tol and e[3] < max_tol)]
    report(f"split-N gates {name} b3 {precision}: {len(errors)} ops, worst l2 {max(e[2] for e in errors):.2e}; "
           f"{len(bad)} bad: " + "; ".join(f"{o} l2={l:.1e} max={m:.1e}" for o, _, l, m in bad[:8]))
    # default: the 128- and 256-wide gates (the narrower ones' tiles hold all 32-64 columns)
    assert len(split) >= (4 if name == "default" else 2) and not bad, (sorted(split), bad[:5])

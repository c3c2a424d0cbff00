"""tools.lab.gemm_ceiling without a GPU: the GEMM shapes it times and the bounds its report draws."""
from __future__ import annotations

import pytest

import tools.lab.gemm_ceiling as G
from jetson_unet.model import cost
from jetson_unet.model import plan as P
from jetson_unet.model.config import UNetConfig


def test_shapes_are_every_gemm_op_of_the_call_with_its_flops():
    cfg = UNetConfig()
    rows = G.gemm_shapes(cfg, 16)
    plan = P.build_plan(cfg)
    kept = [c for c in cost.plan_costs(plan) if c.op_class in ("conv3x3", "conv1x1", "gate")]
    assert len(rows) == len(kept) - 1 == 54            # the 3-channel final_conv (eps) left out
    assert {r["op"] for r in rows} == {c.name for c in kept} - {"eps"}   # final_conv writes eps
    for r in rows:
        size = plan.tensors[r["op"]].size
        assert r["M"] == 16 * size * size and r["K"] % G.KPAD == 0
        if r["cls"] != "gate":   # a gate's psi and multiply come on top of its GEMM
            assert 2 * r["M"] * r["N"] * r["K"] >= r["flops"] > 2 * r["M"] * r["N"] * (r["K"] - G.KPAD)
        assert (r["cin"] > 0) == (r["cls"] == "conv3x3")
    gate = next(r for r in rows if r["op"] == "ups.3.gate@1")
    assert (gate["N"], gate["K"]) == (32, 64)          # g = 32 gating channels, g + r = 64 inputs


def _res(ours, v2, v3, cublas, cudnn, kernels, call_ms=1.0):
    tri = lambda d: {"ops": {k: {"us": v, "cfg": []} for k, v in d.items()}, "isa": {}}  # noqa: E731
    return {"ours": {"ops": ours, "call_ms": call_ms}, "triton-v2": tri(v2), "triton-v3": tri(v3),
            "torch": {"cublas": cublas, "cudnn": cudnn, "cudnn_kernels": kernels}}


def test_bounds_take_each_ops_fastest_and_keep_hopper_kernels_for_the_last_row():
    rows = [{"op": "a", "M": 64, "N": 32, "K": 64, "flops": 1e6},
            {"op": "b", "M": 64, "N": 32, "K": 64, "flops": 1e6}]
    res = _res({"a": 10.0, "b": 10.0}, {"a": 8.0, "b": 12.0}, {"a": 7.0, "b": 9.0}, {"a": 9.0, "b": 11.0},
               {"a": 5.0, "b": 6.0}, {"a": ["sm90_xmma_fprop_implicit_gemm"], "b": ["cutlass_tensorop_s16816fprop"]})
    got = dict(G.bounds(rows, res))
    assert got["ours"] == 20.0
    assert got["ours, triton-v2 (mma.sync)"] == 8.0 + 10.0
    assert got["ours, triton-v2, cudnn's sm80-class kernels"] == 8.0 + 6.0   # a's cuDNN kernel is sm90: not counted
    assert got["all, wgmma included (cudnn, cublas, triton-v3)"] == 5.0 + 6.0
    text = G.report(rows, res)
    assert "| all, wgmma included (cudnn, cublas, triton-v3) | 11 | 0.991 |" in text


@pytest.mark.parametrize("name, kind", [
    ("sm90_xmma_fprop_implicit_gemm_f16f16", "cuDNN convolutions"),
    ("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_f16_s16816fprop>", "cuDNN convolutions"),
    ("conv2d_c1_k1_nhwc_specialized", "cuDNN convolutions"),
    ("triton_per_fused_add_convolution_gelu_native_group_norm", "triton (fused elementwise, norms)"),
    ("nvjet_sm90_hsh_64x8_64x16_1x2_h_bz_bias_TNT", "GEMMs"),
    ("Memset (Device)", "other")])
def test_peer_kernels_are_grouped_by_kind(name, kind):
    assert G._kind(name) == kind


def test_each_shape_is_timed_once_and_its_figures_shared():
    rows = G.gemm_shapes(UNetConfig(), 16)
    shapes = G.distinct(rows)
    assert len(shapes) == len({G.shape_key(r) for r in rows}) < len(rows)
    first = shapes[0]
    twin = next(r for r in rows if G.shape_key(r) == G.shape_key(first) and r is not first)
    result = {"ops": {first["op"]: {"us": 3.0}}, "isa": {"(64, 64)": {"wgmma": 0}}}
    G.share_by_shape(result, rows)
    assert result["ops"][twin["op"]] == {"us": 3.0} and set(result["ops"]) == {
        r["op"] for r in rows if G.shape_key(r) == G.shape_key(first)}
    assert result["isa"] == {"(64, 64)": {"wgmma": 0}}

"""CPU-only checks of the GPU executor's host side: instantiation list, launch arguments against the
kernels' parameter lists, weight packing (a NumPy emulation of conv.cu's implicit-GEMM indexing
against the reference), memory refusal, arena invariants. No GPU or CuPy needed."""
from __future__ import annotations

import re

import numpy as np
import pytest

from tests.helpers.fakes import FakeBackend

from jetson_unet.paths import kernels_dir
from jetson_unet.model.config import UNetConfig
from jetson_unet.errors import ArenaError
from jetson_unet.ops import dwconv as dwconv_module
from jetson_unet.ops.common import SMEM_LIMIT, cdiv, from_device, k_residual, to_device
from jetson_unet.ops.conv import fold_weights, pack_gemm
from jetson_unet.ops.conv_halo import HALO_SMEM_LIMIT
from jetson_unet.ops.dwconv import DW_TC_TILE, dwconv_cp, dwconv_rows, dwconv_tc_cpw, pack_dw_tc
from jetson_unet.ops.specs import kernel_kind
from jetson_unet.executor.executor import GpuExecutor
from jetson_unet.model.plan import CAT, CONV, Op
from jetson_unet.model.reference import Reference, gn1, run_op
from jetson_unet.model.weights import random_params

ODD = UNetConfig(dim=12, image_size=24, dim_mults=(1, 2, 3), time_dim=48)


class W:
    def __init__(self, cfg: UNetConfig, seed: int = 0) -> None:
        self.config, self.params = cfg, random_params(cfg, seed)


def kernel_params(macro: str) -> list:
    """Parameter kinds of a kernel from its *_PARAMS macro: 'p' pointer, 'i' int, 'f' float."""
    text = "\n".join((kernels_dir() / f).read_text() for f in ("conv.cu", "gate.cu", "dwconv.cu", "io.cu"))
    body = re.search(r"#define %s\s*\\?\n?(.*?)\n#define" % macro, text, re.S).group(1)
    params = [p.strip() for p in body.replace("\\", " ").split(",")]
    return ["p" if "*" in p else ("f" if p.startswith("float") else "i") for p in params]


MACRO = {"gemm": "CONV_PARAMS", "gate": "CONV_PARAMS", "gate_rows": "GATE_ROWS_PARAMS", "dwconv": "DW_PARAMS",
         "init": "INIT_PARAMS", "final": "FINAL_PARAMS"}
KIND = {np.uint64: "p", np.int32: "i", np.float32: "f"}


def ffma_depthwise(monkeypatch) -> None:
    """Every depthwise conv on the FFMA kernel (by default dwconv_tc takes the 16-bit maps of 16+ rows)."""
    monkeypatch.setattr(dwconv_module, "dwconv_tc", lambda *a, **k: False)


@pytest.mark.parametrize("dw_tc", ["0", "1"], ids=["dw-ffma", "dw-tc"])
@pytest.mark.parametrize("cfg", [UNetConfig(), ODD], ids=["default", "odd"])
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_launch_arguments_match_kernel_parameters(cfg, precision, dw_tc, monkeypatch):
    if precision == "fp32" and dw_tc == "1":
        pytest.skip("fp32 has no tensor-core depthwise conv: the same module as dw-ffma")
    if dw_tc == "0":
        ffma_depthwise(monkeypatch)
    fb = FakeBackend(sms=8)
    ex = GpuExecutor(W(cfg), precision, batch=3, backend=fb)
    assert ex.launches_per_call == sum(op.kind != CAT for op in ex.plan.ops) < 80
    for spec, launch in zip(ex.specs, ex.launches):
        kind = "gate_rows" if getattr(spec.key, "kind", "") == "gate_rows" else kernel_kind(spec.op, ex.plan)
        kinds = kernel_params(MACRO[kind])
        got = [KIND[type(a)] for a in launch.args]
        assert got == kinds, (spec.op.out, got, kinds)
        # dynamic smem past 48 KB only for the halo conv, by its opt-in (the built-in tiles of 8 SMs
        # take it where the grid is deep)
        limit = HALO_SMEM_LIMIT if getattr(spec.key, "halo", False) else SMEM_LIMIT
        assert launch.smem <= min(limit, launch.fn.max_dynamic_shared) and all(g >= 1 for g in launch.grid)
        assert launch.grid[2] in (1, 3)
    src, options, symbols = fb.compiled[0]
    assert set(s.symbol for s in ex.specs) <= set(symbols)
    for sym in symbols:
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", sym) and f"({sym}," in src
    assert "-std=c++17" in options and any(o.startswith("-I") for o in options)


def test_one_module_serves_every_batch():
    w = W(UNetConfig())
    syms = [GpuExecutor(w, "fp16", batch=b, backend=FakeBackend(sms=132)).kernels.symbols for b in (1, 3, 16)]
    assert syms[0] == syms[1] == syms[2]


def test_depthwise_channel_pairs_only_where_the_grid_is_deep(monkeypatch):
    """dwconv_cp (the FFMA kernel): two channels per thread where the one-channel grid has more CTAs
    than SMs, never with scalar loads; 16-row tiles of 256 threads, or 8-row ones of 128 on maps of
    fewer than 16 rows (dwconv_rows)."""
    ffma_depthwise(monkeypatch)

    def pairs(cfg, batch, sms):
        ex = GpuExecutor(W(cfg), "fp16", batch=batch, backend=FakeBackend(sms=sms))
        return {L.name: (L.fn.symbol.endswith("_h8"), L.block[0]) for L in ex.launches
                if L.name.endswith(".ds_conv") and "_p2" in L.fn.symbol}

    assert pairs(UNetConfig(), 1, 132) == {}
    b16 = pairs(UNetConfig(), 16, 132)
    for name in ("downs.0.block1.ds_conv", "ups.3.block2.ds_conv", "final_block.ds_conv"):
        assert b16[name] == (False, 256)
    assert b16["ups.0.block1.ds_conv"] == (True, 128)                              # 8x8: 12 x 16 CTAs > 132
    assert "mid.block1.ds_conv" not in b16                                         # 8 x 16 = 128 CTAs
    assert "ups.3.block1.ds_conv" in pairs(UNetConfig(), 1, 8)                     # the Orin Nano's 8 SMs
    assert {"ups.0.block1.ds_conv", "mid.block1.ds_conv"} <= set(pairs(UNetConfig(), 4, 8))
    assert pairs(ODD, 16, 8)                                                       # 12-36 channels: 8-byte vectors
    assert dwconv_cp(64, 64, 16, 8, vec=1) == 1                                # scalar loads: one channel
    assert dwconv_rows(8, 2) == 8 and dwconv_rows(16, 2) == 16 and dwconv_rows(8, 1) == 8


def test_wide_gates_on_gate_cu_where_the_grid_is_shallow():
    """ops.gate.wide_gate: the 16x16 and 8x8 levels' gates (128 + 64, 256 + 128) run gate.cu's
    gate_wide where its grid (a CTA per 16 rows) has at most 4 CTAs per SM, else the GEMM gate; the
    narrow ones run gate_rows everywhere."""
    def kernels(batch, sms):
        ex = GpuExecutor(W(UNetConfig()), "fp16", batch=batch, backend=FakeBackend(sms=sms))
        return {L.name.split("@")[0]: (L.fn.symbol, L.block[0]) for L in ex.launches if ".gate@" in L.name}

    b1 = kernels(1, 8)
    assert b1["ups.0.gate"] == ("gate_rows_f16_g256_r128", 256) and b1["ups.1.gate"] == ("gate_rows_f16_g128_r64", 128)
    assert b1["ups.3.gate"] == ("gate_rows_f16_g32_r32", 128)
    b4 = kernels(4, 8)                                   # 16x16: 64 CTAs on 8 SMs
    assert b4["ups.0.gate"][0].startswith("gate_rows_") and not b4["ups.1.gate"][0].startswith("gate_rows_")
    b64 = kernels(64, 132)                               # 16x16: 1024 CTAs on 132 SMs
    assert b64["ups.0.gate"][0].startswith("gate_rows_") and not b64["ups.1.gate"][0].startswith("gate_rows_")
    fp32 = GpuExecutor(W(UNetConfig()), "fp32", batch=1, backend=FakeBackend(sms=8))
    assert not any(L.fn.symbol.startswith("gate_rows_") for L in fp32.launches)


def test_depthwise_on_tensor_cores_by_default_and_where_it_applies(monkeypatch):
    """dwconv_tc puts the 16-bit depthwise convs of images of >= 16 rows on kernels/dwconv.cu dwconv_tc
    (16 x 16 x 8 CPW tiles, B fragments packed by the host); 8x8 maps and fp32 keep the FFMA kernel."""
    def dw(precision):
        ex = GpuExecutor(W(UNetConfig()), precision, batch=16, backend=FakeBackend(sms=132))
        writer = {op.out: op for op in ex.plan.ops}
        return ex, {s.op.out: (s, L) for s, L in zip(ex.specs, ex.launches) if s.op.out.endswith(".ds_conv")}, writer

    ex, got, writer = dw("fp16")
    for name, (spec, L) in got.items():
        xt = ex.plan.tensors[writer[name].x]
        if xt.size >= DW_TC_TILE:
            cpw = dwconv_tc_cpw(xt.size, xt.channels, 16, 132)
            assert L.fn.symbol == f"dwconv7_f16_tc{cpw}", name
            assert L.grid == (cdiv(xt.size, 16) ** 2, cdiv(xt.channels, 8 * cpw), 16) and L.block == (256, 1, 1)
            assert spec.blobs["w"].shape == (xt.channels, 7, 32, 2, 2) and spec.blobs["w"].dtype == np.float16
        else:
            assert "_tc" not in L.fn.symbol, name
    assert {L.fn.symbol for _, L in got.values() if "_tc" in L.fn.symbol} == {"dwconv7_f16_tc4", "dwconv7_f16_tc2", "dwconv7_f16_tc1"}
    assert any("_tc" in L.fn.symbol for _, L in dw("bf16")[1].values())
    assert not any("_tc" in L.fn.symbol for _, L in dw("fp32")[1].values())
    # channels per warp: 4 where that grid has a CTA per SM, else 2, else 1
    assert dwconv_tc_cpw(64, 32, 16, 132) == 4 and dwconv_tc_cpw(32, 64, 16, 132) == 2
    assert dwconv_tc_cpw(16, 128, 16, 132) == 1 and dwconv_tc_cpw(64, 32, 1, 132) == 1
    assert dwconv_tc_cpw(64, 32, 1, 8) == 4   # the Orin Nano's 8 SMs


def test_packed_depthwise_fragments_are_the_toeplitz_rows():
    """pack_dw_tc: lane l's registers hold B[k][n] = w[c, ky, k - n] (0 <= k - n < 7, else 0) at
    k = 2 (l % 4) + 8 r + e, n = l // 4: the band of each kernel row, as the mma reads it."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((5, 1, 7, 7)).astype(np.float32)
    frag = pack_dw_tc(w, 7, "fp32")
    for c, ky in ((0, 0), (4, 6), (2, 3)):
        b = np.zeros((16, 8), dtype=np.float32)
        for lane in range(32):
            for r in range(2):
                for e in range(2):
                    b[2 * (lane % 4) + 8 * r + e, lane // 4] = frag[c, ky, lane, r, e]
        want = np.zeros((16, 8), dtype=np.float32)
        for n in range(8):
            want[n:n + 7, n] = w[c, 0, ky]
        assert np.array_equal(b, want)


def test_init_conv_on_tensor_cores_for_16_bit_and_small_images():
    """init_tc: the image-input conv runs init_conv_tc for fp16 / bf16 and images of <= 4
    channels at every batch; fp32 and wider images keep the FFMA kernel. Rows per warp
    (init_tc_rows): 4 where the one-row grid has >= 16 CTAs per SM (batch 64 on 132 SMs, batch 4
    on 8), the CTA's tile and the grid's tiles with them."""
    def init_launch(cfg, precision, batch, sms=132):
        ex = GpuExecutor(W(cfg), precision, batch=batch, backend=FakeBackend(sms=sms))
        return [L for L in ex.launches if L.name == "init_conv"][0]

    def init_symbol(cfg, precision, batch, sms=132):
        return init_launch(cfg, precision, batch, sms).fn.symbol

    assert init_symbol(UNetConfig(), "fp16", 1) == init_symbol(UNetConfig(), "fp16", 16) == "init_conv7_c3_f16_tc"
    assert init_symbol(UNetConfig(), "fp16", 64) == init_symbol(UNetConfig(), "fp16", 4, sms=8) == "init_conv7_c3_f16_tc_r4"
    assert init_symbol(UNetConfig(), "fp16", 1, sms=8) == "init_conv7_c3_f16_tc"
    assert init_launch(UNetConfig(), "fp16", 64).grid == (4 * 4 + 1, 1, 64)   # 16 x 16 tiles + the step CTA
    assert init_launch(UNetConfig(), "fp16", 1).grid == (16 * 4 + 1, 1, 1)
    assert init_symbol(UNetConfig(channels=1), "bf16", 3) == "init_conv7_c1_bf16_tc"
    assert init_symbol(UNetConfig(), "fp32", 3).startswith("init_conv7_c3_f32")
    assert not init_symbol(UNetConfig(channels=5), "fp16", 3).endswith("_tc")


def test_bf16_rounding_is_nearest_even():
    x = np.array([1.0, 1.00390625, 1.005859375, -2.5, 3.0e38, 1e-40], dtype=np.float32)
    b = from_device(to_device(x, "bf16"), "bf16")
    assert b[0] == 1.0 and b[1] == 1.0 and b[2] == np.float32(1.0078125) and b[3] == -2.5
    assert np.all(np.abs(b - x) <= np.abs(x) * 2.0 ** -8 + 1e-38)


def emulate(spec, key, env, plan, params, precision):
    """conv.cu's implicit GEMM on the host: the same K order, padding, in_map and packed weights; a
    folded GroupNorm (blob gn_fold) as the kernels compute it: the input as its producer stores it
    (gn_w * x, its oscale) with the pad value at padded taps, the segment-0 sum times rstd, minus
    mean * rstd * Q (conv.cu conv_gn_prologue)."""
    op = spec.op
    xt, ot = plan.tensors[op.x], plan.tensors[op.out]
    x = env[op.x].transpose(0, 2, 3, 1)
    fold = "gn_fold" in spec.blobs
    if op.norm and not fold:
        x = gn1(env[op.x], params[op.norm + ".weight"], params[op.norm + ".bias"], plan.config.norm_eps)
        x = x.transpose(0, 2, 3, 1)
    cin, hin, hout = xt.channels, xt.size, ot.size
    if key.subpixel:
        return emulate_subpixel(spec, x, ot.channels, precision)
    kh, st, up = key.kh, key.stride, key.up
    pad = kh // 2 if st == 1 else 0
    bk = key.bk
    w = spec.blobs["w"]
    w = from_device(w, precision) if precision != "fp32" else w.T
    k0p = -(-kh * kh * cin // bk) * bk
    k = np.arange(k0p)
    tap, c = k // cin, k % cin
    ky, kx = tap // kh, tap % kh
    oy, ox = np.meshgrid(np.arange(hout), np.arange(hout), indexing="ij")
    vy = oy[..., None] * st + ky - pad
    vx = ox[..., None] * st + kx - pad
    ok = (tap < kh * kh) & (vy >= 0) & (vy < hin * up) & (vx >= 0) & (vx < hin * up)
    pad_value = 0.0
    if fold:
        axes = (1, 2, 3)
        mean, rstd = env[op.x].mean(axis=axes), 1.0 / np.sqrt(env[op.x].var(axis=axes) + plan.config.norm_eps)
        g, b, q = spec.blobs["gn_fold"][:cin], spec.blobs["gn_fold"][cin:2 * cin], spec.blobs["gn_fold"][2 * cin:]
        x = x * g
        pad_value = (g[None, :] * mean[:, None] - b[None, :] / rstd[:, None])[:, None, None, c]
    a = np.where(ok, x[:, np.clip(vy // up, 0, hin - 1), np.clip(vx // up, 0, hin - 1), c], pad_value)
    out = a @ w[:, :k0p].T
    if fold:
        out = (out - mean[:, None, None, None] * q) * rstd[:, None, None, None]
    if k_residual(op):   # a residual_conv's 1x1 weights or an identity residual's identity
        r = env[op.residual].transpose(0, 2, 3, 1)
        out = out + r @ w[:, k0p:k0p + r.shape[-1]].T
    out = out[..., :ot.channels] + spec.blobs["bias"][:ot.channels]
    return out.transpose(0, 3, 1, 2)


def emulate_subpixel(spec, x, n, precision):
    """conv_pipe.cu's sub-pixel up2 conv on the host (no GroupNorm, no residual: ops.conv.subpixel):
    output parity (py, px) is a 2x2 conv of the input x (NHWC) with padding 1 - py above and 1 - px
    left, by its own block of the packed weights (4 blocks of Npad rows, K ordered (a, b, c))."""
    assert "gn_fold" not in spec.blobs and "gn_w" not in spec.blobs
    w = spec.blobs["w"].astype(np.float64) if precision == "fp16" else from_device(spec.blobs["w"], precision)
    npad, (b, hin, _, cin) = w.shape[0] // 4, x.shape
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    out = np.zeros((b, 2 * hin, 2 * hin, npad))
    for p in range(4):
        py, px = p >> 1, p & 1
        cols = np.concatenate([xp[:, a + py:a + py + hin, c + px:c + px + hin] for a in (0, 1) for c in (0, 1)], axis=-1)
        out[:, py::2, px::2] = cols @ w[p * npad:(p + 1) * npad, :4 * cin].T
    return (out[..., :n] + spec.blobs["bias"][:n]).transpose(0, 3, 1, 2)


@pytest.mark.parametrize("cfg", [UNetConfig(dim=8, image_size=16, dim_mults=(1, 2, 3), time_dim=32), ODD])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_packed_weights_reproduce_every_gemm_conv(cfg, precision):
    w = W(cfg, seed=1)
    ex = GpuExecutor(w, precision, batch=2, backend=FakeBackend())
    ref = Reference(w, np.float64)
    rng = np.random.default_rng(0)
    env = ref.time_env(np.array([3, 7]))
    ref.eps(rng.standard_normal((2, cfg.channels, cfg.image_size, cfg.image_size)), np.array([3, 7]), env)
    tol = 1e-6 if precision == "fp32" else 3e-2   # fp32 weights vs float64; bf16 weights
    specs = {s.op.out: s for s in ex.specs}
    for spec in ex.specs:
        if kernel_kind(spec.op, ex.plan) != "gemm":
            continue
        op = spec.op
        if "gn_fold" in spec.blobs:   # its producer stores gn_w * x for it
            cin = ex.plan.tensors[op.x].channels
            assert np.array_equal(specs[op.x].blobs["oscale"][:cin], spec.blobs["gn_fold"][:cin]), op.out
        plain = op.__class__(CONV, op.out, op.inputs, op.prefix, k=op.k, in_map=op.in_map, norm=op.norm,
                             residual=k_residual(op),
                             residual_conv=op.residual_conv)
        want = run_op(plain, env, ref.params, ex.plan)
        got = emulate(spec, spec.key, env, ex.plan, ref.params, precision)
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err < tol, (op.out, err)


def test_identity_residual_joins_the_gemm_as_a_k_segment():
    """A block's identity residual (conv2 without activation) is the GEMM's second K segment with
    identity weights, not the epilogue's `res`; a residual after an activation stays in the epilogue."""
    kr = k_residual
    assert kr(Op(CONV, "o", ("h",), "p", k=3, residual="x")) == "x"
    assert kr(Op(CONV, "o", ("h",), "p", k=3, residual="x", residual_conv="p.res_conv")) == "x"
    assert kr(Op(CONV, "o", ("h",), "p", k=3, residual="x", act="gelu")) is None
    assert kr(Op(CONV, "o", ("h",), "p", k=3)) is None
    ex = GpuExecutor(W(UNetConfig()), "fp16", batch=1, backend=FakeBackend())
    launches = {L.name: L for L in ex.launches}
    seen = 0
    for spec in ex.specs:
        op = spec.op
        if op.kind != CONV or not op.residual or op.residual_conv or kernel_kind(op, ex.plan) != "gemm":
            continue
        seen += 1
        n = ex.plan.tensors[op.out].channels
        args = launches[op.out].args   # CONV_PARAMS: 5 xr, 6 Cr, 10 nk0, 11 nk1, 22 res
        assert int(args[5]) and int(args[6]) == n and int(args[11]) > 0, op.out
        assert int(args[22]) == 0, op.out
        w, k0 = from_device(spec.blobs["w"], "fp16"), int(args[10]) * spec.key.bk
        assert np.array_equal(w[:n, k0:k0 + n], np.eye(n)) and not w[:n, k0 + n:].any(), op.out
    assert seen >= 5   # downs.0.block1, every downs.*.block2, mid.block1/2


def test_refuses_a_batch_that_does_not_fit():
    w = W(UNetConfig())
    one = GpuExecutor(w, "fp16", batch=1, backend=FakeBackend())
    need1 = one.arena.nbytes + one._wbuf.nbytes
    with pytest.raises(ArenaError, match=r"largest batch that fits is \d+"):
        GpuExecutor(w, "fp16", batch=64, backend=FakeBackend(free=need1 * 3))


@pytest.mark.parametrize("batch", [1, 3])
def test_arena_live_tensors_never_share_bytes(batch):
    ex = GpuExecutor(W(ODD), "fp16", batch=batch, backend=FakeBackend())
    ex.arena.check_no_overlap()
    spans = {r: (o, o + n, f, l) for r, (o, n, f, l) in ex.arena.roots.items()}
    names = sorted(spans)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            oa, ea, fa, la = spans[a]
            ob, eb, fb, lb = spans[b]
            if fa <= lb and fb <= la:
                assert ea <= ob or eb <= oa, (a, b)


@pytest.mark.parametrize("early", [True, False])
def test_weight_upload_early_start(early):
    """Early start: one copy per op, in plan order, covering the weights buffer exactly once;
    the first call waits on each op's own event before its launch, later calls wait on nothing."""
    fb = FakeBackend()
    ex = GpuExecutor(W(UNetConfig()), "fp16", batch=1, backend=fb, early_start=early)
    wbuf = ex._wbuf
    copies = [(d - wbuf.ptr, n) for d, n in fb.copies if wbuf.ptr <= d < wbuf.ptr + wbuf.nbytes]
    if not early:
        assert copies == [(0, wbuf.nbytes)]
    else:
        assert len(copies) > len(ex.launches) // 2, "one copy per op that has weights"
        pos = 0
        for off, n in copies:
            assert off == pos, "copies are contiguous and in plan order"
            pos += n
        assert pos == wbuf.nbytes
    ex.run(ex.stream)
    assert len(fb.waits) == (len(ex.launches) if early else 0)
    ex.run(ex.stream)
    assert len(fb.waits) == (len(ex.launches) if early else 0)
    ex.close()


def test_images_past_the_kernels_division_range_are_refused():
    """The GEMM kernels' set-up divides with div_small (exact below 2^22): a 2048 x 2048 image has
    2^22 pixels per sample; the config's bound (1024) refuses it before any plan, and 1024 x 1024
    stays within the kernels' range."""
    from jetson_unet.errors import ConfigError
    from jetson_unet.model.plan import build_plan
    plan = build_plan(UNetConfig(image_size=1024))
    gemm = [op for op in plan.ops if op.kind == CONV and op.x != plan.input and op.groups == 1]
    assert kernel_kind(gemm[0], plan) == "gemm"
    with pytest.raises(ConfigError, match="image_size = 2048 is out of range"):
        UNetConfig(image_size=2048)


@pytest.mark.parametrize("batch", [1, 16])
@pytest.mark.parametrize("graphs", [True, False])
def test_device_noise_stream(batch, graphs):
    """Device noise is drawn on a side stream beside the steps with graphs, on the compute stream
    between them without."""
    from jetson_unet.sampling.gpu import GpuSampler
    s = GpuSampler(W(UNetConfig()), "fp16", batch, mode="gpu", graphs=graphs, backend=FakeBackend(), noise="device")
    assert (s.side is s.compute[0]) == (not graphs)
    assert len(s.streams) == len({id(x) for x in s.streams}), "each stream once"
    s.close()


@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("src", [np.float16, np.float32])
def test_packing_shortcuts_give_the_float64_route_s_bits(precision, src):
    """pack_gemm packs an fp16 segment straight into fp16 (the executor's start-up: ~30% less host
    time at fp16) and fold_weights sums P in float64: the bits of the plain route, everything in
    fp32 / float64, then one rounding to the device dtype."""
    rng = np.random.default_rng(7)
    cin, taps, n = 24, 9, 40
    seg0 = (rng.standard_normal((n, taps * cin)) * np.exp(rng.uniform(-12, 6, (n, taps * cin)))).astype(src)
    seg1 = rng.standard_normal((n, 16)).astype(src)
    gn_b = rng.standard_normal(cin).astype(np.float16)
    bias = rng.standard_normal(n).astype(np.float32)
    bf = fold_weights(seg0, bias, gn_b)
    w64, b64 = seg0.astype(np.float64), np.tile(gn_b.astype(np.float64), taps)
    assert np.array_equal(bf, (bias.astype(np.float64) + w64 @ b64).astype(np.float32))
    for segs in ([seg0, seg1],):
        got, ld, nks = pack_gemm(precision, 32, 64, segs)
        plain = np.zeros((64, 256 + 64), np.float32)   # N to BN 32, each K segment to BK 64
        plain[:n, :taps * cin] = segs[0]
        plain[:n, 256:256 + 16] = segs[1]
        want = plain.T.copy() if precision == "fp32" else to_device(plain, precision)
        assert got.dtype == want.dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8)) and nks == [4, 1]

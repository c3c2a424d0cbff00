"""The cp.async conv (kernels/conv_pipe.cu, 3 stages in the built-in tiles) on the host side, no GPU:
the 16-bit vectorized GEMM convs and gates run `_s<stages>` (or the halo conv's `_h<stages>`) symbols
whose launch arguments match CONV_PARAMS, with a ring that fits the smem budget, and the weights
packed for their BK still reproduce the reference; slow: the module compiles for sm_87 with nvcc,
without spills, within the smem budget."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from tests.helpers import sm87
from tests.helpers.fakes import FakeBackend, own_module_cache  # noqa: F401  (the fixture: autouse)

from jetson_unet.paths import kernels_dir
from jetson_unet.model.config import UNetConfig
from jetson_unet.ops.common import SMEM_LIMIT
from jetson_unet.ops.conv_halo import HALO_SMEM_LIMIT
from jetson_unet.ops.conv_pipe import (PIPE_RING_LIMIT, PIPE_SCRATCH, deep_ring, pipe_ring_bytes, pipe_smem,
                                       pipe_tile)
from jetson_unet.executor.executor import GpuExecutor
from jetson_unet.ops.keys import ConvKey
from jetson_unet.model.weights import random_params

ODD = UNetConfig(dim=12, image_size=24, dim_mults=(1, 2, 3), time_dim=48)
CONFIGS = {"default": UNetConfig(), "odd": ODD}
ORIN_SMEM_PER_SM = 100 * 1024   # the budget this work keeps to: two CTAs per SM
CTA_RESERVED = 1024             # smem the driver reserves per CTA (sm_80+)
ORIN_SM_SMEM = 164 * 1024       # an sm_87 SM's shared memory, which the halo conv's opt-in may use


class W:
    def __init__(self, cfg: UNetConfig, seed: int = 0) -> None:
        self.config, self.params = cfg, random_params(cfg, seed)


def test_pipe_tile_budget():
    pt = pipe_tile
    assert pt("fp16", 128, 64, 8, False, 3) == (32, 3)        # 36 KB ring
    assert pt("bf16", 32, 64, 8, False, 3) == (64, 3)         # BK 64 where it fits: 128 k in flight
    assert pt("fp16", 64, 64, 8, False, 3) == (32, 3)         # BK 64 x 3 would be 48 KB
    assert pt("fp16", 64, 64, 8, False, 4) == (32, 4)
    assert pt("fp16", 128, 64, 8, False, 4) == (32, 3)        # 4 stages do not fit: 3
    assert pt("fp16", 32, 256, 8, True, 3) is None            # the widest gate keeps conv_gemm
    assert pt("fp32", 64, 64, 4, False, 3) is None and pt("fp16", 64, 64, 1, False, 3) is None
    assert pt("fp16", 64, 64, 8, False, 0) is None
    assert pt("fp16", 128, 64, 8, False, 3, dyn_smem=8 * 1024) == (32, 3)      # Cin 1024
    assert pt("fp16", 128, 64, 8, False, 3, dyn_smem=12 * 1024) is None       # Cin 1536
    for bm, bn in ((32, 32), (32, 64), (64, 32), (64, 64), (128, 32), (128, 64), (64, 128)):
        for s in (2, 3, 4, 5, 6):
            got = pt("fp16", bm, bn, 8, False, s)
            assert got is None or pipe_ring_bytes(bm, bn, got[0], got[1]) <= PIPE_RING_LIMIT


# ---- set: the variant's launches ---------------------------------------------------------------

def kernel_params(macro: str) -> list:
    text = (kernels_dir() / "conv.cu").read_text()
    body = re.search(r"#define %s\s*\\?\n?(.*?)\n#define" % macro, text, re.S).group(1)
    params = [p.strip() for p in body.replace("\\", " ").split(",")]
    return ["p" if "*" in p else ("f" if p.startswith("float") else "i") for p in params]


KIND = {np.uint64: "p", np.int32: "i", np.float32: "f"}


def test_pipelined_kernel_takes_conv_params():
    """conv_pipe.cu's kernels are declared with conv.cu's CONV_PARAMS and pass them as the op features
    F see them: one argument list for both."""
    text = (kernels_dir() / "conv_pipe.cu").read_text()
    macro = re.search(r"#define CONV_PIPE_INSTANCE\(([^)]*)\)(.*)", text, re.S)
    names = [a.strip() for a in macro.group(1).split(",")]
    assert names[-4:] == ["STAGES", "KS", "FOLD", "F"] and len(names) == 16
    assert re.search(r"name\(CONV_PARAMS\)", macro.group(2)) and "(CONV_FEATURE_ARGS(F))" in macro.group(2)


@pytest.mark.parametrize("cfg", ["default", "odd"])
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("sms", [8, 132])
def test_pipelined_launches(cfg, precision, sms):
    fb = FakeBackend(sms=sms)
    ex = GpuExecutor(W(CONFIGS[cfg]), precision, batch=3, backend=fb)
    kinds = kernel_params("CONV_PARAMS")
    piped = 0
    for spec, launch in zip(ex.specs, ex.launches):
        key = spec.key
        if not isinstance(key, ConvKey):
            continue
        got = [KIND[type(a)] for a in launch.args]
        assert got == kinds, (spec.op.out, got, kinds)
        want_piped = precision != "fp32" and key.vec == 8 and not (key.gate and key.bn == 256)
        assert bool(key.stages) == want_piped, (spec.op.out, key)
        if key.stages:
            piped += 1
            # the built-in halo conv where the grid is deep, its row tiles on 32- and 64-pixel rows (8 SMs)
            kind = "_r2" if key.rows else "_h3" if key.halo else "_s3"
            assert key.stages == (2 if key.rows else 3) and launch.fn.symbol == key.symbol
            assert launch.fn.symbol.endswith((kind + "_f" if key.fold else kind) + "_x" + (key.feat or "0"))
            assert key.fold == bool(spec.op.norm and key.bn <= 128), (spec.op.out, key)   # fold_norm
            if key.halo:   # dynamic smem only, past 48 KB by the opt-in, two CTAs per sm_87 SM
                assert launch.smem <= min(HALO_SMEM_LIMIT, launch.fn.max_dynamic_shared), (spec.op.out, launch.smem)
                assert 2 * (launch.smem + CTA_RESERVED) <= ORIN_SM_SMEM
                continue
            static = pipe_ring_bytes(key.bm, key.bn, key.bk, key.stages) + PIPE_SCRATCH
            assert static + launch.smem <= SMEM_LIMIT, (spec.op.out, static, launch.smem)
            assert 2 * (static + launch.smem + CTA_RESERVED) <= ORIN_SMEM_PER_SM
    src = ex.kernels.source
    if piped:
        assert "// ==== conv_pipe.cu ====" in src and src.index("==== conv.cu") < src.index("==== conv_pipe.cu")
        for sym in ex.kernels.symbols:
            if re.search(r"_s3(_f)?_x\w+$", sym):
                assert f"CONV_PIPE_INSTANCE({sym}," in src
            if re.search(r"_h3(_f)?_x\w+$", sym):
                assert f"CONV_HALO_INSTANCE({sym}," in src
    else:
        assert "// ==== conv_pipe.cu" not in src
    if cfg == "default":   # every GEMM conv of the default config has 16-byte vectors
        assert (piped > 0) == (precision != "fp32"), piped


def test_pipelined_weights_reproduce_every_gemm_conv():
    """The packed weights and K segments follow the variant's BK (32 where conv_gemm had 64)."""
    from tests.host.test_gpu_cpu_parts import test_packed_weights_reproduce_every_gemm_conv as check
    check(UNetConfig(dim=8, image_size=16, dim_mults=(1, 2, 3), time_dim=32), "bf16")
    ex = GpuExecutor(W(UNetConfig()), "fp16", batch=1, backend=FakeBackend())
    assert any(s.key.stages and s.key.bk == 32 for s in ex.specs if isinstance(s.key, ConvKey))
    assert any("gn_fold" in s.blobs for s in ex.specs), "the 16-bit cp.async convs fold their GroupNorm"
    assert any(s.key.subpixel for s in ex.specs if isinstance(s.key, ConvKey)), "sub-pixel up2"


@pytest.mark.parametrize("sms,batch", [(8, 1), (8, 4), (132, 1), (132, 64)])
def test_up2_convs_are_sub_pixel_where_a_tile_fits_a_parity_class(sms, batch):
    """ops.conv.subpixel: every up2 conv of the default config runs the sub-pixel 2x2 form (BM
    dividing its input's pixels); where no BM of 32 or more divides them (a 24x24 image: 6x6 and
    12x12 inputs, 36 and 144 pixels) conv_gemm keeps the 3x3 map, and its packed weights still
    reproduce the op (test_packed_weights_reproduce_every_gemm_conv)."""
    from tests.host.test_gpu_cpu_parts import test_packed_weights_reproduce_every_gemm_conv as check

    def up2_keys(cfg):
        ex = GpuExecutor(W(cfg), "fp16", batch=batch, backend=FakeBackend(sms=sms))
        return [(ex.plan.tensors[s.op.x].size ** 2, s.key) for s in ex.specs if s.op.in_map == "up2"]

    for rows, k in up2_keys(UNetConfig()):
        assert k.kh == 2 and k.stages and not k.halo and rows % k.bm == 0, k.symbol
    odd = UNetConfig(dim=16, image_size=24, dim_mults=(1, 2, 4), time_dim=64)
    keys = up2_keys(odd)
    assert keys and all(k.kh == 3 and k.stages == 0 for _, k in keys), [k.symbol for _, k in keys]
    check(odd, "bf16")


# ---- slow: the real compiler ---------------------------------------------------------------------

@pytest.mark.slow
def test_pipelined_module_compiles_for_sm87(ptxas87):
    # the built-in tiles at batch 1 and 16 on the Orin's 8 SMs (sm87.kernels): at batch 16 most tiles are
    # large, with the k loop unrolled by its stages (conv_pipe.cu), which holds more registers
    keys, dyn = sm87.keys("built-in"), sm87.dynamic_smem("built-in")
    rep = ptxas87.report(keys)
    assert any(k.fold for k in keys)
    assert any(k.halo for k in keys)   # an 8-SM GPU's built-in tiles take the halo conv where it is deep
    assert any(k.subpixel for k in keys)   # the up2 convs as sub-pixel 2x2 convs
    assert any(k.bm * k.bn >= 64 * 64 and k.wm * k.wn >= 4 and not k.halo and not k.gate for k in keys)   # unrolled
    assert any(k.rows for k in keys)   # the halo conv's row tiles on the 32- and 64-pixel levels
    for k in keys:
        f = rep[k.symbol]
        assert f["spill"] <= (ROWS_SPILL_MAX if k.rows else 0) and (k.rows or f["stack"] == 0), (k.symbol, f)
        if k.halo:   # its tiles live in dynamic smem (test_opt_in_launches checks the budget)
            assert f["regs"] * k.threads * 2 <= 65536, (k.symbol, f)
            continue
        ring = pipe_ring_bytes(k.bm, k.bn, k.bk, k.stages)
        assert ring <= f["smem"] <= ring + PIPE_SCRATCH, (k.symbol, f)
        assert f["smem"] + dyn.get(k.symbol, 0) <= SMEM_LIMIT, (k.symbol, f)
        # two CTAs per SM by registers (conv_pipe.cu PIPE_MIN_CTAS)
        assert f["regs"] * k.threads * 2 <= 65536, (k.symbol, f)


# ptxas spills of the deep-ring candidates at the 128-register cap (bytes, stores + loads): measured
# nvcc 13 sm_87 0-32, sm_90 8-36. They stay at the cap: held to 168 registers without spills (3 CTAs
# per SM), the H100's batch-16 call with them was 0.941 / 0.938 ms against 0.916 / 0.919 at the cap;
# the tuner keeps them only where they measure faster. The generic kernel's output scale (feature o)
# took the 64x64x64 2x1 folded candidate from 0 to 68 bytes at 255 registers (nvcc 13, sm_87).
DEEP_SPILL_MAX = 72
# ... and of the halo conv's row tiles (64 accumulators per thread at the 128- or 168-register cap):
# nvcc 13 sm_87 0-88 bytes over its 33 candidates, in the set-up and the epilogue but for the 512x32 4x2
# tile without GroupNorm: 3 local-memory accesses in its chunk loop (tools.lab.sass_loops, 2026-11-29).
ROWS_SPILL_MAX = 96


# The machine code of a GEMM conv with a GELU (nvcc 13, sm_87). A kernel whose code is not in the
# SM's instruction cache fetches it from L2 as it runs, at every launch after other large kernels
# (docs/kernels.md, "Code size"); with erff inlined once per accumulator these kernels were up to 96 KB
# (half of it the GELU), with the rolled GELU (conv.cu gelu_rolled) 42-59 KB.
GELU_CONV_CODE_MAX = 72 * 1024


@pytest.mark.slow
def test_gelu_convs_code_stays_small(ptxas87):
    """The built-in tiles' convs that take a GELU (feature g, and the generic split-K kernels, which
    may) hold their code under GELU_CONV_CODE_MAX: the GELU is not inlined per accumulator."""
    keys = [k for k in sm87.keys("built-in") if "g" in k.feat and not k.gate]
    assert len(keys) >= 4 and any(k.rows for k in keys)
    rep = ptxas87.report(keys)
    for k in keys:
        assert rep[k.symbol]["text"] <= GELU_CONV_CODE_MAX, (k.symbol, rep[k.symbol])


def test_kernel_and_host_agree_on_where_a_ring_is_deep():
    """kernels/conv_pipe.cu moves a ring past DEEP_RING bytes into dynamic smem; the host sizes the
    launch's dynamic smem by deep_ring, whose limit is PIPE_RING_LIMIT: one number, twice."""
    src = (kernels_dir() / "conv_pipe.cu").read_text()
    m = re.search(r"#define DEEP_RING \((\d+) \* 1024\)", src)
    assert m and int(m.group(1)) * 1024 == PIPE_RING_LIMIT
    k = ConvKey("fp16", 64, 64, 64, 2, 2, 3, 1, 1, 8, False, 3)
    assert deep_ring(k) and not deep_ring(dataclasses.replace(k, bk=32))
    assert pipe_smem(k, 512) == 512 + 128 + pipe_ring_bytes(64, 64, 64, 3)


@pytest.mark.slow
def test_deep_ring_candidates_compile_for_sm87(ptxas87):
    """Every deep-ring tile the tuner may time (deep_ring: the ring in dynamic smem) builds for
    sm_87 with its ring out of static smem, within the dynamic budget of two CTAs per Orin SM, and
    with at most a few bytes of spills."""
    keys, dyn = sm87.keys("deep ring"), sm87.dynamic_smem("deep ring")
    assert any(k.bk == 64 for k in keys) and any(k.bm * k.bn >= 128 * 128 for k in keys)
    rep = ptxas87.report(keys)
    for k in keys:
        f = rep[k.symbol]
        assert f["smem"] <= PIPE_SCRATCH, (k.symbol, f)   # the ring is not static
        assert f["smem"] + dyn[k.symbol] + CTA_RESERVED <= ORIN_SM_SMEM // 2, (k.symbol, f)
        assert f["spill"] <= DEEP_SPILL_MAX, (k.symbol, f)

"""The plan against the spec's "Blocks and parameter names" and "Network" sections.

`spec_params` and `spec_param_count` below are written from the spec text, independently of
runtime/plan.py: the first lists every parameter name with its PyTorch shape, the second is a
closed-form count (plain arithmetic, no shapes).
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from typing import Dict, Tuple

import numpy as np
import pytest

from jetson_unet.model import plan as P
from jetson_unet.model.config import UNetConfig
from jetson_unet.model.plan import build_plan, lifetimes

DEFAULT = UNetConfig()
DEFAULT_N_PARAMS = 15_885_671          # "about 15.9 M parameters" in the spec
CONFIGS = {
    "default": DEFAULT,
    "odd": UNetConfig(image_size=12, dim=6, dim_mults=(1, 2, 3), time_dim=20),
    "one-level": UNetConfig(image_size=10, dim=4, dim_mults=(1,), time_dim=12),
    "gray-mult3": UNetConfig(image_size=20, channels=1, dim=10, dim_mults=(1, 3), convnext_mult=3, time_dim=16),
}


def spec_params(cfg: UNetConfig) -> Dict[str, Tuple[int, ...]]:
    td, m, ch = cfg.time_dim, cfg.convnext_mult, cfg.channels
    out: Dict[str, Tuple[int, ...]] = OrderedDict()

    def conv(p, cin, cout, k, groups=1):
        out[p + ".weight"], out[p + ".bias"] = (cout, cin // groups, k, k), (cout,)

    def norm(p, c):
        out[p + ".weight"], out[p + ".bias"] = (c,), (c,)

    def block(p, i, o):
        out[p + ".mlp.weight"], out[p + ".mlp.bias"] = (i, td), (i,)
        conv(p + ".ds_conv", i, i, 7, groups=i)
        norm(p + ".norm1", i)
        conv(p + ".conv1", i, m * o, 3)
        norm(p + ".norm2", m * o)
        conv(p + ".conv2", m * o, o, 3)
        if i != o:
            conv(p + ".res_conv", i, o, 1)

    dims = [cfg.dim] + [cfg.dim * k for k in cfg.dim_mults]
    levels = list(zip(dims[:-1], dims[1:]))
    out["time_mlp.0.weight"], out["time_mlp.0.bias"] = (td, cfg.dim), (td,)
    out["time_mlp.2.weight"], out["time_mlp.2.bias"] = (td, td), (td,)
    conv("init_conv", ch, cfg.dim, 7)
    for k, (i, o) in enumerate(levels):
        block(f"downs.{k}.block1", i, i)
        block(f"downs.{k}.block2", i, i)
        last = k == len(levels) - 1
        conv(f"downs.{k}.down.conv", i if last else 4 * i, o, 3 if last else 1)
    block("mid.block1", dims[-1], dims[-1])
    block("mid.block2", dims[-1], dims[-1])
    for j, (i, o) in enumerate(reversed(levels)):
        conv(f"ups.{j}.gate.gate_conv", o, o, 1)
        conv(f"ups.{j}.gate.residual_conv", i, o, 1)
        conv(f"ups.{j}.gate.psi", o, 1, 1)
        block(f"ups.{j}.block1", o + i, o)
        block(f"ups.{j}.block2", o + i, o)
        conv(f"ups.{j}.up.conv", o, i, 3)
    block("final_block", 2 * cfg.dim, cfg.dim)
    conv("final_conv", cfg.dim, ch, 1)
    return out


def spec_param_count(cfg: UNetConfig) -> int:
    """Closed form: sum over the spec's modules of weights + biases."""
    td, m, ch, d = cfg.time_dim, cfg.convnext_mult, cfg.channels, cfg.dim

    def block(i, o):
        return ((td + 1) * i + 50 * i + 2 * i + (9 * i + 1) * m * o + 2 * m * o + (9 * m * o + 1) * o
                + ((i + 1) * o if i != o else 0))

    def gate(g, r):
        return (g + 1) * g + (r + 1) * g + g + 1

    dims = [d] + [d * k for k in cfg.dim_mults]
    L = len(dims) - 1
    n = (d + 1) * td + (td + 1) * td + (ch * 49 + 1) * d
    for k in range(L):
        i, o = dims[k], dims[k + 1]
        n += 2 * block(i, i) + ((9 if k == L - 1 else 4) * i + 1) * o                  # downs
        n += gate(o, i) + 2 * block(o + i, o) + (9 * o + 1) * i                        # ups
    return n + 2 * block(dims[-1], dims[-1]) + block(2 * d, d) + (d + 1) * ch


# ---- the default config ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def plan():
    return build_plan(DEFAULT)


@pytest.mark.parametrize("name,channels,size", [
    ("x", 3, 64), ("init_conv", 32, 64), ("downs.0.block1", 32, 64), ("downs.0.block1.conv1", 64, 64),
    ("downs.0.down.conv", 32, 32), ("downs.1.down.conv", 64, 16), ("downs.2.down.conv", 128, 8),
    ("downs.3.block2", 128, 8), ("downs.3.down.conv", 256, 8), ("mid.block2", 256, 8),
    ("ups.0.gate@1", 128, 8), ("ups.0.cat1", 384, 8), ("ups.0.block1", 256, 8), ("ups.0.up.conv", 128, 16),
    ("ups.1.cat2", 192, 16), ("ups.2.cat1", 96, 32), ("ups.3.cat2", 64, 64), ("ups.3.up.conv", 32, 64),
    ("final.cat", 64, 64), ("final_block", 32, 64), ("eps", 3, 64), ("temb", 128, 0), ("downs.0.block1.mlp", 32, 0),
])
def test_default_tensor_shapes(plan, name, channels, size):
    t = plan.tensors[name]
    assert (t.channels, t.size) == (channels, size), f"{name}: got ({t.channels}, {t.size})"


def test_default_parameter_count(plan):
    assert plan.n_params == DEFAULT_N_PARAMS, "plan count"
    assert spec_param_count(DEFAULT) == DEFAULT_N_PARAMS, "closed-form count from the spec"


@pytest.mark.parametrize("name,shape", [
    ("init_conv.weight", (32, 3, 7, 7)), ("downs.3.down.conv.weight", (256, 128, 3, 3)),
    ("downs.0.down.conv.weight", (32, 128, 1, 1)), ("ups.0.gate.psi.weight", (1, 256, 1, 1)),
    ("ups.0.block1.res_conv.weight", (256, 384, 1, 1)), ("final_conv.weight", (3, 32, 1, 1)),
    ("time_mlp.0.weight", (128, 32)), ("downs.0.block1.mlp.weight", (32, 128)),
    ("downs.0.block1.ds_conv.weight", (32, 1, 7, 7)), ("ups.3.up.conv.weight", (32, 32, 3, 3)),
])
def test_default_param_spot_checks(plan, name, shape):
    assert plan.params.get(name) == shape, f"{name}: got {plan.params.get(name)}"


def test_no_res_conv_where_in_equals_out(plan):
    for op in plan.ops:
        if op.kind == P.CONV and op.prefix.endswith(".conv2"):
            block = op.prefix[: -len(".conv2")]
            i, o = plan.tensors[op.residual].channels, plan.tensors[op.out].channels
            assert op.residual_conv == (block + ".res_conv" if i != o else None), block
            assert (block + ".res_conv.weight" in plan.params) == (i != o), block


def test_gate_params_once_used_twice(plan):
    uses = Counter(op.prefix for op in plan.ops if op.kind == P.GATE)
    assert uses == {f"ups.{j}.gate": 2 for j in range(4)}, uses
    for j in range(4):
        names = [n for n in plan.params if n.startswith(f"ups.{j}.gate.")]
        assert len(names) == 6, names   # gate_conv, residual_conv, psi: weight + bias each


def test_op_counts(plan):
    kinds = Counter(op.kind for op in plan.ops)
    assert kinds[P.CAT] == 9, kinds
    assert len(plan.ops) - kinds[P.CAT] == 75, kinds
    assert kinds[P.GATE] == 8 and kinds[P.CONV] == 67, kinds
    # one time embedding, and one time projection per ConvNeXt block (8 down, 2 mid, 8 up, final)
    assert Counter(op.kind for op in plan.time_ops) == {P.TIME_EMBED: 1, P.TIME_PROJ: 19}


def test_skip_wiring_follows_the_spec(plan):
    """Gate j,n reads (x, the popped skip); cat is (x, gated skip); skips pop in reverse push order."""
    ops = {op.out: op for op in plan.ops}
    skips = [f"downs.{k}.block{n}" for k in range(4) for n in (1, 2)]
    x = "mid.block2"
    for j in range(4):
        for n in (1, 2):
            gate, cat = ops[f"ups.{j}.gate@{n}"], ops[f"ups.{j}.cat{n}"]
            assert gate.inputs == (x, skips.pop()), gate
            assert cat.inputs == (x, gate.out), cat
            assert ops[f"ups.{j}.block{n}"].residual == cat.out
            x = f"ups.{j}.block{n}"
        x = f"ups.{j}.up.conv"
    assert ops["final.cat"].inputs == (x, "init_conv")


def test_block_structure(plan):
    """Every ConvNextBlock is the spec's three lines: ds_conv(+time bias), conv1(gn1, gelu), conv2(gn1)+res."""
    ops = {op.out: op for op in plan.ops}
    blocks = [op.prefix[: -len(".ds_conv")] for op in plan.ops if op.prefix.endswith(".ds_conv")]
    assert len(blocks) == 19
    for p in blocks:
        ds, c1, c2 = ops[p + ".ds_conv"], ops[p + ".conv1"], ops[p]
        i = plan.tensors[ds.x].channels
        assert (ds.k, ds.groups, ds.tbias, ds.norm, ds.act) == (7, i, p + ".mlp", None, "none"), ds
        assert (c1.x, c1.k, c1.norm, c1.act) == (ds.out, 3, p + ".norm1", "gelu"), c1
        assert (c2.prefix, c2.x, c2.k, c2.norm, c2.act, c2.residual) == \
            (p + ".conv2", c1.out, 3, p + ".norm2", "none", ds.x), c2


def test_lifetimes_written_before_read(plan):
    life = lifetimes(plan)
    outs = [op.out for op in plan.ops]
    assert len(set(outs)) == len(outs), "a tensor is written twice"
    image = {n for n, t in plan.tensors.items() if t.size}
    assert set(life) == image, "lifetimes must cover exactly the image tensors"
    assert life["x"][0] == -1 and life["eps"][1] == len(plan.ops)
    for idx, op in enumerate(plan.ops):
        assert life[op.out][0] == idx, op.out
        for name in op.reads():
            if name in image:
                first, last = life[name]
                assert first < idx <= last, f"op {idx} ({op.out}) reads {name} with lifetime {first}..{last}"
            else:
                assert name in {o.out for o in plan.time_ops}, f"{op.out} reads unknown {name}"
    for name, (first, last) in life.items():
        assert last > first, f"{name} is never read"


# ---- every config: names, count, channel consistency ---------------------------------------

@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
def test_params_equal_spec(cfg):
    plan = build_plan(cfg)
    want = spec_params(cfg)
    assert sorted(set(want) - set(plan.params)) == [], "spec names missing from the plan"
    assert sorted(set(plan.params) - set(want)) == [], "plan names not in the spec"
    wrong = {n: (plan.params[n], s) for n, s in want.items() if plan.params[n] != s}
    assert wrong == {}, "shapes differ (plan, spec)"
    assert plan.n_params == spec_param_count(cfg) == sum(int(np.prod(s)) for s in want.values())


@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
def test_channels_consistent(cfg):
    plan = build_plan(cfg)
    T, W = plan.tensors, plan.params
    for op in plan.ops:
        out = T[op.out]
        if op.kind == P.CONV:
            x = T[op.x]
            cin, size = {"none": (x.channels, x.size), "unshuffle2": (4 * x.channels, x.size // 2),
                         "up2": (x.channels, 2 * x.size)}[op.in_map]
            assert W[op.prefix + ".weight"] == (out.channels, cin // op.groups, op.k, op.k), op
            assert cin % op.groups == 0 and out.size == size, op
            if op.norm:
                assert W[op.norm + ".weight"] == (x.channels,), op
            if op.tbias:
                assert T[op.tbias] == P.Tensor(op.tbias, out.channels, 0), op
            if op.residual:
                r = T[op.residual]
                assert r.size == out.size, op
                if op.residual_conv:
                    assert W[op.residual_conv + ".weight"] == (out.channels, r.channels, 1, 1), op
                else:
                    assert r.channels == out.channels, op
        elif op.kind == P.GATE:
            x, skip = T[op.inputs[0]], T[op.inputs[1]]
            g = x.channels
            assert x.size == skip.size == out.size and out.channels == skip.channels, op
            assert W[op.prefix + ".gate_conv.weight"] == (g, g, 1, 1), op
            assert W[op.prefix + ".residual_conv.weight"] == (g, skip.channels, 1, 1), op
            assert W[op.prefix + ".psi.weight"] == (1, g, 1, 1), op
        else:
            assert op.kind == P.CAT, op
            a, b = T[op.inputs[0]], T[op.inputs[1]]
            assert a.size == b.size == out.size and out.channels == a.channels + b.channels, op
    assert T["eps"] == P.Tensor("eps", cfg.channels, cfg.image_size)
    assert T["x"] == P.Tensor("x", cfg.channels, cfg.image_size)

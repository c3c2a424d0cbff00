"""The seed-unet topology, written ONCE, as a static plan: an ordered list of ops over named tensors.

Both executors run this list: `reference.py` (NumPy, the oracle) and `gpu/executor.py`. The ops are
at the granularity the GPU fuses at, so that the reference and the GPU compute the same units:

  conv        out = act(conv_k(pre(x)) + bias + tbias[b, c]) + residual_term
                pre(x) = gn1(in_map(x); norm) if norm else in_map(x)
                in_map: "none" | "unshuffle2" (pixel_unshuffle2) | "up2" (nearest x2)
                residual_term = residual_conv(residual) (a 1x1 conv) or residual, if given
  gate        out = sigmoid(psi(relu(gate_conv(x) + residual_conv(skip)))) * skip
  cat         out = cat(a, b): never executed on the GPU, its inputs are views of its output
  time_embed  out = time_mlp.2(gelu(time_mlp.0(sinusoidal(t))))     (B, time_dim)
  time_proj   out = P(gelu(temb))                                    (B, C): a block's time bias

Tensor names are module paths (`downs.0.block1` is that block's output); shapes are per sample:
(channels, size, size) for images, (channels,) for vectors (size 0).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from jetson_unet.errors import ConfigError
from jetson_unet.model.config import MAX_PARAMS, UNetConfig

CONV, GATE, CAT, TIME_EMBED, TIME_PROJ = "conv", "gate", "cat", "time_embed", "time_proj"
TIME_KINDS = (TIME_EMBED, TIME_PROJ)


@dataclass(frozen=True)
class Tensor:
    name: str
    channels: int
    size: int  # H == W; 0 for a (B, channels) vector

    @property
    def numel(self) -> int:
        """Elements per sample."""
        return self.channels * max(self.size, 1) ** 2


@dataclass(frozen=True)
class Op:
    kind: str
    out: str                      # output tensor name; unique, so it also names the op
    inputs: Tuple[str, ...]       # conv: (x,) ; gate: (x, skip) ; cat: (a, b) ; time_*: (t,) / (temb,)
    prefix: str = ""              # parameter prefix (module path); gates reuse theirs twice
    k: int = 1
    groups: int = 1
    in_map: str = "none"
    norm: Optional[str] = None
    act: str = "none"
    residual: Optional[str] = None
    residual_conv: Optional[str] = None
    tbias: Optional[str] = None

    @property
    def x(self) -> str:
        return self.inputs[0]

    def reads(self) -> Tuple[str, ...]:
        """Every tensor this op reads."""
        extra = tuple(n for n in (self.residual, self.tbias) if n)
        return self.inputs + extra


@dataclass(frozen=True)
class Plan:
    config: UNetConfig
    tensors: "OrderedDict[str, Tensor]"
    ops: Tuple[Op, ...]                          # image ops, in execution order
    time_ops: Tuple[Op, ...]                     # depend on t only: computed once per timestep
    params: "OrderedDict[str, Tuple[int, ...]]"  # name -> shape, in first-use order
    input: str = "x"
    output: str = "eps"

    @property
    def n_params(self) -> int:
        n = 0
        for shape in self.params.values():
            size = 1
            for s in shape:
                size *= s
            n += size
        return n

    def param_prefixes(self) -> List[str]:
        """Module prefixes in first-use order (the weight-upload order)."""
        seen: "OrderedDict[str, None]" = OrderedDict()
        for name in self.params:
            seen[name.rsplit(".", 1)[0]] = None
        return list(seen)


class _Builder:
    def __init__(self, cfg: UNetConfig) -> None:
        self.cfg = cfg
        self.tensors: "OrderedDict[str, Tensor]" = OrderedDict()
        self.ops: List[Op] = []
        self.time_ops: List[Op] = []
        self.params: "OrderedDict[str, Tuple[int, ...]]" = OrderedDict()

    def tensor(self, name: str, channels: int, size: int) -> str:
        assert name not in self.tensors, name
        self.tensors[name] = Tensor(name, channels, size)
        return name

    def param(self, name: str, *shape: int) -> None:
        if name in self.params:  # a gate's weights serve two calls
            assert self.params[name] == shape, name
            return
        self.params[name] = shape

    def conv_params(self, prefix: str, cin: int, cout: int, k: int, groups: int = 1) -> None:
        self.param(prefix + ".weight", cout, cin // groups, k, k)
        self.param(prefix + ".bias", cout)

    def conv(self, prefix: str, x: str, cout: int, k: int, groups: int = 1, in_map: str = "none",
             out: Optional[str] = None, **epilogue: Optional[str]) -> str:
        t = self.tensors[x]
        cin, size = t.channels, t.size
        if in_map == "unshuffle2":
            cin, size = 4 * cin, size // 2
        elif in_map == "up2":
            size = 2 * size
        norm = epilogue.get("norm")
        if norm:
            self.param(norm + ".weight", t.channels)
            self.param(norm + ".bias", t.channels)
        self.conv_params(prefix, cin, cout, k, groups)
        if epilogue.get("residual_conv"):
            res = self.tensors[epilogue["residual"]]  # type: ignore[index]
            self.conv_params(epilogue["residual_conv"], res.channels, cout, 1)  # type: ignore[arg-type]
        out = self.tensor(out or prefix, cout, size)
        self.ops.append(Op(CONV, out, (x,), prefix, k=k, groups=groups, in_map=in_map,
                           norm=norm, act=epilogue.get("act") or "none",
                           residual=epilogue.get("residual"),
                           residual_conv=epilogue.get("residual_conv"),
                           tbias=epilogue.get("tbias")))
        return out

    def block(self, p: str, x: str, i: int, o: int) -> str:
        """ConvNextBlock(i, o) at prefix p (the spec's four lines)."""
        cfg, m = self.cfg, self.cfg.convnext_mult
        assert self.tensors[x].channels == i, (p, x)
        self.param(p + ".mlp.weight", i, cfg.time_dim)
        self.param(p + ".mlp.bias", i)
        tb = self.tensor(p + ".mlp", i, 0)
        self.time_ops.append(Op(TIME_PROJ, tb, ("temb",), p + ".mlp"))
        h = self.conv(p + ".ds_conv", x, i, 7, groups=i, tbias=tb)
        h = self.conv(p + ".conv1", h, m * o, 3, norm=p + ".norm1", act="gelu")
        return self.conv(p + ".conv2", h, o, 3, norm=p + ".norm2", out=p, residual=x,
                         residual_conv=p + ".res_conv" if i != o else None)

    def gate(self, p: str, use: int, skip: str, x: str) -> str:
        g, r = self.tensors[x].channels, self.tensors[skip].channels
        self.conv_params(p + ".gate_conv", g, g, 1)
        self.conv_params(p + ".residual_conv", r, g, 1)
        self.conv_params(p + ".psi", g, 1, 1)
        out = self.tensor(f"{p}@{use}", r, self.tensors[skip].size)
        self.ops.append(Op(GATE, out, (x, skip), p))
        return out

    def cat(self, name: str, a: str, b: str) -> str:
        ta, tb = self.tensors[a], self.tensors[b]
        assert ta.size == tb.size, (a, b)
        out = self.tensor(name, ta.channels + tb.channels, ta.size)
        self.ops.append(Op(CAT, out, (a, b)))
        return out

    def time_embed(self) -> None:
        cfg = self.cfg
        self.param("time_mlp.0.weight", cfg.time_dim, cfg.dim)
        self.param("time_mlp.0.bias", cfg.time_dim)
        self.param("time_mlp.2.weight", cfg.time_dim, cfg.time_dim)
        self.param("time_mlp.2.bias", cfg.time_dim)
        self.tensor("temb", cfg.time_dim, 0)
        self.time_ops.append(Op(TIME_EMBED, "temb", ("t",), "time_mlp"))


def build_plan(cfg: UNetConfig) -> Plan:
    """The network section of the spec, line by line."""
    b, n_levels = _Builder(cfg), len(cfg.levels)
    b.time_embed()
    b.tensor("x", cfg.channels, cfg.image_size)
    x = b.conv("init_conv", "x", cfg.dim, 7)                  # 7x7, channels -> dim
    r, skips = x, []
    for k, (i, o) in enumerate(cfg.levels):                    # 64, 32, 16, 8
        x = b.block(f"downs.{k}.block1", x, i, i); skips.append(x)
        x = b.block(f"downs.{k}.block2", x, i, i); skips.append(x)
        if k < n_levels - 1:
            x = b.conv(f"downs.{k}.down.conv", x, o, 1, in_map="unshuffle2")
        else:                                                  # last level: 3x3, no resize
            x = b.conv(f"downs.{k}.down.conv", x, o, 3)
    x = b.block("mid.block1", x, cfg.dims[-1], cfg.dims[-1])
    x = b.block("mid.block2", x, cfg.dims[-1], cfg.dims[-1])
    for j, (i, o) in enumerate(reversed(cfg.levels)):          # 8, 16, 32, 64
        for n in (1, 2):                                       # the same gate, the next skip
            g = b.gate(f"ups.{j}.gate", n, skips.pop(), x)
            x = b.block(f"ups.{j}.block{n}", b.cat(f"ups.{j}.cat{n}", x, g), o + i, o)
        if j < n_levels - 1:
            x = b.conv(f"ups.{j}.up.conv", x, i, 3, in_map="up2")
        else:                                                  # last level: 3x3, no resize
            x = b.conv(f"ups.{j}.up.conv", x, i, 3)
    x = b.block("final_block", b.cat("final.cat", x, r), 2 * cfg.dim, cfg.dim)
    b.conv("final_conv", x, cfg.channels, 1, out="eps")
    plan = Plan(cfg, b.tensors, tuple(b.ops), tuple(b.time_ops), b.params)
    if plan.n_params > MAX_PARAMS:
        raise ConfigError(f"config: {plan.n_params:,} parameters (dim, dim_mults, convnext_mult, time_dim) "
                          f"exceed {MAX_PARAMS:,}, more than a Jetson holds")
    return plan


def param_shapes(cfg: UNetConfig) -> "OrderedDict[str, Tuple[int, ...]]":
    return build_plan(cfg).params


def lifetimes(plan: Plan) -> Dict[str, Tuple[int, int]]:
    """Tensor name -> (index of the op that writes it, index of the last op that reads it).

    The input is written at -1; the output lives to the end. Time tensors are left out: they
    are computed ahead for all timesteps, not per call."""
    first: Dict[str, int] = {plan.input: -1}
    last: Dict[str, int] = {plan.input: -1}
    for idx, op in enumerate(plan.ops):
        first.setdefault(op.out, idx)
        last[op.out] = max(last.get(op.out, idx), idx)
        for name in op.reads():
            if plan.tensors[name].size:
                last[name] = idx
    last[plan.output] = len(plan.ops)
    return {n: (first[n], last[n]) for n in first}

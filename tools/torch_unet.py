"""PyTorch twin of `seed-unet` (shared docs/model-spec.md), for training and parity fixtures.

The module tree mirrors the spec's dotted parameter names exactly, so `state_dict()` keys are
the weights-file names (`downs.0.block1.ds_conv.weight`, `ups.2.gate.psi.bias`, ...) and
`jetson_unet.model.plan.param_shapes(config)` gives the same names and shapes. Nothing in jetson_unet
imports this file: torch is a tool dependency only (the `train` extra).

    model = SeedUNet(UNetConfig())                  # ~15.9 M params with the defaults
    eps = model(x, t)                               # x (B, C, H, W), t (B,) integer timesteps
    load_numpy_params(model, weights.params)        # runtime Weights -> torch
    params = export_numpy_params(model)             # torch -> {name: float32 ndarray}
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from jetson_unet.model.config import UNetConfig


def sinusoidal(t: torch.Tensor, dim: int) -> torch.Tensor:
    """[sin(t f), cos(t f)], f_i = exp(-ln(10000) i / (half - 1)); float64, as the spec allows,
    since it depends on t only (the caller casts to the weights' dtype)."""
    half = dim // 2
    i = torch.arange(half, dtype=torch.float64, device=t.device)
    f = torch.exp(-math.log(10000.0) * i / (half - 1))
    arg = t.to(torch.float64)[:, None] * f[None, :]
    return torch.cat([arg.sin(), arg.cos()], dim=1)


class ConvNextBlock(nn.Module):
    """ConvNextBlock(i, o): time bias after the depthwise 7x7, two GroupNorm(1) + 3x3 convs."""

    def __init__(self, i: int, o: int, cfg: UNetConfig) -> None:
        super().__init__()
        m, eps = cfg.convnext_mult, cfg.norm_eps
        self.mlp = nn.Linear(cfg.time_dim, i)
        self.ds_conv = nn.Conv2d(i, i, 7, padding=3, groups=i)
        self.norm1 = nn.GroupNorm(1, i, eps=eps)
        self.conv1 = nn.Conv2d(i, m * o, 3, padding=1)
        self.norm2 = nn.GroupNorm(1, m * o, eps=eps)
        self.conv2 = nn.Conv2d(m * o, o, 3, padding=1)
        # No parameters (and so no state_dict key) when the widths agree, as in the spec.
        self.res_conv = nn.Conv2d(i, o, 1) if i != o else None

    def forward(self, x: torch.Tensor, temb_act: torch.Tensor) -> torch.Tensor:
        # temb_act = gelu(temb), shared by every block of the call
        h = self.ds_conv(x) + self.mlp(temb_act)[:, :, None, None]
        h = F.gelu(self.conv1(self.norm1(h)))
        h = self.conv2(self.norm2(h))
        return h + (self.res_conv(x) if self.res_conv is not None else x)


class Gate(nn.Module):
    """Attention gate: sigmoid(psi(relu(gate_conv(x) + residual_conv(skip)))) * skip."""

    def __init__(self, g: int, r: int) -> None:
        super().__init__()
        self.gate_conv = nn.Conv2d(g, g, 1)
        self.residual_conv = nn.Conv2d(r, g, 1)
        self.psi = nn.Conv2d(g, 1, 1)

    def forward(self, skip: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        a = torch.sigmoid(self.psi(F.relu(self.gate_conv(x) + self.residual_conv(skip))))
        return a * skip  # (B, 1, H, W) broadcast over skip's channels


class Resize(nn.Module):
    """Down (pixel_unshuffle2 + 1x1), Up (nearest x2 + 3x3), or the last level's plain 3x3."""

    def __init__(self, mode: str, cin: int, cout: int) -> None:
        super().__init__()
        self.mode = mode
        cin = 4 * cin if mode == "down" else cin
        k = 1 if mode == "down" else 3
        self.conv = nn.Conv2d(cin, cout, k, padding=k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "down":
            x = F.pixel_unshuffle(x, 2)
        elif self.mode == "up":
            x = F.interpolate(x, scale_factor=2, mode="nearest")
        return self.conv(x)


class Level(nn.Module):
    """One `downs.k` or `ups.j` entry: block1, block2, (gate,) down/up."""

    def __init__(self, blocks: tuple, resize_name: str, resize: Resize, gate: Gate | None = None) -> None:
        super().__init__()
        if gate is not None:
            self.gate = gate
        self.block1, self.block2 = blocks
        setattr(self, resize_name, resize)


class Mid(nn.Module):
    def __init__(self, d: int, cfg: UNetConfig) -> None:
        super().__init__()
        self.block1 = ConvNextBlock(d, d, cfg)
        self.block2 = ConvNextBlock(d, d, cfg)


class SeedUNet(nn.Module):
    def __init__(self, cfg: UNetConfig) -> None:
        super().__init__()
        self.config = cfg
        levels, n = cfg.levels, len(cfg.levels)
        self.init_conv = nn.Conv2d(cfg.channels, cfg.dim, 7, padding=3)
        self.time_mlp = nn.Sequential(nn.Linear(cfg.dim, cfg.time_dim), nn.GELU(),
                                      nn.Linear(cfg.time_dim, cfg.time_dim))
        self.downs = nn.ModuleList(
            Level((ConvNextBlock(i, i, cfg), ConvNextBlock(i, i, cfg)), "down",
                  Resize("down" if k < n - 1 else "same", i, o))
            for k, (i, o) in enumerate(levels))
        self.mid = Mid(cfg.dims[-1], cfg)
        self.ups = nn.ModuleList(
            Level((ConvNextBlock(o + i, o, cfg), ConvNextBlock(o + i, o, cfg)), "up",
                  Resize("up" if j < n - 1 else "same", o, i), gate=Gate(o, i))
            for j, (i, o) in enumerate(reversed(levels)))
        self.final_block = ConvNextBlock(2 * cfg.dim, cfg.dim, cfg)
        self.final_conv = nn.Conv2d(cfg.dim, cfg.channels, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        e = sinusoidal(t, self.config.dim).to(self.init_conv.weight.dtype)
        temb_act = F.gelu(self.time_mlp(e))              # (B, time_dim), what every P.mlp reads
        x = self.init_conv(x)                            # (B, dim, H, W)
        r, skips = x, []
        for lvl in self.downs:
            x = lvl.block1(x, temb_act); skips.append(x)
            x = lvl.block2(x, temb_act); skips.append(x)
            x = lvl.down(x)                              # (B, o, H/2, W/2), last level: (B, o, H, W)
        x = self.mid.block1(x, temb_act)
        x = self.mid.block2(x, temb_act)
        for lvl in self.ups:
            x = lvl.block1(torch.cat([x, lvl.gate(skips.pop(), x)], 1), temb_act)  # (B, o, ...)
            x = lvl.block2(torch.cat([x, lvl.gate(skips.pop(), x)], 1), temb_act)
            x = lvl.up(x)                                # (B, i, 2H, 2W), last level: no resize
        x = self.final_block(torch.cat([x, r], 1), temb_act)
        return self.final_conv(x)                        # (B, channels, H, W): predicted eps


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def load_numpy_params(model: SeedUNet, params: dict) -> None:
    """Copy {name: ndarray} into the model (cast to its dtype); names must match exactly."""
    state = model.state_dict()
    missing, extra = sorted(set(state) - set(params)), sorted(set(params) - set(state))
    if missing or extra:
        raise KeyError(f"parameter names differ: missing {missing[:3]}, unexpected {extra[:3]}")
    with torch.no_grad():
        for name, tensor in state.items():
            src = torch.from_numpy(np.ascontiguousarray(params[name]))
            if tuple(src.shape) != tuple(tensor.shape):
                raise ValueError(f"{name}: shape {tuple(src.shape)} != model's {tuple(tensor.shape)}")
            tensor.copy_(src.to(tensor.dtype))


def export_numpy_params(model: nn.Module) -> dict:
    """{name: float32 ndarray} in state_dict order (the input of jetson_unet.model.weights.save_weights)."""
    return {k: v.detach().to("cpu", torch.float32).numpy().copy() for k, v in model.state_dict().items()}


if __name__ == "__main__":
    from jetson_unet.model.plan import param_shapes

    cfg = UNetConfig()
    model = SeedUNet(cfg)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    expected = {k: tuple(v) for k, v in param_shapes(cfg).items()}
    assert shapes == expected, sorted(set(shapes.items()) ^ set(expected.items()))[:5]
    print(f"seed-unet: {n_params(model):,} parameters, {len(shapes)} tensors; names match jetson_unet.model.plan")

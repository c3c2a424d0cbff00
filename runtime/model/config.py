"""Model config of `seed-unet` (see shared docs/model-spec.md): frozen, JSON round trip."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, Tuple

from jetson_unet.errors import ConfigError

ARCH = "seed-unet"


@dataclass(frozen=True)
class Schedule:
    kind: str = "linear"
    timesteps: int = 100          # T
    beta_start: float = 1e-4      # scaled by 1000/T, as in the spec
    beta_end: float = 0.02

    def __post_init__(self) -> None:
        if self.kind != "linear":
            raise ConfigError(f"schedule.kind {self.kind!r} is not supported (only 'linear')")
        if type(self.timesteps) is not int or self.timesteps < 2:
            raise ConfigError(f"schedule.timesteps must be an integer >= 2, got {self.timesteps!r}")
        if not 0.0 < self.beta_start < self.beta_end:
            raise ConfigError(f"schedule needs 0 < beta_start < beta_end, got {self.beta_start}, {self.beta_end}")
        if self.beta_end * 1000.0 / self.timesteps >= 1.0:
            raise ConfigError("schedule: the largest scaled beta must be < 1")


@dataclass(frozen=True)
class UNetConfig:
    arch: str = ARCH
    image_size: int = 64
    channels: int = 3
    dim: int = 32
    dim_mults: Tuple[int, ...] = (1, 2, 4, 8)
    convnext_mult: int = 2
    time_dim: int = 128
    norm_eps: float = 1e-5
    schedule: Schedule = field(default_factory=Schedule)

    def __post_init__(self) -> None:
        # Accept lists from JSON but store tuples so the config stays hashable.
        if isinstance(self.dim_mults, (str, bytes)) or not hasattr(self.dim_mults, "__iter__"):
            raise ConfigError(f"dim_mults must be a list of integers, got {self.dim_mults!r}")
        if any(type(m) is not int for m in self.dim_mults):
            raise ConfigError(f"dim_mults must be integers, got {list(self.dim_mults)}")
        object.__setattr__(self, "dim_mults", tuple(self.dim_mults))
        if self.arch != ARCH:
            raise ConfigError(f"arch {self.arch!r} is not supported (only {ARCH!r})")
        for name in ("image_size", "channels", "dim", "convnext_mult", "time_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if len(self.dim_mults) < 1 or min(self.dim_mults) < 1:
            raise ConfigError(f"dim_mults must be positive integers, got {list(self.dim_mults)}")
        if self.dim % 2 or self.dim < 4:
            raise ConfigError(f"dim must be even and >= 4 (sinusoidal embedding), got {self.dim}")
        factor = 2 ** (len(self.dim_mults) - 1)
        if self.image_size % factor:
            raise ConfigError(f"image_size {self.image_size} must be divisible by {factor}")
        if not self.norm_eps > 0:
            raise ConfigError(f"norm_eps must be > 0, got {self.norm_eps}")

    @property
    def dims(self) -> Tuple[int, ...]:
        """[dim] + [dim * m for m in dim_mults]."""
        return (self.dim,) + tuple(self.dim * m for m in self.dim_mults)

    @property
    def levels(self) -> Tuple[Tuple[int, int], ...]:
        d = self.dims
        return tuple(zip(d[:-1], d[1:]))

    @property
    def timesteps(self) -> int:
        return self.schedule.timesteps

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["dim_mults"] = list(self.dim_mults)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "UNetConfig":
        if not isinstance(d, dict):
            raise ConfigError(f"config must be a JSON object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown config field(s): {', '.join(unknown)}")
        d = dict(d)
        sched = d.pop("schedule", {})
        if not isinstance(sched, dict):
            raise ConfigError("config.schedule must be a JSON object")
        s_known = {f.name for f in fields(Schedule)}
        s_unknown = sorted(set(sched) - s_known)
        if s_unknown:
            raise ConfigError(f"unknown schedule field(s): {', '.join(s_unknown)}")
        try:
            return cls(schedule=Schedule(**sched), **d)
        except TypeError as e:  # wrong value types reach the dataclass constructor
            raise ConfigError(f"invalid config: {e}") from None

    @classmethod
    def from_json(cls, text: str) -> "UNetConfig":
        try:
            d = json.loads(text)
        except ValueError as e:
            raise ConfigError(f"config is not valid JSON: {e}") from None
        return cls.from_dict(d)

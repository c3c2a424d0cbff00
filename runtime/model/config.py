"""Model config of `seed-unet` (see shared docs/model-spec.md): frozen, JSON round trip.

Every field is bounded (`BOUNDS`, each range with its reason): generous for any model a Jetson
samples, tight enough that a corrupt or hostile config is refused here, with one `ConfigError`
naming the field, its value and the range, never later as a MemoryError or an overflow.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, Tuple

from jetson_unet.errors import ConfigError

ARCH = "seed-unet"

# field: (lowest, highest, why). The numbers are inclusive; real numbers are checked as floats.
BOUNDS: Dict[str, Tuple[float, float, str]] = {
    "image_size": (1, 1024, "H = W; one 1024 x 1024 map of 32 channels is already 128 MiB in float32"),
    "channels": (1, 16, "gray, RGB, RGBA or a latent of up to 16 channels"),
    "dim": (4, 512, "the base width, also the sinusoidal embedding's (even, so >= 4); the spec's is 32"),
    "len(dim_mults)": (1, 6, "levels; 6 levels halve the image 5 times, to 1/32"),
    "dim_mults[i]": (1, 16, "a level's width as a multiple of dim"),
    "convnext_mult": (1, 8, "hidden width factor of a ConvNeXt block; the spec's is 2"),
    "time_dim": (1, 4096, "width of the time embedding; the spec's is 4 * dim"),
    "norm_eps": (1e-12, 0.1, "added to a variance: > 0 so a constant map does not divide by zero, "
                             "small against the variance of O(1) activations"),
    "schedule.timesteps": (2, 10000, "T; DDPM used 1000, and every step costs memory in the schedule tables"),
    "schedule.beta_start": (1e-6, 0.1, "noise of the first step, before the 1000/T scaling; the spec's is 1e-4"),
    "schedule.beta_end": (1e-5, 1.0, "noise of the last step, before the 1000/T scaling; the spec's is 0.02"),
}
# Derived from the fields, checked by the plan that counts them: the parameter count (an SD-1.5-sized
# U-Net has 0.86e9; more than this is 4 GB of float32 weights, beyond any Jetson's memory).
MAX_PARAMS = 1_000_000_000


def check_bound(key: str, value: Any, integer: bool = True, name: str = "") -> None:
    """Raise ConfigError unless `value` is an integer (or a real number) within BOUNDS[key]."""
    lo, hi, why = BOUNDS[key]
    name = name or key
    number = type(value) is int or (not integer and type(value) is float)
    if not number or not lo <= value <= hi:
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"config: {name} = {value!r} is out of range: must be {kind} in [{lo:g}, {hi:g}] ({why})")


@dataclass(frozen=True)
class Schedule:
    kind: str = "linear"
    timesteps: int = 100          # T
    beta_start: float = 1e-4      # scaled by 1000/T, as in the spec
    beta_end: float = 0.02

    def __post_init__(self) -> None:
        if self.kind != "linear":
            raise ConfigError(f"config: schedule.kind = {self.kind!r} is not supported (only 'linear')")
        check_bound("schedule.timesteps", self.timesteps)
        check_bound("schedule.beta_start", self.beta_start, integer=False)
        check_bound("schedule.beta_end", self.beta_end, integer=False)
        if not self.beta_start < self.beta_end:
            raise ConfigError(f"config: schedule needs beta_start < beta_end, got {self.beta_start}, {self.beta_end}")
        if self.beta_end * 1000.0 / self.timesteps >= 1.0:
            raise ConfigError(f"config: schedule.beta_end = {self.beta_end} scaled by 1000/T (T = {self.timesteps}) "
                              "must stay < 1 (alpha > 0)")


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
        if self.arch != ARCH:
            raise ConfigError(f"config: arch = {self.arch!r} is not supported (only {ARCH!r})")
        if not isinstance(self.schedule, Schedule):
            raise ConfigError(f"config: schedule must be a Schedule, got {type(self.schedule).__name__}")
        if not isinstance(self.dim_mults, (list, tuple)):
            raise ConfigError(f"config: dim_mults must be a list of integers, got {self.dim_mults!r}")
        # Accept lists from JSON but store tuples so the config stays hashable.
        object.__setattr__(self, "dim_mults", tuple(self.dim_mults))
        check_bound("len(dim_mults)", len(self.dim_mults))
        for i, m in enumerate(self.dim_mults):
            check_bound("dim_mults[i]", m, name=f"dim_mults[{i}]")
        for name in ("image_size", "channels", "dim", "convnext_mult", "time_dim"):
            check_bound(name, getattr(self, name))
        check_bound("norm_eps", self.norm_eps, integer=False)
        if self.dim % 2:
            raise ConfigError(f"config: dim = {self.dim} must be even (sinusoidal embedding)")
        factor = 2 ** (len(self.dim_mults) - 1)
        if self.image_size % factor:
            raise ConfigError(f"config: image_size = {self.image_size} must be a multiple of {factor} "
                              f"(halved {len(self.dim_mults) - 1} times)")

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
        return cls(schedule=Schedule(**sched), **d)

    @classmethod
    def from_json(cls, text: str) -> "UNetConfig":
        try:
            d = json.loads(text)
        except ValueError as e:
            raise ConfigError(f"config is not valid JSON: {e}") from None
        return cls.from_dict(d)

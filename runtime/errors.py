"""Typed errors of the runtime. Only the CLIs turn them into exit codes and one-line messages;
notices (a fallback taken, a caveat) go to the `jetson_unet` logger instead."""
from __future__ import annotations


class RuntimeErrorBase(Exception):
    """Base of every expected failure (bad input, missing GPU, ...): the CLI prints one line."""

    def __reduce__(self):
        # Pickled as its message and attributes, rebuilt without __init__ (the subclasses take other
        # arguments than the message): an error raised in a worker process (the benchmarks' fresh
        # process per row) then reaches the parent as itself, not as a BrokenProcessPool.
        return _rebuild, (type(self), self.args, self.__dict__)


def _rebuild(cls: type, args: tuple, state: dict) -> "RuntimeErrorBase":
    e = cls.__new__(cls)
    e.args = args
    e.__dict__.update(state)
    return e


class ConfigError(RuntimeErrorBase, ValueError):
    """A model config that does not describe a valid seed-unet."""


class WeightsError(RuntimeErrorBase):
    """A weights file that cannot be used. `path` and `tensor` name what is wrong."""

    def __init__(self, path: object, message: str, tensor: str | None = None) -> None:
        self.path = str(path)
        self.tensor = tensor
        where = f"{self.path}: tensor {tensor!r}: " if tensor else f"{self.path}: "
        super().__init__(where + message)


class WeightsFileError(WeightsError):
    """Unreadable, truncated, or not a .safetensors or .npz weights file."""


class WeightsFormatError(WeightsError):
    """Manifest missing or of another format version, or a bad config inside."""


class WeightsNameError(WeightsError):
    """Missing or unexpected parameter names."""


class WeightsShapeError(WeightsError):
    """A parameter whose shape disagrees with the config."""


class WeightsDtypeError(WeightsError):
    """A parameter whose dtype disagrees with the manifest."""


class WeightsValueError(WeightsError):
    """NaN or Inf in a parameter."""


class WeightsHashError(WeightsError):
    """Content hash in the manifest does not match the tensors."""


class UsageError(RuntimeErrorBase):
    """A bad argument combination the CLI reports with exit code 2."""


class BackendUnavailable(RuntimeErrorBase):
    """The requested backend cannot run here (no GPU, no CuPy, no driver)."""


class KernelCompileError(RuntimeErrorBase):
    """NVRTC/nvcc failed: carries the kernel file, the options and the compiler log."""

    def __init__(self, source: str, options: object, log: str) -> None:
        self.source, self.options, self.log = source, options, log
        super().__init__(f"compiling {source} failed (options {options}):\n{log}")


class ArenaError(RuntimeErrorBase):
    """The activation arena cannot be planned or does not fit."""


class NoiseUnsupported(RuntimeErrorBase):
    """This NumPy's normal stream is not the one the device generator reproduces (host noise instead)."""


class Cancelled(RuntimeErrorBase):
    """Sampling stopped by a callback or Ctrl-C."""

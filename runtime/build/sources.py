"""The module text: CUDA sources of `kernels/` + a generated instantiation list.

Sources are read from the kernels folder (`jetson_unet.kernels` package data, or ./kernels in a
checkout) and inlined into one source text (the shared header has include guards), so a cache keyed by
the source text can never serve a stale binary after a kernel file changes. Every module of a process
is compiled with the same options tuple. Templates are instantiated through `extern "C"` wrappers:
their symbols are plain names such as `conv3x3s1u1_f16_64x64_2x2_v8`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Optional, Sequence, Tuple

from jetson_unet.paths import kernels_dir
from jetson_unet.errors import KernelCompileError


SOURCES = ("common.cuh", "conv.cu", "gate.cu", "dwconv.cu", "io.cu", "noise.cu")
PIPE_SOURCE = "conv_pipe.cu"   # after conv.cu, only in modules with a cp.async conv (ConvKey.stages)
HALO_SOURCE = "conv_halo.cu"   # after conv_pipe.cu, only in modules with a halo conv (ConvKey.halo)
MIN_TC_ARCH = 80   # mma.sync.m16n8k16 with bf16 and the cvt.*.bf16 conversions need sm_80+


def read_sources(folder: Optional[Path] = None, names: Sequence[str] = SOURCES) -> str:
    folder = Path(folder) if folder else kernels_dir()
    parts = []
    for name in names:
        path = folder / name
        try:
            text = path.read_text()
        except OSError as e:
            raise KernelCompileError(str(path), (), f"cannot read kernel source: {e}") from None
        parts.append(f"// ==== {name} ====\n{text}")
    return "\n".join(parts)


def module_source(keys: Iterable[Any], folder: Optional[Path] = None) -> str:
    """All kernel sources, then one instantiation line per key (sorted: a stable cache key).
    conv_pipe.cu (and conv_halo.cu, which builds on it) join only a module that instantiates them."""
    keys = list(keys)
    names = SOURCES
    if any(getattr(k, "stages", 0) for k in keys):
        at = SOURCES.index("conv.cu") + 1
        extra = (PIPE_SOURCE, HALO_SOURCE) if any(getattr(k, "halo", False) for k in keys) else (PIPE_SOURCE,)
        names = SOURCES[:at] + extra + SOURCES[at:]
    lines = sorted({k.instance() for k in keys})
    return read_sources(folder, names) + "\n// ==== instantiations (generated) ====\n" + "\n".join(lines) + "\n"


def nvrtc_options(arch: int, folder: Optional[Path] = None) -> Tuple[str, ...]:
    """The one options tuple of every module of the process. CuPy adds `-arch=sm_XX` of the
    current device itself (NVRTC accepts the same target named twice); we name it too so a second
    backend (pycuda) gets the same build and the tuple says what it targets."""
    folder = Path(folder) if folder else kernels_dir()
    return (f"--gpu-architecture=sm_{int(arch)}", "-std=c++17", f"-I{folder}")

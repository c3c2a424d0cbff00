"""The ONE kernel loader: CUDA sources of `kernels/` + a generated instantiation list -> a module.

Sources are read from the kernels folder (`runtime.kernels` package data, or ./kernels in a
checkout) and inlined into one source text (the shared header has include guards), so the CuPy
disk cache, keyed by the source text, can never serve a stale binary after a kernel file changes.
Every module of a process is compiled with the same options tuple (NVRTC runs once per distinct
tuple even on a cache hit). Templates are instantiated through `extern "C"` wrappers: their
symbols are plain names such as `conv3x3s1u1_f16_64x64_2x2_v8`, cached on every CuPy version.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from .. import kernels_dir
from ..errors import KernelCompileError

SOURCES = ("common.cuh", "conv.cu", "dwconv.cu", "io.cu", "sample.cu")
DTYPES = {"fp32": ("F32", "f32"), "fp16": ("F16", "f16"), "bf16": ("BF16", "bf16")}
MIN_TC_ARCH = 80   # mma.sync.m16n8k16 with bf16 and the cvt.*.bf16 conversions need sm_80+


@dataclass(frozen=True)
class ConvKey:
    """One instantiation of conv_gemm (kernels/conv.cu)."""
    dtype: str      # "fp32" | "fp16" | "bf16"
    bm: int
    bn: int
    bk: int
    wm: int
    wn: int
    kh: int
    stride: int
    up: int
    vec: int
    gate: bool

    @property
    def symbol(self) -> str:
        kind = "gate" if self.gate else f"conv{self.kh}x{self.kh}s{self.stride}u{self.up}"
        return (f"{kind}_{DTYPES[self.dtype][1]}_{self.bm}x{self.bn}x{self.bk}_{self.wm}x{self.wn}_v{self.vec}")

    @property
    def threads(self) -> int:
        return 32 * self.wm * self.wn

    def instance(self) -> str:
        return (f"CONV_INSTANCE({self.symbol}, {DTYPES[self.dtype][0]}, {self.bm}, {self.bn}, {self.bk}, "
                f"{self.wm}, {self.wn}, {self.kh}, {self.stride}, {self.up}, {self.vec}, "
                f"{'true' if self.gate else 'false'})")


@dataclass(frozen=True)
class SimpleKey:
    """dwconv / init_conv / final_conv instantiations: (kind, dtype, k)."""
    kind: str       # "dwconv" | "init" | "final"
    dtype: str
    k: int = 0

    @property
    def symbol(self) -> str:
        dt = DTYPES[self.dtype][1]
        return {"dwconv": f"dwconv{self.k}_{dt}", "init": f"init_conv{self.k}_{dt}",
                "final": f"final_conv_{dt}"}[self.kind]

    def instance(self) -> str:
        d = DTYPES[self.dtype][0]
        if self.kind == "dwconv":
            return f"DW_INSTANCE({self.symbol}, {d}, {self.k})"
        if self.kind == "init":
            return f"INIT_INSTANCE({self.symbol}, {d}, {self.k})"
        return f"FINAL_INSTANCE({self.symbol}, {d})"


def read_sources(folder: Optional[Path] = None) -> str:
    folder = Path(folder) if folder else kernels_dir()
    parts = []
    for name in SOURCES:
        path = folder / name
        try:
            text = path.read_text()
        except OSError as e:
            raise KernelCompileError(str(path), (), f"cannot read kernel source: {e}") from None
        parts.append(f"// ==== {name} ====\n{text}")
    return "\n".join(parts)


def module_source(keys: Iterable[Any], folder: Optional[Path] = None) -> str:
    """All kernel sources, then one instantiation line per key (sorted: a stable cache key)."""
    lines = sorted({k.instance() for k in keys})
    return read_sources(folder) + "\n// ==== instantiations (generated) ====\n" + "\n".join(lines) + "\n"


def toolkit_include() -> Optional[str]:
    """`<toolkit>/include` if a CUDA toolkit is installed; our kernels include no CUDA header, so
    this is only a convenience for NVRTC builds that want the toolkit's headers."""
    for env in ("CUDA_PATH", "CUDA_HOME"):
        root = os.environ.get(env)
        if root and (Path(root) / "include" / "cuda.h").is_file():
            return str(Path(root) / "include")
    default = Path("/usr/local/cuda/include")
    return str(default) if (default / "cuda.h").is_file() else None


def nvrtc_options(arch: int, folder: Optional[Path] = None) -> Tuple[str, ...]:
    """The one options tuple of every module of the process. CuPy adds `-arch=sm_XX` of the
    current device itself (NVRTC accepts the same target named twice); we name it too so a second
    backend (pycuda) gets the same build and the tuple says what it targets."""
    folder = Path(folder) if folder else kernels_dir()
    opts = [f"--gpu-architecture=sm_{int(arch)}", "-std=c++17", f"-I{folder}"]
    inc = toolkit_include()
    if inc:
        opts.append(f"-I{inc}")
    return tuple(opts)


class KernelSet:
    """Compiles one module with every requested instantiation and fetches every function now
    (before any CUDA-graph capture)."""

    _cache: Dict[Tuple[str, Tuple[str, ...]], Any] = {}

    def __init__(self, backend: Any, keys: Sequence[Any], name: str = "seed-unet") -> None:
        arch = int(backend.arch())
        if any(getattr(k, "dtype", "fp32") != "fp32" for k in keys) and arch < MIN_TC_ARCH:
            raise KernelCompileError(name, (), f"fp16/bf16 kernels need sm_80 or newer; this GPU is sm_{arch}")
        self.options = nvrtc_options(arch)
        self.source = module_source(keys)
        self.symbols: List[str] = sorted({k.symbol for k in keys})
        ck = (getattr(backend, "name", type(backend).__name__), self.source, self.options)   # per backend
        mod = KernelSet._cache.get(ck)
        if mod is None:
            mod = backend.compile(self.source, f"{name}.cu", self.options, self.symbols)
            KernelSet._cache[ck] = mod
        self.module = mod
        self.functions = {s: mod.get(s) for s in self.symbols}

    def __getitem__(self, symbol: str) -> Any:
        return self.functions[symbol]

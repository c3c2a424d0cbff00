"""The ONE kernel loader: CUDA sources of `kernels/` + a generated instantiation list -> a module.

Sources are read from the kernels folder (`runtime.kernels` package data, or ./kernels in a
checkout) and inlined into one source text (the shared header has include guards), so the CuPy
disk cache, keyed by the source text, can never serve a stale binary after a kernel file changes.
Every module of a process is compiled with the same options tuple (NVRTC runs once per distinct
tuple even on a cache hit). Templates are instantiated through `extern "C"` wrappers: their
symbols are plain names such as `conv3x3s1u1_f16_64x64_2x2_v8`, cached on every CuPy version.

Loading (`load_module`): a backend with `load_cubin` (CuPy) first looks in the cubin cache
(runtime.gpu.cubins: validated entries of this toolchain, then of any toolchain, e.g. made ahead of
time by `jetson-sample --prepare`), else compiles with NVRTC, stores the cubin and loads it; a
backend without it (pycuda: its own nvcc cubin cache; the test fakes) compiles its own way.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from .. import kernels_dir
from ..errors import KernelCompileError
from .cubins import CubinCache

SOURCES = ("common.cuh", "conv.cu", "dwconv.cu", "io.cu", "noise.cu")
PIPE_SOURCE = "conv_pipe.cu"   # after conv.cu, only in modules with a cp.async conv (ConvKey.stages)
HALO_SOURCE = "conv_halo.cu"   # after conv_pipe.cu, only in modules with a halo conv (ConvKey.halo)
DTYPES = {"fp32": ("F32", "f32"), "fp16": ("F16", "f16"), "bf16": ("BF16", "bf16")}
MIN_TC_ARCH = 80   # mma.sync.m16n8k16 with bf16 and the cvt.*.bf16 conversions need sm_80+


@dataclass(frozen=True)
class ConvKey:
    """One instantiation of conv_gemm (kernels/conv.cu), or with stages > 0 of conv_gemm_pipe
    (kernels/conv_pipe.cu, a cp.async ring of `stages` k-tiles; the default for 16-bit convs, see
    ops.stages_from_env), or with halo of conv_gemm_halo (kernels/conv_halo.cu: 3x3 stride 1, the
    input staged once per channel chunk as a halo tile, `stages` slots of weights in flight). ks > 1
    (the cp.async conv only): each warp tile shared by ks warps, each taking every ks-th k step.
    persist (the cp.async conv only): a CTA runs several M tiles (ops.TileChoice.mt)."""
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
    stages: int = 0   # 0: conv_gemm (register-staged double buffering)
    halo: bool = False
    ks: int = 1       # k slices of the cp.async conv: KS warps per warp tile (kernels/conv_pipe.cu)
    nsplit: bool = False   # a gate whose N is split over CTAs (BN < N; kernels/conv.cu conv_finish)
    fold: bool = False     # GroupNorm folded into the GEMM (cp.async / halo convs; ops.fold_norm)
    persist: bool = False  # several M tiles per CTA (kernels/conv_pipe.cu PERSIST)

    @property
    def symbol(self) -> str:
        kind = ("gaten" if self.nsplit else "gate") if self.gate else f"conv{self.kh}x{self.kh}s{self.stride}u{self.up}"
        return (f"{kind}_{DTYPES[self.dtype][1]}_{self.bm}x{self.bn}x{self.bk}_{self.wm}x{self.wn}_v{self.vec}"
                + (f"_{'h' if self.halo else 's'}{self.stages}" if self.stages else "")
                + (f"_k{self.ks}" if self.ks != 1 else "") + ("_f" if self.fold else "")
                + ("_p" if self.persist else ""))

    @property
    def threads(self) -> int:
        return 32 * self.wm * self.wn * self.ks

    def instance(self) -> str:
        if self.halo:
            return (f"CONV_HALO_INSTANCE({self.symbol}, {DTYPES[self.dtype][0]}, {self.bm}, {self.bn}, {self.bk}, "
                    f"{self.wm}, {self.wn}, {self.up}, {self.stages}, {int(self.fold)})")
        macro, tail = (("CONV_PIPE_INSTANCE", f", {self.stages}, {self.ks}, {int(self.fold)}, {int(self.persist)}")
                       if self.stages else ("CONV_INSTANCE", ""))
        return (f"{macro}({self.symbol}, {DTYPES[self.dtype][0]}, {self.bm}, {self.bn}, {self.bk}, "
                f"{self.wm}, {self.wn}, {self.kh}, {self.stride}, {self.up}, {self.vec}, "
                f"{(2 if self.nsplit else 1) if self.gate else 0}{tail})")


@dataclass(frozen=True)
class SimpleKey:
    """dwconv / init_conv / init_conv_tc / final_conv instantiations: (kind, dtype, k, n, tw, cp)."""
    kind: str       # "dwconv" | "dwconv_tc" | "init" | "init_tc" | "final"
    dtype: str
    k: int = 0
    n: int = 1      # dwconv / final: elements per vector load; init, init_tc: input (image) channels
    tw: int = 8     # dwconv / init: the tile's width (ops.dwconv_tw, ops.init_tw)
    cp: int = 1     # dwconv: channels per thread (ops.dwconv_cp); dwconv_tc: per warp (ops.dwconv_tc_cpw)

    @property
    def symbol(self) -> str:
        dt, w = DTYPES[self.dtype][1], (f"_w{self.tw}" if self.tw != 8 else "")
        return {"dwconv": f"dwconv{self.k}_{dt}_v{self.n}{w}" + (f"_p{self.cp}" if self.cp != 1 else ""),
                "dwconv_tc": f"dwconv{self.k}_{dt}_tc{self.cp}",
                "init": f"init_conv{self.k}_c{self.n}_{dt}{w}",
                "init_tc": f"init_conv{self.k}_c{self.n}_{dt}_tc",
                "final": f"final_conv_{dt}" + (f"_v{self.n}" if self.n != 1 else "")}[self.kind]

    def instance(self) -> str:
        d = DTYPES[self.dtype][0]
        if self.kind == "dwconv":
            return f"DW_INSTANCE({self.symbol}, {d}, {self.k}, {self.n}, {self.tw}, {self.cp})"
        if self.kind == "dwconv_tc":
            return f"DW_TC_INSTANCE({self.symbol}, {d}, {self.k}, {self.cp})"
        if self.kind == "init":
            return f"INIT_INSTANCE({self.symbol}, {d}, {self.k}, {self.n}, {self.tw})"
        if self.kind == "init_tc":
            return f"INIT_TC_INSTANCE({self.symbol}, {d}, {self.k}, {self.n})"
        return f"FINAL_INSTANCE({self.symbol}, {d}, {self.n})"


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


def module_source(keys: Iterable[Any], folder: Optional[Path] = None, pdl: bool = False) -> str:
    """All kernel sources, then one instantiation line per key (sorted: a stable cache key).
    conv_pipe.cu (and conv_halo.cu, which builds on it) join only a module that instantiates them.
    pdl: define JETSON_UNET_PDL first, so every kernel opens with GRID_DEPENDENCY (kernels/common.cuh,
    sm_90+; runtime.gpu.launch_ex); without it GRID_DEPENDENCY compiles to nothing."""
    keys = list(keys)
    names = SOURCES
    if any(getattr(k, "stages", 0) for k in keys):
        at = SOURCES.index("conv.cu") + 1
        extra = (PIPE_SOURCE, HALO_SOURCE) if any(getattr(k, "halo", False) for k in keys) else (PIPE_SOURCE,)
        names = SOURCES[:at] + extra + SOURCES[at:]
    lines = sorted({k.instance() for k in keys})
    head = "#define JETSON_UNET_PDL 1\n" if pdl else ""
    return head + read_sources(folder, names) + "\n// ==== instantiations (generated) ====\n" + "\n".join(lines) + "\n"


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


_notice: Optional[Callable[[str], None]] = None   # set by the CLI: one line on stderr


def set_compile_notice(fn: Optional[Callable[[str], None]]) -> Optional[Callable[[str], None]]:
    """Where `load_module` says that it compiles or discards a cached cubin; returns the previous."""
    global _notice
    prev, _notice = _notice, fn
    return prev


def notice(msg: str) -> None:
    """One line through the CLI's hook (set_compile_notice); nothing without one: the API stays quiet."""
    if _notice is not None:
        _notice(msg)


def compile_notice(arch: int) -> str:
    return (f"compiling GPU kernels for sm_{arch} (first run; `jetson-sample --prepare` does this "
            "ahead of time)...")


def load_module(backend: Any, source: str, name: str, options: Tuple[str, ...], symbols: Sequence[str],
                arch: int, cache: Optional[CubinCache] = None) -> Any:
    """A module with every symbol fetched: a valid cached cubin (this toolchain's, else any other's),
    else NVRTC now -> cache -> load. A cubin the driver refuses is discarded and rebuilt."""
    if not hasattr(backend, "load_cubin"):
        return backend.compile(source, f"{name}.cu", options, symbols)
    cache = cache if cache is not None else CubinCache(notice=_notice)
    toolchain = backend.toolchain()
    for entry in cache.find(source, options, arch, toolchain, symbols, name):
        try:
            return backend.load_cubin(entry.cubin, symbols)
        except KernelCompileError as e:
            cache.discard(entry.cubin, f"the driver refused it ({(e.log or str(e)).strip().splitlines()[0]})")
    notice(compile_notice(arch))
    cubin = backend.compile_cubin(source, f"{name}.cu", options, arch) if toolchain else None
    if cubin is None:   # this CuPy cannot hand out a cubin: its own compile path (and disk cache)
        return backend.compile(source, f"{name}.cu", options, symbols)
    try:
        path = cache.store(cubin, source, options, arch, toolchain, symbols, name)
    except OSError:     # an unwritable cache costs a compile next time, nothing else
        with tempfile.TemporaryDirectory(prefix="jetson-unet-") as tmp:
            path = Path(tmp) / f"{name}.cubin"
            path.write_bytes(cubin)
            return backend.load_cubin(path, symbols)
    return backend.load_cubin(path, symbols)


class KernelSet:
    """Loads (or compiles) one module with every requested instantiation and fetches every function
    now (before any CUDA-graph capture)."""

    _cache: Dict[Tuple[str, str, Tuple[str, ...]], Any] = {}

    def __init__(self, backend: Any, keys: Sequence[Any], name: str = "seed-unet",
                 cache: Optional[CubinCache] = None, pdl: bool = False) -> None:
        arch = int(backend.arch())
        if any(getattr(k, "dtype", "fp32") != "fp32" for k in keys) and arch < MIN_TC_ARCH:
            raise KernelCompileError(name, (), f"fp16/bf16 kernels need sm_80 or newer; this GPU is sm_{arch}")
        self.options = nvrtc_options(arch)
        self.source = module_source(keys, pdl=pdl)
        self.symbols: List[str] = sorted({k.symbol for k in keys})
        ck = (getattr(backend, "name", type(backend).__name__), self.source, self.options)   # per backend
        mod = KernelSet._cache.get(ck)
        if mod is None:
            mod = load_module(backend, self.source, name, self.options, self.symbols, arch, cache)
            KernelSet._cache[ck] = mod
        self.module = mod
        self.functions = {s: mod.get(s) for s in self.symbols}

    def __getitem__(self, symbol: str) -> Any:
        return self.functions[symbol]

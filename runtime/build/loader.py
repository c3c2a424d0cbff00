"""The ONE kernel loader: module text -> a loaded module with every symbol fetched.

`load_module` looks in the cubin cache first (jetson_unet.build.cache: validated entries of this
toolchain, then of any toolchain, e.g. made ahead of time by `jetson-sample --prepare`), else compiles
with the backend's compiler (jetson_unet.build.compilers), stores the cubin and loads it: one cache for
both backends.
"""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from jetson_unet.build.sources import MIN_TC_ARCH, module_source, nvrtc_options
from jetson_unet.errors import KernelCompileError
from jetson_unet.backends.base import Backend, Module
from jetson_unet.build.cache import CubinCache
from jetson_unet.build.compilers import Compiler, runtime_compiler


log = logging.getLogger(__name__)


def compile_notice(arch: int) -> str:
    return (f"compiling GPU kernels for sm_{arch} (first run; `jetson-sample --prepare` does this "
            "ahead of time)...")


def load_module(backend: Backend, source: str, name: str, options: Tuple[str, ...], symbols: Sequence[str],
                arch: int, cache: Optional[CubinCache] = None, compiler: Optional[Compiler] = None) -> Module:
    """A module with every symbol fetched: a valid cached cubin (this toolchain's, else any other's),
    else one built now by the backend's compiler (`compiler` overrides it), stored, loaded. A cubin
    the driver refuses is discarded and rebuilt. A backend without cubins (compiler None), or with no
    compiler for this arch here, compiles through its own compile_source."""
    if backend.compiler is None:
        return backend.compile_source(source, f"{name}.cu", options, symbols)
    compiler = compiler or runtime_compiler(backend.compiler)
    cache = cache if cache is not None else CubinCache()
    for entry in cache.find(source, options, arch, compiler.toolchain if compiler else None, symbols, name):
        try:
            return backend.load_cubin(entry.cubin, symbols)
        except KernelCompileError as e:
            cache.discard(entry.cubin, f"the driver refused it ({(e.log or str(e)).strip().splitlines()[0]})")
    log.info(compile_notice(arch))
    if compiler is None or not compiler.targets(arch):
        return backend.compile_source(source, f"{name}.cu", options, symbols)
    cubin = compiler.build(source, f"{name}.cu", options, arch)
    try:
        path = cache.store(cubin, source, options, arch, compiler.toolchain, symbols, name)
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

    def __init__(self, backend: Backend, keys: Sequence[Any], name: str = "seed-unet",
                 cache: Optional[CubinCache] = None, compiler: Optional[Compiler] = None) -> None:
        arch = int(backend.arch())
        if any(getattr(k, "dtype", "fp32") != "fp32" for k in keys) and arch < MIN_TC_ARCH:
            raise KernelCompileError(name, (), f"fp16/bf16 kernels need sm_80 or newer; this GPU is sm_{arch}")
        self.options = nvrtc_options(arch)
        self.source = module_source(keys)
        self.symbols: List[str] = sorted({k.symbol for k in keys})
        ck = (backend.name, self.source, self.options)   # per backend
        mod = KernelSet._cache.get(ck)
        if mod is None:
            mod = load_module(backend, self.source, name, self.options, self.symbols, arch, cache, compiler)
            KernelSet._cache[ck] = mod
        self.module = mod
        self.functions = {s: mod.get(s) for s in self.symbols}

    def __getitem__(self, symbol: str) -> Any:
        return self.functions[symbol]

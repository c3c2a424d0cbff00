"""The ONE kernel loader: module text -> a loaded module with every symbol fetched.

`load_module` looks in the cubins shipped with the package first (jetson_unet.cubins, read-only:
built at release time by `python -m tools.build_kernels` for the shipped model; the newest
toolchain's that the driver loads), then in the cubin cache (jetson_unet.build.cache: validated
entries of this toolchain, then of any toolchain, e.g. made ahead of time by `jetson-sample
--prepare`), else compiles with the backend's compiler
(jetson_unet.build.compilers) under the cache's lock for that entry, stores the cubin and loads it:
one cache for both backends, one compile per module across processes.
"""
from __future__ import annotations

import logging
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from jetson_unet.build.sources import MIN_TC_ARCH, module_source, nvrtc_options
from jetson_unet.errors import KernelCompileError
from jetson_unet.backends.base import Backend, Module
from jetson_unet.build.cache import CubinCache
from jetson_unet.build.compilers import Compiler, runtime_compiler
from jetson_unet.paths import shipped_cubins_dir


log = logging.getLogger(__name__)
LOADS: List[Tuple[str, float]] = []   # (where the module came from, seconds) per module this process got


def compile_notice(arch: int) -> str:
    return (f"compiling GPU kernels for sm_{arch} (first run; `jetson-sample --prepare` does this "
            "ahead of time)...")


def shipped_cache() -> CubinCache:
    """The cubins shipped as package data, read-only."""
    return CubinCache(shipped_cubins_dir(), read_only=True)


def load_module(backend: Backend, source: str, name: str, options: Tuple[str, ...], symbols: Sequence[str],
                arch: int, cache: Optional[CubinCache] = None, compiler: Optional[Compiler] = None,
                shipped: Optional[CubinCache] = None) -> Module:
    """A module with every symbol fetched: a valid shipped cubin, else a cached one (this toolchain's,
    else any other's), else one built now by the backend's compiler (`compiler` overrides it), stored,
    loaded. A cubin the driver refuses is skipped (a shipped one) or discarded and rebuilt. A backend
    without cubins (compiler None), or with no compiler for this arch here, compiles through its own
    compile_source. Appends (where from, seconds) to LOADS."""
    t0 = time.perf_counter()
    mod, origin = _load(backend, source, name, options, symbols, arch, cache, compiler, shipped)
    LOADS.append((origin, time.perf_counter() - t0))
    return mod


def _load(backend: Backend, source: str, name: str, options: Tuple[str, ...], symbols: Sequence[str], arch: int,
          cache: Optional[CubinCache], compiler: Optional[Compiler],
          shipped: Optional[CubinCache]) -> Tuple[Module, str]:
    if backend.compiler is None:
        return backend.compile_source(source, f"{name}.cu", options, symbols), "compiled"
    compiler = compiler or runtime_compiler(backend.compiler)
    cache = cache if cache is not None else CubinCache()
    shipped = shipped if shipped is not None else shipped_cache()
    toolchain = compiler.toolchain if compiler else None
    found = _first_loadable(backend, source, options, arch, toolchain, symbols, name, (shipped, cache))
    if found is not None:
        return found
    if compiler is None or not compiler.targets(arch):
        log.info(compile_notice(arch))
        return backend.compile_source(source, f"{name}.cu", options, symbols), "compiled"
    with cache.lock(name, source, options, arch, compiler.toolchain):
        found = _first_loadable(backend, source, options, arch, toolchain, symbols, name, (cache,))   # built meanwhile?
        return found or (_build(backend, source, name, options, symbols, arch, cache, compiler), "compiled")


def _build(backend: Backend, source: str, name: str, options: Tuple[str, ...], symbols: Sequence[str], arch: int,
           cache: CubinCache, compiler: Compiler) -> Module:
    """Compile (with the notice), store and load one module."""
    log.info(compile_notice(arch))
    cubin = compiler.build(source, f"{name}.cu", options, arch)
    try:
        path = cache.store(cubin, source, options, arch, compiler.toolchain, symbols, name)
    except OSError:     # an unwritable cache costs a compile next time, nothing else
        with tempfile.TemporaryDirectory(prefix="jetson-unet-") as tmp:
            path = Path(tmp) / f"{name}.cubin"
            path.write_bytes(cubin)
            return backend.load_cubin(path, symbols)
    return backend.load_cubin(path, symbols)


def _first_loadable(backend: Backend, source: str, options: Tuple[str, ...], arch: int, toolchain: Optional[str],
                    symbols: Sequence[str], name: str, caches: Sequence[CubinCache]) -> Optional[Tuple[Module, str]]:
    """(module, "shipped" or "cache") of the first valid entry the driver loads, in the order of
    `caches`; an entry it refuses is discarded by its cache (a read-only one only skips it). The
    shipped cubins are tried newest toolchain first, whatever this machine's compiler: sm_90 ships
    NVRTC 13's code (ELF ABI 8, CUDA 13 drivers) beside 12.2's (ABI 7, which CUDA 12 drivers read)."""
    for cache in caches:
        for entry in cache.find(source, options, arch, None if cache.read_only else toolchain, symbols, name):
            try:
                return backend.load_cubin(entry.cubin, symbols), ("shipped" if cache.read_only else "cache")
            except KernelCompileError as e:
                cache.discard(entry.cubin, f"the driver refused it ({(e.log or str(e)).strip().splitlines()[0]})")
    return None


def build_side_by_side(modules: Sequence[Tuple[str, Sequence[str]]], name: str, options: Tuple[str, ...],
                       arch: int, cache: CubinCache, compiler: Compiler, shipped: CubinCache) -> None:
    """Compile with NVRTC the modules (source, symbols) that neither `shipped` nor `cache` holds, one
    thread each, and store them in the cache, each under its lock; load_module then finds them there.
    NVRTC runs outside the GIL: two 12-kernel modules took 19.4 s side by side against 38.8 s one after
    the other (2 cores, pip NVRTC 12), each kernel's code byte for byte what one module gives it."""
    def have(source: str, symbols: Sequence[str], c: CubinCache) -> bool:
        return next(iter(c.find(source, options, arch, compiler.toolchain, symbols, name)), None) is not None

    def one(job: Tuple[str, Sequence[str]]) -> None:
        source, symbols = job
        with cache.lock(name, source, options, arch, compiler.toolchain):
            if not have(source, symbols, cache):   # another process may have built it meanwhile
                cache.store(compiler.build(source, f"{name}.cu", options, arch), source, options, arch,
                            compiler.toolchain, symbols, name)

    todo = [(src, syms) for src, syms in modules if not (have(src, syms, shipped) or have(src, syms, cache))]
    if todo:
        log.info(compile_notice(arch))
        with ThreadPoolExecutor(len(todo)) as pool:
            list(pool.map(one, todo))


def _prebuild(backend: Backend, jobs: Sequence[Tuple[str, Sequence[str]]], name: str, options: Tuple[str, ...],
              arch: int, cache: Optional[CubinCache], compiler: Optional[Compiler]) -> Optional[CubinCache]:
    """build_side_by_side where the backend's cubins come from NVRTC (nvcc runs as a process whose
    signal handling wants the main thread: its modules build one after the other in load_module).
    Returns the cache used."""
    c = compiler or (runtime_compiler(backend.compiler) if backend.compiler else None)
    if c is None or c.kind != "nvrtc" or not c.targets(arch):
        return cache
    cache = cache if cache is not None else CubinCache()
    build_side_by_side(jobs, name, options, arch, cache, c, shipped_cache())
    return cache


def shard(keys: Sequence[Any], shards: int) -> List[List[Any]]:
    """`keys` (sorted by symbol) in at most `shards` contiguous, non-empty groups of near-equal size."""
    keys = sorted(keys, key=lambda k: k.symbol)
    n = max(1, min(int(shards), len(keys)))
    return [keys[len(keys) * i // n:len(keys) * (i + 1) // n] for i in range(n)]


class KernelSet:
    """Loads (or compiles) the module with every requested instantiation and fetches every function
    now (before any CUDA-graph capture). shards > 1 (jetson-tune's hundreds of candidate kernels):
    the kernels in that many modules, those not yet built compiled side by side."""

    _cache: Dict[Tuple[str, str, Tuple[str, ...]], Any] = {}

    def __init__(self, backend: Backend, keys: Sequence[Any], name: str = "seed-unet",
                 cache: Optional[CubinCache] = None, compiler: Optional[Compiler] = None, shards: int = 1) -> None:
        arch = int(backend.arch())
        if any(getattr(k, "dtype", "fp32") != "fp32" for k in keys) and arch < MIN_TC_ARCH:
            raise KernelCompileError(name, (), f"fp16/bf16 kernels need sm_80 or newer; this GPU is sm_{arch}")
        self.options = nvrtc_options(arch)
        self.source = module_source(keys)
        self.symbols: List[str] = sorted({k.symbol for k in keys})
        jobs = ([(self.source, self.symbols)] if shards <= 1 else
                [(module_source(g), sorted({k.symbol for k in g})) for g in shard(keys, shards)])
        missing = [j for j in jobs if (backend.name, j[0], self.options) not in KernelSet._cache]
        if len(missing) > 1:
            cache = _prebuild(backend, missing, name, self.options, arch, cache, compiler)
        mods = []
        for source, symbols in jobs:
            ck = (backend.name, source, self.options)   # per backend
            if ck not in KernelSet._cache:
                KernelSet._cache[ck] = load_module(backend, source, name, self.options, symbols, arch, cache,
                                                   compiler)
            mods.append((KernelSet._cache[ck], symbols))
        self.module = mods[0][0]   # every module holds the non-template kernels (the noise generator's)
        self.functions = {s: mod.get(s) for mod, symbols in mods for s in symbols}

    def __getitem__(self, symbol: str) -> Any:
        return self.functions[symbol]

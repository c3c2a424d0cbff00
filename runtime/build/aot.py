"""Ahead-of-time kernels (`jetson-sample --prepare`): every module the executor would compile for a
weights file's config, per target arch and precision, built into the cubin cache with no GPU needed
(but those shipped with the package, jetson_unet.cubins, which the loader takes first anyway).

A module is what GpuExecutor asks KernelSet for (ops.specs.module_keys): every instantiation the tile
rules pick on a grid of batch sizes and SM counts, the tiles of the tuning files of the run's SM count,
and the run's own keys, for one precision. So one module serves every batch size up to 64 and every
SM count without a tuning file of its own; a target is an arch, the SM counts of the boards that
carry it (JETSON_SMS; `--sms` overrides; `native` asks this machine's GPU) and their GPU's name
(JETSON_DEVICES), and every batch asked for (and the half-batches of cpu mode) is covered, duplicates
dropped. A board whose run takes its GPU's tuning files of another SM count gets that count's module,
as the executor does (an Orin Nano 4GB: the 8-SM module, shipped).

Compilers (pick_compiler): a libnvrtc.so named by --nvrtc or $JETSON_UNET_NVRTC, for every arch; else
NVRTC through CuPy's binding when CuPy is importable (the toolchain the runtime itself compiles
with), and for an arch it cannot target (CUDA 13 and sm_72) the pip NVRTC (nvidia-cuda-nvrtc-cu11 /
-cu12) when importable; without CuPy that pip NVRTC, else nvcc. All emit a cubin for sm_XX; the
runtime loads any of them (build.cache).
"""
from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from jetson_unet.errors import KernelCompileError, UsageError
from jetson_unet.model.plan import build_plan
from jetson_unet.build import nvrtc_lib
from jetson_unet.build.compilers import (ArchUnsupported, Compiler, find_nvcc, nvcc_compiler, nvrtc_compiler,
                                         nvrtc_module, nvrtc_toolchain)
from jetson_unet.build.cache import CubinCache
from jetson_unet.build.loader import shipped_cache
from jetson_unet.build.sources import MIN_TC_ARCH, module_source, nvrtc_options
from jetson_unet.ops import specs
from jetson_unet.ops.policy import BUILTIN, KernelPolicy, run_context

COMPILERS = ("auto", "nvrtc", "nvcc")
# SM counts of the boards of an arch (CUDA cores / 128 on Ampere, / 64 on Volta).
JETSON_SMS: Dict[int, Tuple[int, ...]] = {72: (6, 8), 87: (4, 8)}
# The name the boards' GPU reports, which names its tuning files (runtime/tiles/tiles-orin-8sm-*).
JETSON_DEVICES: Dict[int, str] = {72: "Xavier", 87: "Orin"}
BOARDS = {(72, 6): "Xavier NX", (72, 8): "AGX Xavier", (87, 4): "Orin Nano 4GB",
          (87, 8): "Orin Nano 8GB / Orin NX", (87, 14): "AGX Orin 32GB", (87, 16): "AGX Orin 64GB"}
Out = Callable[[str], None]


@dataclass(frozen=True)
class Target:
    arch: int
    sms: Tuple[int, ...]
    label: str
    device: Optional[str] = None   # the GPU's name where known: its tuning files of other SM counts count


def module_keys(weights: Any, precision: str, batch: int, sms: int, tiles: Optional[Mapping[str, Any]] = None,
                dirs: Optional[Sequence[Any]] = None, device: Optional[str] = None) -> List[Any]:
    """The keys GpuExecutor(weights, precision, batch, policy=KernelPolicy(tiles=tiles, tile_dirs=dirs))
    hands KernelSet on a GPU named `device` with `sms` SMs (tiles: a tuning file's; None or {}: the
    built-in tiles or whichever tuning file of `dirs` the run finds, whose tiles are in the module
    either way). With the device named, a run that takes its files of another SM count gets that
    count's module (ops.policy.run_context: an Orin Nano 4GB runs the 8-SM module); without, the
    module of `sms` itself."""
    return run_keys(weights, precision, batch, sms, tiles, dirs, device)[0]


def run_keys(weights: Any, precision: str, batch: int, sms: int, tiles: Optional[Mapping[str, Any]] = None,
             dirs: Optional[Sequence[Any]] = None, device: Optional[str] = None) -> Tuple[List[Any], int]:
    """(module_keys, the SM count whose rules and tuning files the run takes: `sms`, or the other count
    whose files stand in)."""
    # without a device no file is looked for: the given tiles, else the built-in ones
    policy = KernelPolicy(tiles=dict(tiles) if tiles else (None if device else BUILTIN), tile_dirs=dirs)
    ctx, *_, tuned = run_context(weights, build_plan(weights.config), precision, batch, device or "", sms, policy,
                                 quiet=True)
    return specs.module_keys(ctx, tuned), ctx.sms


def executor_batches(batches: Sequence[int]) -> List[int]:
    """The executor batch sizes of these sampler batches: b (gpu mode) and its halves (cpu mode)."""
    return sorted({x for b in batches for x in (b, b - b // 2, b // 2) if x >= 1})


def parse_targets(values: Sequence[str], sms: Optional[Sequence[int]] = None,
                  native: Optional[Callable[[], Tuple[int, int, str]]] = None) -> List[Target]:
    """'87', 'sm_87' or 'native' -> Targets. SM counts: --sms, else JETSON_SMS, else an error."""
    out: List[Target] = []
    for v in values:
        if v == "native":
            arch, n, name = (native or native_gpu)()
            out.append(Target(arch, (n,), f"sm_{arch} (native: {name}, {n} SMs)", name))
            continue
        try:
            arch = int(v[3:] if v.startswith("sm_") else v)
        except ValueError:
            raise UsageError(f"--arch {v!r}: give a number such as 87, sm_87, or native") from None
        counts = tuple(sms) if sms else JETSON_SMS.get(arch)
        if not counts:
            raise UsageError(f"--arch {arch}: name the GPU's SM count with --sms (the tiles depend on it; e.g. "
                             "132 for an H100/H200), or run --arch native on that machine")
        boards = ", ".join(f"{n} SMs" + (f" {BOARDS[(arch, n)]}" if (arch, n) in BOARDS else "") for n in counts)
        out.append(Target(arch, counts, f"sm_{arch} ({boards})", JETSON_DEVICES.get(arch)))
    return out


def native_gpu() -> Tuple[int, int, str]:
    """(arch, SM count, name) of this machine's GPU through the first usable backend."""
    from jetson_unet.backends import BACKENDS, get_backend
    reasons = []
    for name in BACKENDS:
        try:
            be = get_backend(name)
            return int(be.arch()), int(be.sm_count()), be.device_name()
        except Exception as e:   # BackendUnavailable, ImportError, a driver error
            reasons.append(f"{name}: {e}")
    raise UsageError(f"--arch native needs a usable GPU here ({'; '.join(reasons)}); name the arch instead, "
                     "e.g. --arch 87")


def pick_compiler(which: str = "auto", nvrtc: Any = None, nvcc: Optional[str] = None, library: Optional[str] = None,
                  environ: Mapping[str, str] = os.environ) -> Compiler:
    """--nvrtc / $JETSON_UNET_NVRTC for every arch; else NVRTC (CuPy's, falling back per arch to the
    pip package's; without CuPy the pip package's) for auto/nvrtc; else nvcc (PATH, $CUDA_HOME,
    /usr/local/cuda)."""
    if which not in COMPILERS:
        raise UsageError(f"--compiler must be one of {', '.join(COMPILERS)}, got {which!r}")
    if library is not None and which == "nvcc":
        raise UsageError("--nvrtc names an NVRTC library: drop --compiler nvcc (or --nvrtc)")
    if which in ("auto", "nvrtc"):
        named = (nvrtc_lib.resolve(library, "--nvrtc") if library is not None else nvrtc_lib.env_library(environ))
        if named is not None:
            return nvrtc_compiler(nvrtc_lib.NvrtcLib(named, "--nvrtc" if library is not None else f"${nvrtc_lib.ENV}"))
        try:
            mod = nvrtc_module(nvrtc)   # CuPy's NVRTC binding: no GPU needed
            return replace(nvrtc_compiler(mod), label=f"{nvrtc_toolchain(mod)} (CuPy)",
                           fallback=functools.lru_cache(maxsize=None)(pip_compiler))
        except Exception as e:   # no CuPy, or no libnvrtc behind it
            pip = pip_compiler()
            if pip is not None:
                return pip
            if which == "nvrtc":
                raise UsageError(f"NVRTC is not usable here ({type(e).__name__}: {e}); install the CuPy extra "
                                 f"(.[cuda12]), or `{nvrtc_lib.PIP_HINT}`, or use --compiler nvcc") from None
    if nvcc is None:
        nvcc = find_nvcc()
    if nvcc is None:
        raise UsageError(f"no CUDA compiler here: install CuPy with NVRTC (.[cuda12] / .[cuda11]), or "
                         f"`{nvrtc_lib.PIP_HINT}`, or put nvcc on PATH (JetPack: /usr/local/cuda/bin)")
    return nvcc_compiler(nvcc)


def pip_compiler() -> Optional[Compiler]:
    """The importable pip NVRTC (nvidia-cuda-nvrtc-cu11 / -cu12), None when there is none."""
    path = nvrtc_lib.pip_library()
    return nvrtc_compiler(nvrtc_lib.NvrtcLib(path, f"pip package {nvrtc_lib.PIP_MODULE}:")) if path else None


@dataclass(frozen=True)
class Module:
    """One kernel module to build: its text and kernels, for an arch and precision, serving `sms`, whose
    runs take the rules and tuning files of `tile_sms` (other SM counts where another's files stand in)."""
    arch: int
    precision: str
    source: str
    symbols: Tuple[str, ...]
    sms: Tuple[int, ...]
    tile_sms: Tuple[int, ...] = ()

    @property
    def label(self) -> str:
        tiles = (f", the {'/'.join(map(str, self.tile_sms))}-SM tiles"
                 if self.tile_sms and set(self.tile_sms) != set(self.sms) else "")
        return (f"sm_{self.arch} {self.precision} ({'/'.join(map(str, self.sms))} SMs{tiles}, "
                f"{len(self.symbols)} kernels)")


def plan_modules(weights: Any, t: Target, precision: str, batches: Sequence[int]) -> List[Module]:
    """The distinct modules the executor asks for on target t at these batch sizes, in first-met order."""
    modules: Dict[str, Tuple[List[str], List[int], List[int]]] = {}   # source -> (symbols, SM counts, tiles')
    for sms in t.sms:
        for b in executor_batches(batches):
            keys, tile_sms = run_keys(weights, precision, b, sms, device=t.device)
            _, counts, tile_counts = modules.setdefault(module_source(keys), (sorted({k.symbol for k in keys}), [], []))
            for seen, n in ((counts, sms), (tile_counts, tile_sms)):
                if n not in seen:
                    seen.append(n)
    return [Module(t.arch, precision, src, tuple(syms), tuple(counts), tuple(tiles))
            for src, (syms, counts, tiles) in modules.items()]


def target_precisions(arch: int, precisions: Sequence[str], out: Out) -> List[str]:
    """The precisions an arch can run: fp32 alone below sm_80 (said in one line)."""
    precs = list(precisions)
    if arch < MIN_TC_ARCH and any(p != "fp32" for p in precs):
        precs = [p for p in precs if p == "fp32"]
        out(f"sm_{arch}: fp16/bf16 kernels need sm_{MIN_TC_ARCH}+ (tensor-core mma.sync); "
            f"building {'fp32 only' if precs else 'nothing (no fp32 asked for)'}")
    return precs


def prepare(weights: Any, targets: Sequence[Target], precisions: Sequence[str], batches: Sequence[int],
            compiler: Compiler, cache: CubinCache, out: Out, name: str = "seed-unet") -> int:
    """Build every module into the cache, but those shipped with the package; one line per module.
    Returns the number of failures."""
    out(f"{compiler.name} -> {cache.root}")
    shipped = shipped_cache()
    failures = 0
    for t in targets:
        try:
            c = compiler.for_arch(t.arch)
        except UsageError as e:   # a fallback NVRTC that is installed but does not load
            out(f"sm_{t.arch}: {e}")
            c = compiler
        if c is not compiler:
            out(f"sm_{t.arch}: {compiler.name} cannot target it; using {c.name}")
        try:
            for p in target_precisions(t.arch, precisions, out):
                failures += sum(build_module(m, c, cache, out, name, shipped)
                                for m in plan_modules(weights, t, p, batches))
        except ArchUnsupported as e:
            hint = (f"; CUDA 13 dropped sm_72 and older: `{nvrtc_lib.PIP_HINT}` (then used for them "
                    "automatically) or --nvrtc PATH to a CUDA 11/12 libnvrtc.so" if t.arch < 75 else "")
            out(f"sm_{t.arch}: skipped: {e.log}{hint}")
            failures += 1
    return failures


def build_module(m: Module, compiler: Compiler, cache: CubinCache, out: Out, name: str = "seed-unet",
                 shipped: Optional[CubinCache] = None) -> int:
    """Compile and store one module unless `shipped` holds it (any toolchain's) or the cache this
    toolchain's; one line. 1 on failure, else 0."""
    options = nvrtc_options(m.arch)
    ship = next(shipped.find(m.source, options, m.arch, None, m.symbols, name), None) if shipped else None
    if ship is not None:
        out(f"{m.label}: shipped with the package ({ship.cubin.name}, {ship.toolchain})")
        return 0
    have = [e for e in cache.find(m.source, options, m.arch, compiler.toolchain, m.symbols, name)
            if e.toolchain == compiler.toolchain]
    if have:
        out(f"{m.label}: up to date ({have[0].cubin.name})")
        return 0
    t0 = time.perf_counter()
    try:
        cubin = compiler.build(m.source, f"{name}.cu", options, m.arch)
    except ArchUnsupported:
        raise
    except KernelCompileError as e:
        out(f"{m.label}: FAILED: {first_line(e.log or str(e))}")
        return 1
    try:
        path = cache.store(cubin, m.source, options, m.arch, compiler.toolchain, m.symbols, name)
    except OSError as e:
        out(f"{m.label}: FAILED: cannot write the cache {cache.root}: {e.strerror or e}")
        return 1
    out(f"{m.label}: compiled in {time.perf_counter() - t0:.1f} s, {len(cubin) / 1e6:.1f} MB -> {path.name}")
    return 0


def first_line(text: str) -> str:
    """The compiler's first error line (else its first line) for a one-line report."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "(no compiler output)")

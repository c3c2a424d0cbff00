"""Ahead-of-time kernels (`jetson-sample --prepare`): every module the executor would compile for a
weights file's config, per target arch and precision, built into the cubin cache with no GPU needed.

A module is what GpuExecutor asks KernelSet for: all tile instantiations for every batch size
(ops.all_tile_keys) plus the spec keys of the batch itself, for one precision. The tile choice
depends on the GPU's SM count, so a target is an arch and the SM counts of the boards that carry it
(JETSON_SMS; `--sms` overrides; `native` asks this machine's GPU). Batch sizes share one module on
Jetson-sized GPUs; on a large GPU a batch above 64 can add a tile, so every batch asked for (and
the half-batches of cpu mode) is covered, duplicates dropped.

Compilers (pick_compiler): a libnvrtc.so named by --nvrtc or $JETSON_UNET_NVRTC, for every arch; else
NVRTC through CuPy's binding when CuPy is importable (the toolchain the runtime itself compiles
with), and for an arch it cannot target (CUDA 13 and sm_72) the pip NVRTC (nvidia-cuda-nvrtc-cu11 /
-cu12) when importable; without CuPy that pip NVRTC, else nvcc. All emit a cubin for sm_XX; the
runtime loads any of them (cubins.py).
"""
from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from jetson_unet.errors import KernelCompileError, UsageError
from jetson_unet.model.arena import view_layout
from jetson_unet.model.plan import CAT, build_plan
from jetson_unet.build import nvrtc_lib
from jetson_unet.build.compilers import (ArchUnsupported, Compiler, find_nvcc, nvcc_compiler, nvrtc_compiler,
                                         nvrtc_module, nvrtc_toolchain)
from jetson_unet.build.cache import CubinCache
from jetson_unet.build.sources import MIN_TC_ARCH, module_source, nvrtc_options
from jetson_unet.ops.common import Ctx
from jetson_unet.ops.specs import all_tile_keys, op_spec
from jetson_unet.ops.tuning import prepare_tiles

COMPILERS = ("auto", "nvrtc", "nvcc")
# SM counts of the boards of an arch (CUDA cores / 128 on Ampere, / 64 on Volta).
JETSON_SMS: Dict[int, Tuple[int, ...]] = {72: (6, 8), 87: (4, 8)}
BOARDS = {(72, 6): "Xavier NX", (72, 8): "AGX Xavier", (87, 4): "Orin Nano 4GB",
          (87, 8): "Orin Nano 8GB / Orin NX", (87, 14): "AGX Orin 32GB", (87, 16): "AGX Orin 64GB"}
Out = Callable[[str], None]


@dataclass(frozen=True)
class Target:
    arch: int
    sms: Tuple[int, ...]
    label: str
    device: Optional[str] = None   # native: this GPU's name, whose tuning files the executor will find


def module_keys(weights: Any, precision: str, batch: int, sms: int,
                tiles: Optional[Mapping[str, Any]] = None) -> List[Any]:
    """The keys GpuExecutor(weights, precision, batch, tiles=tiles) hands KernelSet on a GPU with
    `sms` SMs (tiles: a tuning file's; None or {}: the built-in tiles)."""
    plan = build_plan(weights.config)
    ctx = Ctx(plan, weights.params, precision, batch, sms, view_layout(plan), tiles=dict(tiles or {}))
    keys = set(all_tile_keys(ctx)) | {op_spec(op, ctx).key for op in plan.ops if op.kind != CAT}
    return sorted(keys, key=lambda k: k.symbol)


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
            out.append(Target(arch, (n,), f"sm_{arch} (native: {name}, {n} SMs)", device=name))
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
        out.append(Target(arch, counts, f"sm_{arch} ({boards})"))
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


def prepare(weights: Any, targets: Sequence[Target], precisions: Sequence[str], batches: Sequence[int],
            compiler: Compiler, cache: CubinCache, out: Out, name: str = "seed-unet") -> int:
    """Build every module into the cache; one line per module. Returns the number of failures."""
    out(f"{compiler.name} -> {cache.root}")
    failures = 0
    for t in targets:
        try:
            c = compiler.for_arch(t.arch)
        except UsageError as e:   # a fallback NVRTC that is installed but does not load
            out(f"sm_{t.arch}: {e}")
            c = compiler
        if c is not compiler:
            out(f"sm_{t.arch}: {compiler.name} cannot target it; using {c.name}")
        precs = list(precisions)
        if t.arch < MIN_TC_ARCH and any(p != "fp32" for p in precs):
            precs = [p for p in precs if p == "fp32"]
            out(f"sm_{t.arch}: fp16/bf16 kernels need sm_{MIN_TC_ARCH}+ (tensor-core mma.sync); "
                f"building {'fp32 only' if precs else 'nothing (no fp32 asked for)'}")
        try:
            for p in precs:
                failures += _prepare_precision(weights, t, p, batches, c, cache, out, name)
        except ArchUnsupported as e:
            hint = (f"; CUDA 13 dropped sm_72 and older: `{nvrtc_lib.PIP_HINT}` (then used for them "
                    "automatically) or --nvrtc PATH to a CUDA 11/12 libnvrtc.so" if t.arch < 75 else "")
            out(f"sm_{t.arch}: skipped: {e.log}{hint}")
            failures += 1
    return failures


def _prepare_precision(weights: Any, t: Target, precision: str, batches: Sequence[int], compiler: Compiler,
                       cache: CubinCache, out: Out, name: str) -> int:
    modules: Dict[str, Tuple[List[str], List[int]]] = {}   # source -> (symbols, SM counts)
    for sms in t.sms:
        for b in executor_batches(batches):
            for _, tiles in prepare_tiles(weights.config, sms, precision, b, t.device):
                keys = module_keys(weights, precision, b, sms, tiles)
                src = module_source(keys)
                syms, counts = modules.setdefault(src, (sorted({k.symbol for k in keys}), []))
                if sms not in counts:
                    counts.append(sms)
    options = nvrtc_options(t.arch)
    failures = 0
    for src, (symbols, counts) in modules.items():
        what = f"sm_{t.arch} {precision} ({'/'.join(map(str, counts))} SMs, {len(symbols)} kernels)"
        have = [e for e in cache.find(src, options, t.arch, compiler.toolchain, symbols, name)
                if e.toolchain == compiler.toolchain]
        if have:
            out(f"{what}: up to date ({have[0].cubin.name})")
            continue
        t0 = time.perf_counter()
        try:
            cubin = compiler.build(src, f"{name}.cu", options, t.arch)
        except ArchUnsupported:
            raise
        except KernelCompileError as e:
            out(f"{what}: FAILED: {first_line(e.log or str(e))}")
            failures += 1
            continue
        try:
            path = cache.store(cubin, src, options, t.arch, compiler.toolchain, symbols, name)
        except OSError as e:
            out(f"{what}: FAILED: cannot write the cache {cache.root}: {e.strerror or e}")
            failures += 1
            continue
        out(f"{what}: compiled in {time.perf_counter() - t0:.1f} s, {len(cubin) / 1e6:.1f} MB -> {path.name}")
    return failures


def first_line(text: str) -> str:
    """The compiler's first error line (else its first line) for a one-line report."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "(no compiler output)")

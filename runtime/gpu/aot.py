"""Ahead-of-time kernels (`jetson-sample --prepare`): every module the executor would compile for a
weights file's config, per target arch and precision, built into the cubin cache with no GPU needed.

A module is what GpuExecutor asks KernelSet for: all tile instantiations for every batch size
(ops.all_tile_keys) plus the spec keys of the batch itself, for one precision. The tile choice
depends on the GPU's SM count, so a target is an arch and the SM counts of the boards that carry it
(JETSON_SMS; `--sms` overrides; `native` asks this machine's GPU). Batch sizes share one module on
Jetson-sized GPUs; on a large GPU a batch above 64 can add a tile, so every batch asked for (and
the half-batches of cpu mode) is covered, duplicates dropped.

Compilers: NVRTC through CuPy's binding when CuPy is importable (the toolchain the runtime itself
compiles with), else nvcc. Both emit a cubin for sm_XX; the runtime loads either (cubins.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import KernelCompileError, UsageError
from ..plan import CAT, build_plan
from .compilers import ArchUnsupported, nvcc_cubin, nvcc_toolchain, nvrtc_cubin, nvrtc_module, nvrtc_toolchain
from .cubins import CubinCache
from .kernels import MIN_TC_ARCH, module_source, nvrtc_options
from .ops import Ctx, all_tile_keys, op_spec

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


@dataclass(frozen=True)
class Compiler:
    kind: str                                                   # "nvrtc" | "nvcc"
    toolchain: str                                              # part of the cache key
    build: Callable[[str, str, Tuple[str, ...], int], bytes]    # (source, name, options, arch) -> cubin


def module_keys(weights: Any, precision: str, batch: int, sms: int) -> List[Any]:
    """The keys GpuExecutor(weights, precision, batch) hands KernelSet on a GPU with `sms` SMs."""
    from .executor import view_layout   # executor imports kernels; keep this module import-light
    plan = build_plan(weights.config)
    ctx = Ctx(plan, weights.params, precision, batch, sms, view_layout(plan))
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
            out.append(Target(arch, (n,), f"sm_{arch} (native: {name}, {n} SMs)"))
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
    from .backend import BACKENDS, get_backend
    reasons = []
    for name in BACKENDS:
        try:
            be = get_backend(name)
            return int(be.arch()), int(be.sm_count()), be.device_name()
        except Exception as e:   # BackendUnavailable, ImportError, a driver error
            reasons.append(f"{name}: {e}")
    raise UsageError(f"--arch native needs a usable GPU here ({'; '.join(reasons)}); name the arch instead, "
                     "e.g. --arch 87")


def pick_compiler(which: str = "auto", nvrtc: Any = None, nvcc: Optional[str] = None) -> Compiler:
    """NVRTC (CuPy's binding) for auto/nvrtc when it works, else nvcc (PATH, $CUDA_HOME, /usr/local/cuda)."""
    if which not in COMPILERS:
        raise UsageError(f"--compiler must be one of {', '.join(COMPILERS)}, got {which!r}")
    if which in ("auto", "nvrtc"):
        try:
            mod = nvrtc_module(nvrtc)   # CuPy's NVRTC binding: no GPU needed
            return Compiler("nvrtc", nvrtc_toolchain(mod), lambda s, n, o, a: nvrtc_cubin(s, n, o, a, mod))
        except Exception as e:   # no CuPy, or no libnvrtc behind it
            if which == "nvrtc":
                raise UsageError(f"NVRTC is not usable here ({type(e).__name__}: {e}); install the CuPy extra "
                                 "(.[cuda12]) or use --compiler nvcc") from None
    if nvcc is None:
        from .backend_pycuda import find_nvcc   # a pure helper; pycuda itself is not imported
        nvcc = find_nvcc()
    if nvcc is None:
        raise UsageError("no CUDA compiler here: install CuPy with NVRTC (.[cuda12] / .[cuda11]) or put nvcc "
                         "on PATH (JetPack: /usr/local/cuda/bin)")
    path = nvcc
    return Compiler("nvcc", nvcc_toolchain(path), lambda s, n, o, a: nvcc_cubin(s, n, o, a, path))


def prepare(weights: Any, targets: Sequence[Target], precisions: Sequence[str], batches: Sequence[int],
            compiler: Compiler, cache: CubinCache, out: Out, name: str = "seed-unet") -> int:
    """Build every module into the cache; one line per module. Returns the number of failures."""
    out(f"{compiler.toolchain} -> {cache.root}")
    failures = 0
    for t in targets:
        precs = list(precisions)
        if t.arch < MIN_TC_ARCH and any(p != "fp32" for p in precs):
            precs = [p for p in precs if p == "fp32"]
            out(f"sm_{t.arch}: fp16/bf16 kernels need sm_{MIN_TC_ARCH}+ (tensor-core mma.sync); "
                f"building {'fp32 only' if precs else 'nothing (no fp32 asked for)'}")
        try:
            for p in precs:
                failures += _prepare_precision(weights, t, p, batches, compiler, cache, out, name)
        except ArchUnsupported as e:
            hint = ("; CUDA 13 dropped sm_72 and older: build them with a CUDA 11/12 toolchain (e.g. JetPack 5's "
                    "nvcc on the board)" if t.arch < 75 else "")
            out(f"sm_{t.arch}: skipped: {e.log}{hint}")
            failures += 1
    return failures


def _prepare_precision(weights: Any, t: Target, precision: str, batches: Sequence[int], compiler: Compiler,
                       cache: CubinCache, out: Out, name: str) -> int:
    modules: Dict[str, Tuple[List[str], List[int]]] = {}   # source -> (symbols, SM counts)
    for sms in t.sms:
        for b in executor_batches(batches):
            keys = module_keys(weights, precision, b, sms)
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

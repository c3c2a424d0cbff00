#!/usr/bin/env python3
"""Build the kernel modules shipped with the package: the shipped model's cubins in runtime/cubins/
(package data jetson_unet.cubins), which the loader takes before the user's cache, so that no run of
the shipped model on these GPUs compiles.

    pip install --target /tmp/nvrtc11 nvidia-cuda-nvrtc-cu11==11.8.89
    pip install --target /tmp/nvrtc122 nvidia-cuda-nvrtc-cu12==12.2.140
    pip install --target /tmp/nvrtc13 nvidia-cuda-nvrtc==13.0.88
    python -m tools.build_kernels --nvrtc /tmp/nvrtc11/nvidia/cuda_nvrtc/lib \
        --nvrtc-for 90=/tmp/nvrtc122/nvidia/cuda_nvrtc/lib \
        --nvrtc-for 90=/tmp/nvrtc13/nvidia/cu13/lib              # build the missing, drop the stale
    python -m tools.build_kernels --dry-run                     # list: present, missing, stale

Run it at release time, and after any change of kernels/, of the tile rules or of runtime/tiles/
(tests/host/test_shipped_cubins.py fails until then). Each arch is built with the NVRTCs of
SHIP_NVRTC (checked before anything is built): a driver loads a cubin of its own CUDA version or an
older one, not of a newer one, so the oldest NVRTC that the arch's drivers allow, CUDA 11.8's
(JetPack 5 and 6 alike), except for sm_90: CUDA 11.8 was the first to target Hopper, and its code
ran 2.5-3.6% slower on an H100 than 12.2's, which every Hopper driver since CUDA 12.2 loads; and
NVRTC 13's code, 1.4-1.9% faster again on an H200, ships beside it for CUDA 13 drivers (the loader
tries the newest toolchain first; docs/performance.md, cold start). One module per (arch,
precision) serves every batch size up to 64 and every SM count, but an SM count with tuning files of
its own (runtime/tiles/: 8 and 132) has a module of its own (ops.specs.all_tile_keys). An existing
entry of the same toolchain is kept, so a second run builds nothing; an entry no module needs any
more is removed.
"""
from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from jetson_unet.build import aot
from jetson_unet.build.cache import CubinCache
from jetson_unet.build.sources import nvrtc_options
from jetson_unet.errors import UsageError
from jetson_unet.model.weights import load_weights
from jetson_unet.paths import shipped_cubins_dir
from jetson_unet.pipeline import default_weights_path

# arch -> SM counts: sm_72 Xavier NX / AGX; sm_75 T4; sm_80 A100; sm_86 A40; sm_87 Orin Nano 8 GB and 4
# (the module of every SM count without tuning files: fp32, an AGX Orin's batch 1; the Orin Nano 4GB's fp16
# runs take the 8-SM files and module); sm_89 RTX 4090; sm_90 an 8-SM slice, H100 PCIe, H100 SXM / H200.
# Any other SM count without a tuning file of its own asks for the module of a count here without one
# (tests/host/test_shipped_cubins.py checks the SM counts of each arch's GPUs); fp16 needs sm_80+
# (aot.target_precisions). The targets name no device, so each SM count plans its own module.
SHIP_SMS = {72: (6, 8), 75: (40,), 80: (108,), 86: (84,), 87: (4, 8), 89: (128,), 90: (8, 114, 132)}
SHIP_NVRTC = {arch: ("nvrtc 12.2", "nvrtc 13.0") if arch == 90 else ("nvrtc 11.8",) for arch in SHIP_SMS}
SHIP_PRECISIONS = ("fp16", "fp32")   # bf16 (2.5 MB a module) compiles on first use
SHIP_BATCHES = (1,)                  # one module serves batches 1..64 (ops.specs.MODULE_BATCHES)
NAME = "seed-unet"
Out = Callable[[str], None]


def plan(weights: Any) -> List[aot.Module]:
    """Every module to ship, in SHIP_SMS order."""
    quiet: Out = lambda _: None  # noqa: E731
    return [m for arch, sms in SHIP_SMS.items()
            for p in aot.target_precisions(arch, SHIP_PRECISIONS, quiet)
            for m in aot.plan_modules(weights, aot.Target(arch, sms, f"sm_{arch}"), p, SHIP_BATCHES)]


def entry(m: aot.Module, cache: CubinCache, toolchain: str) -> Optional[Any]:
    """The valid entry of module m in the cache built by `toolchain` (a SHIP_NVRTC prefix), or None."""
    found = cache.find(m.source, nvrtc_options(m.arch), m.arch, None, m.symbols, NAME)
    return next((e for e in found if e.toolchain.startswith(toolchain)), None)


def shipped_entries(modules: Sequence[aot.Module], cache: CubinCache) -> Iterator[Tuple[str, Optional[Any]]]:
    """(label, entry or None) of each module and each of its arch's SHIP_NVRTC toolchains."""
    for m in modules:
        for toolchain in SHIP_NVRTC[m.arch]:
            yield f"{m.label} [{toolchain}]", entry(m, cache, toolchain)


def listing(modules: Sequence[aot.Module], folder: Path, out: Out) -> Tuple[int, int]:
    """One line per module and toolchain (its file, or MISSING) and per stale file, then a total;
    (missing, stale)."""
    keep, missing, n, nbytes = set(), 0, 0, 0
    for label, e in shipped_entries(modules, CubinCache(folder, read_only=True)):
        n += 1
        if e is None:
            missing += 1
            out(f"{label}: MISSING")
            continue
        keep.update((e.cubin.name, e.sidecar.name))
        nbytes += e.cubin.stat().st_size
        out(f"{label}: {e.cubin.name} ({e.toolchain}, {e.cubin.stat().st_size / 1e6:.1f} MB)")
    stale = stale_files(folder, keep)
    for p in stale:
        out(f"stale: {p.name}")
    out(f"{n} cubins: {n - missing} present ({nbytes / 1e6:.1f} MB), {missing} missing, {len(stale)} stale files")
    return missing, len(stale)


def stale_files(folder: Path, keep: Any) -> List[Path]:
    return sorted(p for p in folder.glob("*") if p.suffix in (".cubin", ".json") and p.name not in keep)


def libraries(default: Optional[str], per_arch: Sequence[str]) -> Dict[int, List[Optional[str]]]:
    """{arch: the NVRTC libraries to build it with}: --nvrtc, or those --nvrtc-for ARCH=LIB names for
    that arch (one per toolchain of SHIP_NVRTC)."""
    libs: Dict[int, List[Optional[str]]] = {}
    for item in per_arch:
        arch, sep, lib = item.partition("=")
        if not sep or not arch.isdigit() or int(arch) not in SHIP_SMS:
            raise UsageError(f"--nvrtc-for {item!r}: give ARCH=LIBRARY, ARCH one of {sorted(SHIP_SMS)}")
        libs.setdefault(int(arch), []).append(lib)
    return {arch: libs.get(arch, [default]) for arch in SHIP_SMS}


def check_toolchains(libs: Dict[int, List[Optional[str]]], archs: Sequence[int]) -> None:
    """Each arch's compilers are SHIP_NVRTC's, one per toolchain (its version string starts so), before
    anything is built."""
    for arch in sorted(set(archs)):
        got = [aot.pick_compiler("auto", library=lib).for_arch(arch).toolchain for lib in libs[arch]]
        want = SHIP_NVRTC[arch]
        if sorted(next((w for w in want if g.startswith(w)), g) for g in got) != sorted(want):
            flags = " ".join(f"--nvrtc-for {arch}=LIBRARY" for _ in want)
            raise UsageError(f"sm_{arch} ships cubins of {' and '.join(want)}, and this would build them with "
                             f"{' and '.join(got)}: name those NVRTCs (--nvrtc, or {flags})")


def _build(job: Tuple[aot.Module, Optional[str], str]) -> Tuple[int, List[str]]:
    """In a worker process: build one module into the folder with the named NVRTC (else pick_compiler's)."""
    m, library, folder = job
    lines: List[str] = []
    compiler = aot.pick_compiler("auto", library=library).for_arch(m.arch)
    return aot.build_module(m, compiler, CubinCache(Path(folder)), lines.append, NAME), lines


def build(modules: Sequence[aot.Module], folder: Path, libs: Dict[int, Optional[str]], jobs: int, out: Out) -> int:
    """Build every module missing from the folder (jobs at a time), each arch with its NVRTCs (libs),
    then remove the stale files."""
    failures = 0
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for fails, lines in pool.map(_build, [(m, lib, str(folder)) for m in modules for lib in libs[m.arch]]):
            failures += fails
            for line in lines:
                out(line)
    if failures:
        return failures
    found = shipped_entries(modules, CubinCache(folder, read_only=True))
    keep = {n for _, e in found if e for n in (e.cubin.name, e.sidecar.name)}
    for p in stale_files(folder, keep):
        p.unlink()
        out(f"removed {p.name}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nvrtc", default=None, help="libnvrtc.so (or its folder) to build with: CUDA 11.8's")
    ap.add_argument("--nvrtc-for", action="append", default=[], metavar="ARCH=LIB",
                    help="another NVRTC for one arch (repeatable, also per arch): 90=CUDA 12.2's, 90=13.0's")
    ap.add_argument("--dry-run", action="store_true", help="list the modules and files; build nothing")
    ap.add_argument("--jobs", type=int, default=2, help="modules compiled side by side (one process each)")
    ap.add_argument("--into", default=str(shipped_cubins_dir()), help="the folder (default: the package's)")
    args = ap.parse_args(argv)
    modules = plan(load_weights(default_weights_path()))
    folder = Path(args.into)
    if not args.dry_run:
        try:
            libs = libraries(args.nvrtc, args.nvrtc_for)
            check_toolchains(libs, [m.arch for m in modules])
        except UsageError as e:   # one line, exit 2, nothing built
            print(f"build_kernels: {e}", file=sys.stderr)
            return 2
        failures = build(modules, folder, libs, args.jobs, print)
        if failures:
            print(f"{failures} module(s) not built", file=sys.stderr)
            return 1
    missing, stale = listing(modules, folder, print)
    return 1 if missing or stale else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The machine code of the kernels' main loops, without a GPU: what each `mma` loop of a GEMM conv
costs in instructions, for changing a mainloop on a machine with no device (docs/kernels.md).

    python -m tools.lab.sass_loops --kernels 256x64x16_4x2_v8_r2      # the shipped model's sm_87 8-SM module
    python -m tools.lab.sass_loops --arch 90 --sms 132 --kernels _s3_
    python -m tools.lab.sass_loops --cubin m.cubin --kernels conv3x3  # a cubin built elsewhere

Builds the module the executor would load for the shipped model (fp16, `--arch`, `--sms`; the tiles
of the shipped tuning files for that SM count: jetson_unet.build.aot.plan_modules) with the compiler
`jetson-sample --prepare` would pick, disassembles it with nvdisasm (the CUDA toolkit's, or the pip
wheel `nvidia-cuda-nvdisasm`'s: no GPU needed) and, for each kernel whose name contains one of
`--kernels`, prints every loop that holds an `mma` (HMMA): its static instructions, HMMA, ldmatrix
(LDSM), cp.async (LDGSTS), barriers and local-memory accesses (spills: LDL/STL), the loop that holds
the barrier first. A loop's dynamic cost per trip is its static count where it has no inner loop;
the inner `mma` loop of the halo conv's row tiles runs three trips (kx) per chunk.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from jetson_unet.errors import UsageError

COUNTED = {"hmma": "HMMA", "ldsm": "LDSM", "ldgsts": "LDGSTS", "bar": "BAR.SYNC", "local": ("LDL", "STL")}
FUNC = re.compile(r"^//-+ \.text\.(\S+)\s+-+")
LABEL = re.compile(r"^(\.L_x_\d+):")
BRANCH = re.compile(r"BRA `\((\.L_x_\d+)\)")
INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/")


def functions(sass: str) -> Dict[str, List[str]]:
    """nvdisasm's text -> {kernel: its lines (labels and instructions)}."""
    out: Dict[str, List[str]] = {}
    cur: Optional[List[str]] = None
    for line in sass.splitlines():
        m = FUNC.match(line)
        if m:
            cur = out.setdefault(m.group(1), [])
        elif cur is not None and (LABEL.match(line) or INSTR.search(line)):
            cur.append(line)
    return out


def counts(lines: Sequence[str]) -> Dict[str, int]:
    """Instructions of `lines` and how many of each counted kind."""
    instr = [x for x in lines if INSTR.search(x)]
    row = {"instructions": len(instr)}
    for name, ops in COUNTED.items():
        ops = ops if isinstance(ops, tuple) else (ops,)
        row[name] = sum(any(f" {op}" in x for op in ops) for x in instr)
    return row


def mma_loops(lines: Sequence[str]) -> List[Dict[str, int]]:
    """Every loop (a backward branch to a label) that holds an HMMA, outermost first. Branches after
    the body's last plain EXIT are not loops: ptxas's fallbacks for divergent shuffles, which jump
    back into the body."""
    labels = {m.group(1): i for i, line in enumerate(lines) for m in [LABEL.match(line)] if m}
    body_end = max((i for i, line in enumerate(lines) if re.search(r"\*/\s+EXIT ;", line)), default=len(lines))
    loops = []
    for end, line in enumerate(lines[:body_end]):
        m = BRANCH.search(line)
        if m and labels.get(m.group(1), end) < end:
            row = counts(lines[labels[m.group(1)]:end + 1])
            if row["hmma"]:
                loops.append(dict(row, start=labels[m.group(1)], end=end))
    loops.sort(key=lambda r: (r["start"], -r["end"]))
    return [r for i, r in enumerate(loops) if r not in loops[:i]]   # one row per distinct loop


def report(kernels: Dict[str, List[str]], patterns: Sequence[str]) -> List[dict]:
    """Rows for each kernel whose name contains a pattern: the kernel's totals, then its mma loops."""
    rows = []
    for name in sorted(k for k in kernels if any(p in k for p in patterns)):
        rows.append(dict(counts(kernels[name]), kernel=name, loop="whole"))
        rows += [dict(r, kernel=name, loop=f"loop {i + 1}") for i, r in enumerate(mma_loops(kernels[name]))]
    return rows


def lines_of(rows: Sequence[dict]) -> List[str]:
    out = [f"{'kernel':56s} {'part':8s} {'instr':>6s} {'HMMA':>5s} {'LDSM':>5s} {'LDGSTS':>6s} {'BAR':>4s} {'LDL/STL':>7s}"]
    for r in rows:
        out.append(f"{r['kernel'][:56]:56s} {r['loop']:8s} {r['instructions']:6d} {r['hmma']:5d} {r['ldsm']:5d} "
                   f"{r['ldgsts']:6d} {r['bar']:4d} {r['local']:7d}")
    return out


def find_nvdisasm(given: Optional[str] = None) -> str:
    """--nvdisasm, $NVDISASM, PATH, beside nvcc, or the pip wheel nvidia-cuda-nvdisasm's; UsageError if none."""
    from jetson_unet.build.compilers import find_nvcc
    cands = [given, os.environ.get("NVDISASM"), shutil.which("nvdisasm")]
    nvcc = find_nvcc()
    if nvcc:
        cands.append(os.path.join(os.path.dirname(nvcc), "nvdisasm"))
    try:
        import nvidia   # the pip wheel: nvidia/cu13/bin/nvdisasm (CUDA 13) or nvidia/cuda_nvdisasm/bin/nvdisasm
        for root in getattr(nvidia, "__path__", []):
            cands += [str(p) for p in Path(root).glob("*/bin/nvdisasm")]
    except ImportError:
        pass
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    if given:
        raise UsageError(f"--nvdisasm {given}: not an executable file")
    raise UsageError("no nvdisasm: install the CUDA toolkit or `pip install nvidia-cuda-nvdisasm`, or give --nvdisasm")


def build_cubin(arch: int, sms: int) -> bytes:
    """The shipped model's fp16 module for (arch, sms), compiled as `jetson-sample --prepare` would."""
    from jetson_unet.build import aot
    from jetson_unet.build.sources import nvrtc_options
    from jetson_unet.model.weights import load_weights
    from jetson_unet.pipeline import default_weights_path
    weights = load_weights(default_weights_path())
    modules = [m for m in aot.plan_modules(weights, aot.Target(arch, (sms,), f"sm_{arch}"), "fp16", (1,)) if sms in m.sms]
    comp = aot.pick_compiler("auto").for_arch(arch)
    return comp.build(modules[0].source, "seed-unet.cu", tuple(nvrtc_options(arch)), arch)


def disassemble(cubin: bytes, nvdisasm: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.cubin"
        path.write_bytes(cubin)
        r = subprocess.run([nvdisasm, "-c", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        raise UsageError(f"nvdisasm failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    return r.stdout


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--kernels", nargs="+", required=True, help="parts of kernel names (any one matches)")
    ap.add_argument("--arch", type=int, default=87, help="target arch (default: 87, the Orin)")
    ap.add_argument("--sms", type=int, default=8, help="the module of this SM count (default: 8)")
    ap.add_argument("--cubin", type=Path, default=None, help="disassemble this cubin instead of building")
    ap.add_argument("--nvdisasm", default=None, help="the nvdisasm executable")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows to this JSON file")
    args = ap.parse_args(argv)
    try:
        if args.cubin is not None and not args.cubin.is_file():
            raise UsageError(f"--cubin {args.cubin}: no such file")
        if args.arch < 70 or args.sms < 1:
            raise UsageError("--arch must be 70 or newer and --sms at least 1")
        tool = find_nvdisasm(args.nvdisasm)
        cubin = args.cubin.read_bytes() if args.cubin else build_cubin(args.arch, args.sms)
        rows = report(functions(disassemble(cubin, tool)), args.kernels)
        if not rows:
            raise UsageError(f"no kernel matches {' '.join(args.kernels)}")
    except UsageError as e:
        print(f"sass_loops: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines_of(rows)))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

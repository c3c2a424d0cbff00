#!/usr/bin/env python3
"""What a kernel's machine code costs the GPU when it is not in the SMs' instruction caches: why a
large kernel runs slower inside the U-Net call's graph, after other kernels, than launched again
and again on its own (docs/kernels.md, code size).

    python -m tools.lab.icache                       # the whole GPU
    python -m tools.lab.icache --sms 8               # an 8-SM slice (a CUDA green context)
    python -m tools.lab.icache --sizes 12,24,48,96 --json $OUT/icache.json

For each size S, two kernels A and B of S KB of straight-line code each (FFMA with an immediate in
four independent chains: as fast as the SM issues them when the code is at hand), one CTA of 128
threads per SM, and a kernel F that reads --flush-mb of memory (the L2 holds nothing of A's after
it). Each row is a CUDA graph of ten rounds, timed with events (median of --repeats), and the
penalties are per launch of A or B:

    hot           [A] x 10: A's code stays in the SMs' caches
    after a kernel  ([A, B] x 10 - [A] x 10 - [B] x 10) / 2: each evicts the other's code from the SMs,
                    which fetch it again from L2
    after L2 flush  ([A, B, F] x 10 - [A] x 10 - [B] x 10 - [F] x 10) / 2: the code comes from memory,
                    unless both kernels fit the SM's own caches (then this is no more than the row above)
    from memory     ([K1 .. Kn, F] x 10 - their n hot times - [F] x 10) / n: a cycle of n distinct
                    kernels of the size (A, B and more), n = max(2, ceil(EVICT_KB / S)), so that no SM cache holds a
                    kernel's code when its turn comes again, and the flush: every launch fetches its
                    code from memory, as each of a U-Net call's ~30 kernels does once per call on a
                    Jetson, whose L2 of a few MB the call's weights pass through

Needs the cupy backend (graphs).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import numpy as np

from jetson_unet.errors import UsageError

FFMA_BYTES = 16   # one SASS instruction
THREADS = 128
ROUNDS = 10
EVICT_KB = 256    # code in a cycle that no SM's instruction caches hold (an H100 / H200 SM: 48 KB fit
                  # with another 48 KB kernel beside them, 96 KB do not)


def cycle_length(kb: int) -> int:
    """How many distinct kernels of kb KB the "from memory" row cycles through."""
    return max(2, -(-EVICT_KB // kb))


def straight_line_source(name: str, kb: int, seed: int) -> str:
    """An extern "C" kernel of about kb KB of code: kb * 1024 / 16 FFMAs, each with its own immediate
    (so no two are one instruction), over four independent chains."""
    rng = np.random.default_rng(seed)
    lines = [f'extern "C" __global__ void {name}(float *o, float a) {{',
             "    float x0 = a + threadIdx.x, x1 = x0 * 1.5f, x2 = x0 * 2.5f, x3 = x0 * 3.5f;"]
    for i in range(kb * 1024 // FFMA_BYTES):
        lines.append(f"    x{i % 4} = fmaf(x{i % 4}, a, {rng.uniform(-1, 1):.7f}f);")
    lines.append("    o[blockIdx.x * blockDim.x + threadIdx.x] = x0 + x1 + x2 + x3;\n}")
    return "\n".join(lines)


FLUSH_SOURCE = r'''
extern "C" __global__ void flush_read(const float4 *p, unsigned long long n, float *sink) {
    float a = 0.0f;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        a += p[i].x;
    if (a == 1234.5f) *sink = a;   // never: keeps the loads
}
'''


def penalties(us: Dict[str, float], n: int) -> Dict[str, float]:
    """Per-launch figures (us) from the rows' times per round: hot A, and what a launch of A or B
    pays after the other kernel, after the other kernel and the flush, and in the cycle of n kernels
    and the flush (row "C"; its kernels beyond A and B counted at A's and B's mean hot time)."""
    a, b, f = us["A"], us["B"], us["F"]
    return {"hot_us": a,
            "after_kernel_us": (us["AB"] - a - b) / 2.0,
            "after_flush_us": (us["ABF"] - a - b - f) / 2.0,
            "from_memory_us": (us["C"] - a - b - (n - 2) * (a + b) / 2.0 - f) / n,
            "cycle": n}


def check(args: argparse.Namespace) -> List[int]:
    """The sizes in KB; UsageError for arguments no run can take."""
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        raise UsageError(f"--sizes takes KB as integers separated by commas, not {args.sizes!r}") from None
    if not sizes or any(not 1 <= s <= 512 for s in sizes):
        raise UsageError("--sizes must be between 1 and 512 KB each")
    if args.repeats < 1 or args.flush_mb < 1 or (args.sms is not None and args.sms < 1):
        raise UsageError("--repeats, --flush-mb and --sms must be at least 1")
    return sizes


def round_us(be, s, seq: Sequence[Callable[[], None]], repeats: int) -> float:
    """us per round of a CUDA graph of ROUNDS rounds of the launches `seq` on stream s."""
    from jetson_unet.bench.timing import timed
    be.capture_begin(s)
    for _ in range(ROUNDS):
        for step in seq:
            step()
    g = be.capture_end(s)
    return 1000.0 * timed(be, s, lambda: g.launch(s), 3, 10, repeats) / ROUNDS


def measure(sizes: Sequence[int], sms, flush_mb: int, repeats: int) -> List[Dict[str, float]]:
    from jetson_unet.backends import get_backend
    be = get_backend("cupy", sms)
    s = be.stream()
    nsm = sms or be.sm_count()
    out, sink, buf = be.alloc(nsm * THREADS * 4), be.alloc(16), be.alloc(flush_mb << 20)
    flush = be.compile_source(FLUSH_SOURCE, "icache_flush.cu", ("-std=c++17",), ("flush_read",)).get("flush_read")
    fargs = (np.uint64(buf.ptr), np.uint64((flush_mb << 20) // 16), np.uint64(sink.ptr))
    rows = []
    try:
        for kb in sizes:
            n = cycle_length(kb)
            names = ["icache_a", "icache_b"] + [f"icache_c{i}" for i in range(2, n)]
            src = "\n".join(straight_line_source(name, kb, i + 1) for i, name in enumerate(names))
            mod = be.compile_source(src, f"icache_{kb}.cu", ("-std=c++17",), tuple(names))
            kargs = (np.uint64(out.ptr), np.float32(0.3))
            ks = [mod.get(name) for name in names]
            launch = [lambda k=k: k.launch((nsm,), (THREADS,), kargs, 0, s) for k in ks]
            steps = {"A": launch[0], "B": launch[1], "F": lambda: flush.launch((4 * nsm,), (256,), fargs, 0, s)}
            seqs = {row: [steps[k] for k in row] for row in ("A", "B", "F", "AB", "ABF")}
            seqs["C"] = launch + [steps["F"]]
            rows.append({"kb": kb, **penalties({row: round_us(be, s, seq, repeats) for row, seq in seqs.items()}, n)})
    finally:
        for d in (out, sink, buf):
            d.free()
    return rows


def report(rows: List[Dict[str, float]]) -> List[str]:
    lines = [f"{'code KB':>8s} {'hot us':>8s} {'after a kernel':>15s} {'after L2 flush':>15s} {'from memory':>12s} "
             f"{'kernels':>8s}"]
    for r in rows:
        lines.append(f"{r['kb']:8d} {r['hot_us']:8.2f} {r['after_kernel_us']:+15.2f} {r['after_flush_us']:+15.2f} "
                     f"{r['from_memory_us']:+12.2f} {r['cycle']:8d}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--sizes", default="12,24,48,96,160", help="KB of code per kernel (default: 12,24,48,96,160)")
    ap.add_argument("--sms", type=int, default=None, help="on a slice of N SMs (a CUDA green context)")
    ap.add_argument("--flush-mb", type=int, default=128, help="memory the flush kernel reads (default: 128)")
    ap.add_argument("--repeats", type=int, default=5, help="timed windows per row (default: 5)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows to this JSON file")
    args = ap.parse_args(argv)
    try:
        sizes = check(args)
    except UsageError as e:   # one line, exit 2, before the GPU is touched
        print(f"icache: {e}", file=sys.stderr)
        return 2
    rows = measure(sizes, args.sms, args.flush_mb, args.repeats)
    print("\n".join(report(rows)))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

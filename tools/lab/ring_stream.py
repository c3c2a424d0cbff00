#!/usr/bin/env python3
"""How fast a persistent CTA can stream weights from L2 through a `cp.async` ring in shared memory,
on the whole GPU or on a slice of N SMs: the precondition of a kernel that keeps a whole
low-resolution level on chip (docs/kernels.md, the persistent kernel per level).

    python -m tools.lab.ring_stream --sms 8

Each CTA streams its own region of a 24 MB buffer (L2-resident; twice, and at least 4 MB) through a ring of STAGES slots of
STAGE bytes: wait for the oldest slot, one barrier, refill the slot every warp has finished with,
then consume the slot just waited for: nothing (`copy`), `ldmatrix` of every byte by one warp
(`ldmatrix`), or `ldmatrix` plus the `mma.sync` a batch-1 8x8-level conv runs on it (M = 64: 8
`m16n8k16` per 512 bytes of weights; `mma`). Beside it, the read rate of plain 16-byte register
loads (1024 threads, 8 in flight each). Timed with CUDA events, the median of `--repeats` launches.
"""
from __future__ import annotations

import argparse
import itertools
import sys
from typing import Any, List, Optional, Tuple

import numpy as np

from jetson_unet.bench.timing import timed
from tools.lab import cupy_backend

SOURCE = r"""
typedef unsigned int u32;
__device__ __forceinline__ void cpa16(u32 s, const void *g) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(g));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wait_group() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void ldm4(u32 r[4], u32 a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void mma(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// STAGE bytes a slot, STAGES slots; CONSUME 0 copy, 1 ldmatrix, 2 ldmatrix + mma (M = 64)
extern "C" __global__ void __launch_bounds__(NT, 1)
ring(const uint4 *src, long long span, int units, unsigned *sink) {
    extern __shared__ __align__(128) unsigned char sm[];
    constexpr int VPU = STAGE / 16, VPT = VPU / NT, X4 = STAGE / 512, W = NT / 32;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const u32 base = (u32)__cvta_generic_to_shared(sm);
    const uint4 *region = src + (long long)blockIdx.x * span;
    long long next = 0;   // the next unit's offset in the region (span: whole units), no division
    auto issue = [&](int slot) {
        const uint4 *g = region + next;
        next = next + VPU == span ? 0 : next + VPU;
        const u32 s = base + slot * STAGE;
#pragma unroll
        for (int i = 0; i < VPT; ++i) cpa16(s + (tid + i * NT) * 16, g + tid + i * NT);
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) { if (s < units) issue(s); commit(); }
    u32 x = 0;
    float acc[4][2][4] = {};
    u32 a[4][4];
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
        for (int q = 0; q < 4; ++q) a[m][q] = (tid * 0x00010001u + m * 977u + q) & 0x3bff3bffu;
    int slot = 0, fill = STAGES - 1;   // the slot being consumed, the slot to refill
    for (int u = 0; u < units; ++u) {
        wait_group<STAGES - 2>();
        __syncthreads();
        if (u + STAGES - 1 < units) issue(fill);
        fill = fill + 1 == STAGES ? 0 : fill + 1;
        commit();
        if (CONSUME) {
            const u32 s = base + slot * STAGE + lane * 16;
            for (int j = warp; j < X4; j += W) {
                u32 r[4];
                ldm4(r, s + j * 512);
                if (CONSUME == 2) {
#pragma unroll
                    for (int m = 0; m < 4; ++m) { mma(acc[m][0], a[m], r[0], r[1]); mma(acc[m][1], a[m], r[2], r[3]); }
                } else {
                    x ^= r[0] ^ r[1] ^ r[2] ^ r[3];
                }
            }
        }
        slot = slot + 1 == STAGES ? 0 : slot + 1;
    }
    float f = 0.0f;
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
        for (int n = 0; n < 2; ++n) f += acc[m][n][0] + acc[m][n][1] + acc[m][n][2] + acc[m][n][3];
    if (x == 0x12345678u || f == 1234.5f) sink[blockIdx.x] = x;
}

__device__ __forceinline__ uint4 ldcg(const uint4 *p) {
    uint4 r;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}
extern "C" __global__ void regs(const uint4 *p, long long n, int reps, unsigned *sink) {
    uint4 acc = make_uint4(0, 0, 0, 0);
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (int r = 0; r < reps; ++r)
        for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += 8 * stride) {
            uint4 v[8];
#pragma unroll
            for (int k = 0; k < 8; ++k) v[k] = i + k * stride < n ? ldcg(p + i + k * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int k = 0; k < 8; ++k) acc.x ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
        }
    if (acc.x == 0x12345678u) sink[0] = acc.x;
}
"""
BUF = 24 << 20
KIND = {"copy": 0, "ldmatrix": 1, "mma": 2}


def ring_rate(cp: Any, backend: Any, stream: Any, buf: Any, sink: Any, sms: int, nt: int, stage: int,
              stages: int, kind: str, per_sm: int, repeats: int) -> float:
    """GB/s of the ring kernel over the slice (bytes that reached shared memory / time)."""
    opts = ("-std=c++17", f"-DNT={nt}", f"-DSTAGE={stage}", f"-DSTAGES={stages}", f"-DCONSUME={KIND[kind]}")
    fn = cp.RawModule(code=SOURCE, options=opts).get_function("ring")
    smem = stage * stages
    fn.max_dynamic_shared_size_bytes = smem
    ctas = sms * per_sm
    span = BUF // 16 // ctas // (stage // 16) * (stage // 16)   # whole slots: no read past the region
    units = max(2 * span * 16, 4 << 20) // stage   # its region twice, and at least 4 MB a CTA
    t = timed(backend, stream, lambda: fn((ctas,), (nt,), (buf, np.int64(span), np.int32(units), sink),
                                          stream=stream, shared_mem=smem), 1, 1, repeats) * 1e-3
    return ctas * units * stage / t / 1e9


def regs_rate(cp: Any, backend: Any, stream: Any, buf: Any, sink: Any, sms: int, repeats: int) -> float:
    """GB/s of 16-byte register loads, one CTA of 1024 threads per SM (the module builds with any
    valid ring macros)."""
    fn = cp.RawModule(code=SOURCE, options=("-std=c++17", "-DNT=256", "-DSTAGE=4096", "-DSTAGES=2",
                                            "-DCONSUME=0")).get_function("regs")
    n, reps = BUF // 16, 4
    t = timed(backend, stream, lambda: fn((sms,), (1024,), (buf, np.int64(n), np.int32(reps), sink), stream=stream),
              1, 1, repeats) * 1e-3
    return BUF * reps / t / 1e9


def configs(per_sm: List[int], threads: List[int], stage_kb: List[int], in_flight_kb: List[int],
            smem_kb: int = 220) -> List[Tuple[int, int, int, int]]:
    """(CTAs per SM, threads, slot bytes, slots) of every combination that runs: whole slots in
    flight (STAGES - 1 of them), every thread copying whole 16-byte vectors of a slot, and the rings
    of an SM's CTAs within `smem_kb`."""
    out = []
    for ps, nt, skb, fkb in itertools.product(per_sm, threads, stage_kb, in_flight_kb):
        stage, stages = skb << 10, fkb // skb + 1
        if fkb % skb == 0 and stages >= 2 and stage % (16 * nt) == 0 and stage * stages * ps <= smem_kb << 10:
            out.append((ps, nt, stage, stages))
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sms", type=int, default=None, help="run on a slice of N SMs (default: the whole GPU)")
    ap.add_argument("--threads", type=int, nargs="+", default=[128, 256, 512], help="threads a CTA")
    ap.add_argument("--stage-kb", type=int, nargs="+", default=[8, 16, 32, 64], help="bytes a slot, in KB")
    ap.add_argument("--in-flight-kb", type=int, nargs="+", default=[64, 128],
                    help="(STAGES - 1) x STAGE per CTA, the ring's bytes in flight, in KB")
    ap.add_argument("--per-sm", type=int, nargs="+", default=[1, 2], help="CTAs per SM")
    ap.add_argument("--kinds", nargs="+", default=list(KIND), choices=list(KIND))
    ap.add_argument("--repeats", type=int, default=5, help="timed launches; the median is kept")
    return ap


def usage_error(args: argparse.Namespace) -> Optional[str]:
    if args.sms is not None and args.sms < 1:
        return "--sms must be >= 1"
    if args.repeats < 1 or min(args.per_sm + args.stage_kb + args.in_flight_kb) < 1:
        return "--repeats, --per-sm, --stage-kb and --in-flight-kb must be >= 1"
    if any(t % 32 or not 32 <= t <= 1024 for t in args.threads):
        return "--threads must be multiples of 32 from 32 to 1024"
    if not configs(args.per_sm, args.threads, args.stage_kb, args.in_flight_kb):
        return "no ring fits: slots must hold 16 bytes a thread and the rings of an SM 220 KB"
    return None


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    err = usage_error(args)
    if err is not None:
        print(f"ring_stream: {err}", file=sys.stderr)
        return 2
    backend = cupy_backend("ring_stream", args.sms)
    if backend is None:
        return 2
    cp, stream, sms = backend.cp, backend.stream(), backend.sm_count()
    with stream:
        buf = cp.ones(BUF // 4, cp.uint32)
        sink = cp.zeros(4 * sms, cp.uint32)
    print(f"{backend.device_name()}, {sms} SMs; 16-byte register loads, 1024 threads a CTA, 1 CTA an SM: "
          f"{regs_rate(cp, backend, stream, buf, sink, sms, args.repeats):.0f} GB/s")
    print("CTAs/SM threads stage_KB stages in_flight_KB/SM kind GB/s")
    for (per_sm, nt, stage, stages), kind in itertools.product(
            configs(args.per_sm, args.threads, args.stage_kb, args.in_flight_kb), args.kinds):
        gbs = ring_rate(cp, backend, stream, buf, sink, sms, nt, stage, stages, kind, per_sm, args.repeats)
        print(f"{per_sm} {nt} {stage >> 10} {stages} {(stages - 1) * (stage >> 10) * per_sm} {kind} {gbs:.0f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

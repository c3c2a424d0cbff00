"""How fast can the U-Net's convolutions be as plain GEMMs on this GPU, with mma.sync (the only tensor
core instruction the Orin's sm_87 has) and with Hopper's wgmma? (the `train` extra: torch, triton)

Every GEMM op of one U-Net call at --batch (3x3 and 1x1 convs as their implicit GEMMs, M = B*H*W,
N = Cout, K = the op's multiply-adds per output / N, padded to 64; gates as one GEMM of their
g + r inputs) is timed, each in a process of its own:

- ours: the op's launch(es) in our executor (jetson_unet.bench.timing.per_op_times), the whole fused op;
- triton-v2: a dense Triton matmul (no im2col, no epilogue) with DISABLE_MMA_V3=1, so on sm_90 it
  compiles to mma.sync + ldmatrix + cp.async (the PTX is checked), best of CONFIGS per shape;
- triton-v3: the same kernel and configs with Triton's default (wgmma on sm_90);
- cublas: torch.mm on the same operands; cudnn: F.conv2d NHWC fp16 with cudnn.benchmark for the
  3x3 convs (the convolution the torch peers run), with the name of the kernel it ran (sm90 ones
  use wgmma);
- peer-profile: the torch.compile fp16 peer under torch.profiler, GPU time per call by kernel kind.

Each time is a CUDA graph of 20 back-to-back calls, replayed and timed with events (median of 5
windows), as per_op_times times ours. The report ends with bounds: our graphed call with every op's
time replaced by its fastest among ever wider sets of kernels (bounds()). The other kernels do less
than ours (no GroupNorm, GELU, statistics or residual; the dense GEMMs no im2col, which makes them
memory-bound where the im2col'd operand outgrows the L2, the 64x64 level at batch 16).

    python3 -m tools.lab.gemm_ceiling --batch 16 --json $OUT/ceiling.json
    python3 -m tools.lab.gemm_ceiling --batch 1 --sms 8 --skip triton-v3 peer-profile   # the Orin's regime
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from typing import Dict, List, Optional, Tuple

from jetson_unet.model import cost
from jetson_unet.model import plan as P
from jetson_unet.model.config import UNetConfig
from tools.peers import torch_slice

KPAD = 64
JOBS = ("ours", "torch", "triton-v3", "triton-v2", "peer-profile")
# (BM, BN, BK, stages, warps, split-K): kept to BN <= N; split K for grids under two waves
CONFIGS = ((128, 64, 64, 3, 4, 1), (128, 64, 32, 4, 4, 1), (64, 64, 64, 3, 4, 1), (64, 64, 32, 4, 4, 1),
           (128, 32, 64, 4, 4, 1), (64, 32, 64, 4, 4, 1), (128, 128, 64, 3, 8, 1), (128, 128, 32, 4, 4, 1),
           (64, 128, 64, 3, 4, 1), (256, 64, 64, 3, 8, 1), (128, 256, 64, 3, 8, 1), (256, 128, 64, 3, 8, 1),
           (64, 64, 64, 3, 4, 2), (64, 64, 64, 3, 4, 4), (64, 128, 64, 3, 4, 4), (64, 64, 64, 3, 4, 8),
           (128, 64, 64, 3, 4, 2), (128, 128, 64, 3, 8, 4))
SPLIT_MAX_CTAS = 264


def gemm_shapes(cfg: UNetConfig, batch: int) -> List[Dict]:
    """One row per GEMM op of the plan (depthwise convs, the 7x7 init conv and the 3-channel final
    conv left out): op name, class, M, N, K (padded to KPAD), the 3x3 conv's Cin, FLOPs."""
    plan = P.build_plan(cfg)
    rows = []
    for op in plan.ops:
        if op.kind == P.CAT:
            continue
        c = cost.op_cost(plan, op)
        out = plan.tensors[op.out]
        n = plan.tensors[op.inputs[0]].channels if op.kind == P.GATE else out.channels
        if c.op_class not in ("conv3x3", "conv1x1", "gate") or n < 16:
            continue
        hw = out.size * out.size
        k = n + plan.tensors[op.inputs[1]].channels if op.kind == P.GATE else round(c.flops / (2 * hw * n))
        cin = plan.tensors[op.x].channels if op.kind == P.CONV else 0
        rows.append({"op": op.out, "cls": c.op_class, "size": out.size, "M": batch * hw, "N": n,
                     "K": -(-k // KPAD) * KPAD, "cin": cin if c.op_class == "conv3x3" else 0,
                     "flops": batch * c.flops})
    return rows


def shape_key(r: Dict) -> tuple:
    return (r["M"], r["N"], r["K"], r["cin"])


def distinct(rows: List[Dict]) -> List[Dict]:
    """The first row of each GEMM shape: the library jobs time each shape once."""
    first: Dict[tuple, Dict] = {}
    for r in rows:
        first.setdefault(shape_key(r), r)
    return list(first.values())


def share_by_shape(result: Dict, rows: List[Dict]) -> None:
    """Give every op the figures a library job measured for the first op of its shape."""
    first = {shape_key(r): r["op"] for r in distinct(rows)}
    for per_op in result.values():
        if isinstance(per_op, dict):
            for r in rows:
                if first[shape_key(r)] in per_op:
                    per_op[r["op"]] = per_op[first[shape_key(r)]]


def graph_us(fn, reps: int = 20, windows: int = 5) -> float:
    """Median us per call: a CUDA graph of `reps` calls of fn, replayed and timed with events."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    per = []
    for _ in range(windows):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(5):
            g.replay()
        e1.record()
        e1.synchronize()
        per.append(1000.0 * e0.elapsed_time(e1) / (5 * reps))
    return statistics.median(per)


def _operands(r: Dict):
    import torch
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(r["M"], r["K"], device="cuda", generator=g).half()
    b = torch.randn(r["K"], r["N"], device="cuda", generator=g).half() / r["K"] ** 0.5
    return a, b


try:   # the `train` extra; the shapes and the report need neither
    import triton
    import triton.language as tl
except ImportError:
    triton = None

if triton is not None:
    @triton.jit
    def _mm(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr):
        # a (M, K), b (K, N), c (M, N) row-major; M % BM == N % BN == K % (BK * SPLIT) == 0
        pm, pn, ps = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        kper = K // SPLIT
        rk = ps * kper + tl.arange(0, BK)
        ap = a + rm[:, None] * K + rk[None, :]
        bp = b + rk[:, None] * N + rn[None, :]
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for _ in range(0, kper, BK):
            acc += tl.dot(tl.load(ap), tl.load(bp))
            ap += BK
            bp += BK * N
        cp = c + rm[:, None] * N + rn[None, :]
        if SPLIT == 1:
            tl.store(cp, acc.to(tl.float16))
        else:
            tl.atomic_add(cp, acc)


def run_triton(mma: str, rows: List[Dict], sms: Optional[int] = None) -> Dict:
    """Best dense-GEMM time per op over CONFIGS, in a fresh process whose environment says whether
    wgmma is allowed (DISABLE_MMA_V3, set by main before the process starts)."""
    import torch
    if (os.environ.get("DISABLE_MMA_V3") == "1") != (mma == "v2"):
        raise SystemExit(f"triton-{mma}: DISABLE_MMA_V3 is {os.environ.get('DISABLE_MMA_V3')!r}")
    torch_slice(sms)
    out = {"mma": mma, "device": torch.cuda.get_device_name(), "triton": triton.__version__, "ops": {}, "isa": {}}
    for r in rows:
        a, b = _operands(r)
        ref = (a.float() @ b.float())
        M, N, K = r["M"], r["N"], r["K"]
        best: Optional[Tuple[float, tuple]] = None
        for cfg in CONFIGS:
            bm, bn, bk, stages, warps, split = cfg
            if bn > max(32, N) or M % bm or N % bn or K % (bk * split):
                continue
            if split > 1 and (M // bm) * (N // bn) > SPLIT_MAX_CTAS:
                continue
            c = torch.empty(M, N, device="cuda", dtype=torch.float16 if split == 1 else torch.float32)

            def call(c=c, bm=bm, bn=bn, bk=bk, stages=stages, warps=warps, split=split):
                if split > 1:
                    c.zero_()
                return _mm[(M // bm, N // bn, split)](a, b, c, M, N, K, BM=bm, BN=bn, BK=bk, SPLIT=split,
                                                      num_stages=stages, num_warps=warps)
            try:
                k = call()
                torch.cuda.synchronize()
            except Exception as e:   # a config this Triton cannot build (smem, layout): skipped
                print(f"  {r['op']} {cfg}: {type(e).__name__}", flush=True)
                continue
            err = float((c.float() - ref).norm() / ref.norm())
            if err > 1e-2:
                raise SystemExit(f"triton {mma} {cfg} on {r['op']}: relative L2 {err:.2e}")
            ptx = getattr(k, "asm", {}).get("ptx", "")
            out["isa"][str(cfg)] = {"wgmma": ptx.count("wgmma.mma_async"), "mma.sync": ptx.count("mma.sync")}
            us = graph_us(call)
            if best is None or us < best[0]:
                best = (us, cfg)
        out["ops"][r["op"]] = {"us": best[0], "cfg": list(best[1])} if best else None
        print(f"  triton-{mma} {r['op']:24s} M{M} N{N} K{K}: {best[0] if best else float('nan'):.2f} us "
              f"{best[1] if best else ''}", flush=True)
    return out


def run_torch(rows: List[Dict], sms: Optional[int] = None) -> Dict:
    """cuBLAS torch.mm on the same operands; cuDNN conv2d NHWC for the 3x3 convs."""
    import torch
    import torch.nn.functional as F
    torch.backends.cudnn.benchmark = True
    torch_slice(sms)
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cublas": {}, "cudnn": {},
           "cudnn_kernels": {}}
    for r in rows:
        a, b = _operands(r)
        out["cublas"][r["op"]] = graph_us(lambda: torch.mm(a, b))
        if r["cin"]:
            bsz = r["M"] // (r["size"] ** 2)
            x = torch.randn(bsz, r["cin"], r["size"], r["size"], device="cuda").half()
            x = x.contiguous(memory_format=torch.channels_last)
            w = (torch.randn(r["N"], r["cin"], 3, 3, device="cuda") / (9 * r["cin"]) ** 0.5).half()
            w = w.contiguous(memory_format=torch.channels_last)
            for _ in range(3):   # cudnn.benchmark picks its algorithm outside the capture
                F.conv2d(x, w, padding=1)
            out["cudnn"][r["op"]] = graph_us(lambda: F.conv2d(x, w, padding=1))
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                F.conv2d(x, w, padding=1)
                torch.cuda.synchronize()
            out["cudnn_kernels"][r["op"]] = sorted({e.key[:120] for e in prof.key_averages()})
    return out


def _kind(name: str) -> str:
    n = name.lower()
    if "triton" in n:
        return "triton (fused elementwise, norms)"
    if any(w in n for w in ("conv", "fprop", "cudnn")):
        return "cuDNN convolutions"
    if any(w in n for w in ("gemm", "cutlass", "cublas", "nvjet", "xmma")):
        return "GEMMs"
    return "other"


def run_peer_profile(batch: int, sms: Optional[int] = None, calls: int = 20) -> Dict:
    """The torch.compile fp16 peer (default mode: the same kernels as reduce-overhead, launched
    one by one, which the profiler attributes reliably) under torch.profiler: GPU time per call by
    kernel kind, and the kernels that take the most."""
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile
    from jetson_unet.bench.timing import bench_weights
    from tools.peers import torch_model
    torch_slice(sms)
    weights = bench_weights()[0]
    cfg = weights.config
    fn, dtype = torch_model(weights, "fp16", "default")
    x = torch.from_numpy(np.random.default_rng(0).standard_normal(
        (batch, cfg.channels, cfg.image_size, cfg.image_size)).astype(np.float32)).cuda().to(dtype)
    t = torch.full((batch,), 50, dtype=torch.int64, device="cuda")
    with torch.inference_mode():
        for _ in range(5):
            fn(x, t)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn(x, t)
            torch.cuda.synchronize()
    kinds: Dict[str, float] = {}
    kernels = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None)
        us = getattr(e, "cuda_time_total", 0.0) if us is None else us
        if not us:
            continue
        per_call = us / calls
        kinds[_kind(e.key)] = kinds.get(_kind(e.key), 0.0) + per_call
        kernels.append((per_call, e.count // calls, e.key[:120]))
    kernels.sort(reverse=True)
    for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"  peer b{batch}: {v:7.1f} us per call  {k}", flush=True)
    for us, n, name in kernels[:25]:
        print(f"    {us:7.1f} us  x{n:<3d} {name}", flush=True)
    return {"kinds": kinds, "kernels": kernels[:60], "device": torch.cuda.get_device_name()}


def run_ours(batch: int, sms: Optional[int] = None) -> Dict:
    """Our launches timed alone, summed per op name, and the graphed call (bench_unet.bench_ours)."""
    from types import SimpleNamespace
    from jetson_unet.backends import get_backend
    from jetson_unet.bench.timing import bench_weights
    from tools.bench_unet import bench_ours
    row = bench_ours(bench_weights()[0], "fp16", batch, SimpleNamespace(warmup=20, iters=100, repeats=3, per_op=1),
                     get_backend("cupy", sms))
    return {"ops": row["per_op_us"], "tiles": row["tiles"], "call_ms": row["graph_ms"]}


def value(res: Dict, col: str, op: str) -> Optional[float]:
    """op's us in column col of the results (None where not timed)."""
    if col == "ours":
        return res["ours"]["ops"].get(op)
    if col in ("cudnn", "cublas"):
        return res["torch"][col].get(op)
    e = res[col]["ops"].get(op)
    return e["us"] if e else None


def sm90_cudnn(res: Dict, op: str) -> bool:
    """Whether cuDNN ran op's conv with a Hopper-only kernel (its name says sm90)."""
    return any("sm90" in k for k in res["torch"].get("cudnn_kernels", {}).get(op, []))


def bounds(rows: List[Dict], res: Dict) -> List[Tuple[str, float]]:
    """The sum over rows of each op's fastest time among ever wider sets of kernels: what sm_87 can
    run (mma.sync: ours, Triton's, cuDNN's non-sm90 kernels), then everything timed (wgmma too)."""
    sets = (("ours", ("ours",), False), ("ours, triton-v2 (mma.sync)", ("ours", "triton-v2"), False),
            ("ours, triton-v2, cudnn's sm80-class kernels", ("ours", "triton-v2", "cudnn"), False),
            ("all, wgmma included (cudnn, cublas, triton-v3)", ("ours", "triton-v2", "cudnn", "cublas", "triton-v3"), True))
    out = []
    for what, cols, hopper in sets:
        total = 0.0
        for r in rows:
            vs = [value(res, c, r["op"]) for c in cols if hopper or c != "cudnn" or not sm90_cudnn(res, r["op"])]
            total += min(v for v in vs if v is not None)
        out.append((what, total))
    return out


def report(rows: List[Dict], res: Dict) -> str:
    cols = ("ours", "cudnn", "cublas", "triton-v3", "triton-v2")

    val = lambda col, op: value(res, col, op)  # noqa: E731
    lines = [f"| op | M x N x K | {' | '.join(cols)} | v2 TFLOP/s |", "|" + " --- |" * (len(cols) + 3)]
    tot = {c: 0.0 for c in cols}
    for r in sorted(rows, key=lambda r: -(val("ours", r["op"]) or 0)):
        vs = [val(c, r["op"]) for c in cols]
        for c, v in zip(cols, vs):
            tot[c] += v or 0.0
        v2 = vs[-1]
        lines.append(f"| {r['op']} | {r['M']}x{r['N']}x{r['K']} | "
                     + " | ".join("" if v is None else f"{v:.1f}" for v in vs)
                     + (f" | {r['flops'] / v2 / 1e6:.0f} |" if v2 else " | |"))
    flops = sum(r["flops"] for r in rows)
    lines.append(f"| **sum, {len(rows)} ops** | {flops / 1e9:.1f} GFLOP | "
                 + " | ".join(f"**{tot[c]:.0f}**" for c in cols) + " | |")
    isa = {m: sorted({(v["wgmma"] > 0, v["mma.sync"] > 0) for v in res[m]["isa"].values()}) for m in ("triton-v2", "triton-v3")}
    lines.append(f"\n(us per op; cudnn: the 3x3 convs only. PTX of the configs built, (has wgmma, has mma.sync): {isa})")
    lines += ["", "| every GEMM op at the fastest of | its sum (us) | the call (ms) |", "| --- | --- | --- |"]
    call = res["ours"].get("call_ms")
    for what, sum_us in bounds(rows, res):
        est = "" if call is None else f"{call - (tot['ours'] - sum_us) / 1000:.3f}"
        lines.append(f"| {what} | {sum_us:.0f} | {est} |")
    lines.append("\n(the call: ours as timed, each op's time replaced by that op's fastest; the others do less"
                 " than ours: no GroupNorm, GELU, statistics or residual, and the dense GEMMs no im2col)")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--skip", nargs="*", default=[], choices=JOBS)
    ap.add_argument("--sms", type=int, default=None,
                    help="time everything on a slice of N SMs (a CUDA green context), ours with its tiles for N SMs")
    args = ap.parse_args(argv)
    from tools.peers import in_fresh_process
    rows = gemm_shapes(UNetConfig(), args.batch)
    res: Dict = {"batch": args.batch, "sms": args.sms, "shapes": rows}
    shapes = distinct(rows)
    jobs = {"ours": (run_ours, args.batch, args.sms), "torch": (run_torch, shapes, args.sms),
            "triton-v3": (run_triton, "v3", shapes, args.sms), "triton-v2": (run_triton, "v2", shapes, args.sms),
            "peer-profile": (run_peer_profile, args.batch, args.sms)}
    for name, (fn, *a) in jobs.items():
        if name in args.skip:
            res[name] = {"ops": {}, "isa": {}, "cublas": {}, "cudnn": {}, "kinds": {}}
            continue
        print(f"== {name}", flush=True)
        if name == "triton-v2":
            os.environ["DISABLE_MMA_V3"] = "1"   # the child's Triton builds mma.sync (mma v2) only
        try:
            res[name] = in_fresh_process(fn, *a)
        finally:
            os.environ.pop("DISABLE_MMA_V3", None)
        if name in ("torch", "triton-v3", "triton-v2"):
            share_by_shape(res[name], rows)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
    print(report(rows, res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The persistent 8x8-level chain prototype (chain.cu): check every op against float64, then time it
on an SM slice beside the same ops as the runtime launches them (one kernel per op).

    python -m tools.lab.chain.bench [--sms 8] [--first downs.3.block1.ds_conv] [--last mid.block2]
"""
from __future__ import annotations

import argparse
import pathlib
import statistics

import numpy as np

from jetson_unet.backends import get_backend
from jetson_unet.bench.timing import per_op_times
from jetson_unet.model.reference import Reference
from jetson_unet.model.weights import load_weights
from jetson_unet.paths import kernels_dir, models_dir

HERE = pathlib.Path(__file__).parent
NT, REGION = 256, 100 * 512 * 2
OP = np.dtype([("kind", "i4"), ("cin", "i4"), ("cout", "i4"), ("gelu", "i4")] +
              [(f, "u8") for f in ("inp", "out", "w", "wdw", "bias", "tb", "gnw", "gnb", "st_in", "st_out", "res", "gnr", "gnq", "gnp")])


def nhwc16(a):
    return np.ascontiguousarray(a[0].transpose(1, 2, 0)).astype(np.float16)


class Chain:
    def __init__(self, cp, ref, env, ops, G):
        self.cp, self.ops, self.G = cp, ops, G
        p = ref.params
        d = cp.asarray
        self.keep = []
        bufs = {}
        first_in = ops[0].inputs[0]
        bufs[first_in] = d(nhwc16(env[first_in]).view(np.uint16).ravel())
        stats = {}
        rows = np.zeros(len(ops), OP)
        for i, op in enumerate(ops):
            cout = p[op.prefix + ".weight"].shape[0]
            cin = env[op.inputs[0]].shape[1]
            bufs[op.out] = cp.full(64 * cout, 0x7E00, cp.uint16)   # poisoned (NaN)
            stats[op.out] = cp.zeros(2 * G, cp.float32)
            r = rows[i]
            r["cin"], r["cout"] = cin, cout
            r["inp"], r["out"] = bufs[op.inputs[0]].data.ptr, bufs[op.out].data.ptr
            r["bias"] = self._f32(p[op.prefix + ".bias"])
            r["st_out"] = stats[op.out].data.ptr
            if op.groups > 1:
                r["kind"] = 0
                r["wdw"] = self._f32(p[op.prefix + ".weight"][:, 0].reshape(cin, 49).T)
                r["tb"] = self._f32(env[op.tbias][0])
            else:
                r["kind"], r["gelu"] = 1, int(op.act == "gelu")
                w = np.asarray(p[op.prefix + ".weight"], np.float64).transpose(0, 2, 3, 1)   # (n, ky, kx, c)
                if op.norm:   # folded: W' = W gn_w, Q = sum W' (rounded), P = sum W gn_b, r = gn_b / gn_w
                    gw, gb = np.asarray(p[op.norm + ".weight"]), np.asarray(p[op.norm + ".bias"])
                    w16 = (w * gw).astype(np.float16)
                    r["gnq"] = self._f32(w16.astype(np.float64).sum(axis=(1, 2, 3)))
                    r["gnp"] = self._f32((w * gb).sum(axis=(1, 2, 3)))
                    r["gnr"] = self._f32(gb / gw)
                    r["st_in"] = stats[op.inputs[0]].data.ptr
                    print(f"  {op.out}: max |gn_b / gn_w| = {np.abs(gb / gw).max():.3g}")
                else:
                    w16 = w.astype(np.float16)
                r["w"] = self._keep(d(np.ascontiguousarray(w16).view(np.uint16)))
                if op.residual:
                    r["res"] = bufs[op.residual].data.ptr
        self.bufs, self.rows = bufs, d(rows.view(np.uint8))
        self.bar = cp.zeros(2, cp.uint32)
        self.stamps = cp.zeros(4 * len(ops), cp.int64)

    def _keep(self, a):
        self.keep.append(a)
        return a.data.ptr

    def _f32(self, a):
        return self._keep(self.cp.asarray(np.ascontiguousarray(a, dtype=np.float32)))

    def launch(self, fn_smem, s):
        fn, smem = fn_smem
        self.bar.fill(0)
        fn((self.G,), (NT,), (self.rows, np.int32(len(self.ops)), self.bar, self.stamps), shared_mem=smem, stream=s)

    def errors(self, env):
        out = []
        for op in self.ops:
            got = self.cp.asnumpy(self.bufs[op.out]).view(np.float16).astype(np.float64)
            want = env[op.out][0].transpose(1, 2, 0).ravel()
            out.append((op.out, float(np.linalg.norm(got - want) / np.linalg.norm(want)), bool(np.isfinite(got).all())))
        return out


def timed(cp, launch, s, reps=20):
    s.begin_capture()
    for _ in range(reps):
        launch()
    g = s.end_capture()
    g.launch(s)
    s.synchronize()
    ts = []
    for _ in range(9):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(s)
        g.launch(s)
        e1.record(s)
        e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3 / reps)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sms", type=int, default=8)
    ap.add_argument("--first", default="downs.3.block1.ds_conv")
    ap.add_argument("--last", default="mid.block2")
    ap.add_argument("--t", type=int, default=50)
    a = ap.parse_args()
    from jetson_unet.executor.executor import GpuExecutor
    weights = load_weights(str(models_dir() / "seed-unet-emoji64.safetensors"))
    ref = Reference(weights, np.float64)
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64))
    env = ref.time_env(np.array([a.t]))
    ref.eps(x, np.array([a.t]), env)
    names = [op.out for op in ref.plan.ops]
    ops = ref.plan.ops[names.index(a.first):names.index(a.last) + 1]
    be = get_backend("cupy", a.sms)
    cp = be.cp
    s = be.stream()
    G = a.sms
    src = (HERE / "chain.cu").read_text()
    fns = {}
    for early, uw, st in (("-DEARLY=1", 2, 6), ("-DNO_LDM", 2, 6), ("-DEARLY=1", 1, 12), ("-DNO_LDM", 1, 12)):
        mod = cp.RawModule(code=src, options=("--std=c++17", f"-I{kernels_dir()}", early, f"-DUW={uw}", f"-DSTAGES={st}"))
        fn = mod.get_function("chain")
        smem = st * 64 * 128 * uw + REGION
        fn.max_dynamic_shared_size_bytes = smem
        fns[f"{early} UW={uw} STAGES={st}"] = (fn, smem)
    with s:
        ch = Chain(cp, ref, env, ops, G)
    for early, fn in fns.items():
        with s:
            for name, buf in ch.bufs.items():
                if name != ops[0].inputs[0]:
                    buf.fill(0x7E00)   # poisoned (NaN)
            ch.launch(fn, s)
        s.synchronize()
        print(f"{early}: errors against float64 (relative L2):")
        for name, rel, fin in ch.errors(env):
            print(f"  {name:<28} {rel:.2e}{'' if fin else '  NOT FINITE'}")
        us = timed(cp, lambda: ch.launch(fn, s), s)
        print(f"{early}: the chain of {len(ops)} ops as one kernel on {G} CTAs: {us:.1f} us")
        st = cp.asnumpy(ch.stamps).reshape(-1, 4)
        span = st[-1, 3] - st[0, 0]
        print(f"  CTA 0 clocks (last launch): {span} over the ops; per op: start->loop, loop, epilogue, ->next op start")
        for i, op in enumerate(ops):
            nxt = st[i + 1, 0] if i + 1 < len(ops) else st[i, 3]
            ph = (st[i, 1] - st[i, 0], st[i, 2] - st[i, 1], st[i, 3] - st[i, 2]) if op.groups == 1 else (0, 0, st[i, 3] - st[i, 0])
            print(f"  {op.out:<28} {ph[0]:>7} {ph[1]:>7} {ph[2]:>7} {nxt - st[i, 3]:>7}")
    with GpuExecutor(weights, "fp16", batch=1, backend=be) as ex:
        ex.eps(x.astype(np.float32), a.t)
        per = {n: us for n, _sym, _grid, us in per_op_times(ex, be, reps=20)}
    shipped = sum(per[op.out] for op in ops)
    print(f"shipped kernels, each op alone (hot), summed: {shipped:.1f} us")
    for op in ops:
        print(f"  {op.out:<28} {per[op.out]:.1f}")


if __name__ == "__main__":
    main()

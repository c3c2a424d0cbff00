"""The persistent 8x8-level chain prototype (chain.cu, v3): check every op against float64, then time
it on an SM slice beside the same ops as the runtime launches them (one kernel per op).

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
NT, REGION, NW = 256, 100 * 512 * 2, 8
FIELDS = ("inp", "out", "w", "wdw", "bias", "tb", "st_in", "st_out", "res", "gnr", "gnq", "gnp",
          "dw_w", "dw_bias", "dw_tb", "dw_out", "dw_st")
OP = np.dtype([("kind", "i4"), ("cin", "i4"), ("cout", "i4"), ("gelu", "i4")] + [(f, "u8") for f in FIELDS])


def nhwc16(a):
    return np.ascontiguousarray(a[0].transpose(1, 2, 0)).astype(np.float16)


def pack(w16, G):
    """(cout, 3, 3, cin) fp16 -> per CTA: the even 128-channel k-chunks (group 0), then the odd ones,
    each [BN rows][128 channels] with its 16-byte pieces swizzled by row."""
    cout, cin = w16.shape[0], w16.shape[3]
    BN, CC = cout // G, cin // 128
    NK = 9 * CC
    a = w16.reshape(G, BN, 9, CC, 16, 8).transpose(0, 2, 3, 1, 4, 5).reshape(G, NK, BN, 16, 8)
    a = a[:, list(range(0, NK, 2)) + list(range(1, NK, 2))]
    out = np.empty_like(a)
    q = np.arange(16)
    for r in range(BN):
        out[:, :, r, (q & ~7) | ((q ^ r) & 7), :] = a[:, :, r, :, :]
    return np.ascontiguousarray(out).view(np.uint16).ravel()


class Chain:
    def __init__(self, cp, ref, env, ops, G, fuse):
        self.cp, self.ops, self.G = cp, ops, G
        p = ref.params
        d = cp.asarray
        self.keep = []
        bufs, stats = {}, {}
        first_in = ops[0].inputs[0]
        bufs[first_in] = d(nhwc16(env[first_in]).view(np.uint16).ravel())
        for op in ops:
            cout = p[op.prefix + ".weight"].shape[0]
            bufs[op.out] = cp.full(64 * cout, 0x7E00, cp.uint16)   # poisoned (NaN)
            stats[op.out] = cp.zeros(2 * G * NW, cp.float32)
        rows, self.names = [], []
        i = 0
        while i < len(ops):
            op = ops[i]
            cout = p[op.prefix + ".weight"].shape[0]
            cin = env[op.inputs[0]].shape[1]
            r = np.zeros((), OP)
            r["cin"], r["cout"] = cin, cout
            r["inp"], r["out"] = bufs[op.inputs[0]].data.ptr, bufs[op.out].data.ptr
            r["bias"] = self._f32(p[op.prefix + ".bias"])
            r["st_out"] = stats[op.out].data.ptr
            name = op.out
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
                else:
                    w16 = w.astype(np.float16)
                r["w"] = self._keep(d(pack(w16, G)))
                if op.residual:
                    r["res"] = bufs[op.residual].data.ptr
                nxt = ops[i + 1] if i + 1 < len(ops) else None
                if fuse and nxt is not None and nxt.groups > 1 and nxt.inputs[0] == op.out and cout // G <= 32:
                    r["dw_w"] = self._f32(p[nxt.prefix + ".weight"][:, 0].reshape(cout, 49).T)
                    r["dw_bias"] = self._f32(p[nxt.prefix + ".bias"])
                    r["dw_tb"] = self._f32(env[nxt.tbias][0])
                    r["dw_out"], r["dw_st"] = bufs[nxt.out].data.ptr, stats[nxt.out].data.ptr
                    name += " + " + nxt.out.rsplit(".", 1)[-1]
                    i += 1
            rows.append(r)
            self.names.append(name)
            i += 1
        self.bufs, self.rows = bufs, d(np.array(rows, OP).view(np.uint8))
        self.nrows = len(rows)
        self.bar = cp.zeros(2, cp.uint32)
        self.stamps = cp.zeros(6 * len(rows), cp.int64)

    def _keep(self, a):
        self.keep.append(a)
        return a.data.ptr

    def _f32(self, a):
        return self._keep(self.cp.asarray(np.ascontiguousarray(a, dtype=np.float32)))

    def launch(self, fn_smem, s):
        fn, smem = fn_smem
        self.bar.fill(0)
        fn((self.G,), (NT,), (self.rows, np.int32(self.nrows), self.bar, self.stamps), shared_mem=smem, stream=s)

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
    variants = []
    for extra, slot, st, fuse in (("", 24576, 2, True), ("-DMAP_LD", 24576, 2, True), ("-DMAP_LD", 16384, 3, True),
                                  ("-DNO_LDM", 24576, 2, True)):
        opts = ("--std=c++17", f"-I{kernels_dir()}", f"-DSLOT={slot}", f"-DSTAGES={st}") + ((extra,) if extra else ())
        fn = cp.RawModule(code=src, options=opts).get_function("chain")
        smem = 2 * st * slot + REGION
        fn.max_dynamic_shared_size_bytes = smem
        variants.append((f"{extra or 'full'} SLOT={slot} STAGES={st} fuse={int(fuse)}", (fn, smem), fuse))
    for label, fn, fuse in variants:
        with s:
            ch = Chain(cp, ref, env, ops, G, fuse)
            for name, buf in ch.bufs.items():
                if name != ops[0].inputs[0]:
                    buf.fill(0x7E00)   # poisoned (NaN)
            ch.launch(fn, s)
        s.synchronize()
        errs = ch.errors(env)
        worst = max(e for _, e, _ in errs)
        print(f"{label}: worst error against float64 (relative L2) {worst:.2e}, all finite: {all(f for _, _, f in errs)}")
        if worst > 2e-3:
            for name, rel, fin in errs:
                print(f"  {name:<28} {rel:.2e}{'' if fin else '  NOT FINITE'}")
        us = timed(cp, lambda: ch.launch(fn, s), s)
        print(f"{label}: the chain of {len(ops)} ops ({ch.nrows} steps) as one kernel on {G} CTAs: {us:.1f} us")
        st = cp.asnumpy(ch.stamps).reshape(-1, 6)
        print("  CTA 0 clocks per step: start->map issued, ->border done, ->map landed, loop, epilogue, ->next step start")
        for i, name in enumerate(ch.names):
            nxt = st[i + 1, 0] if i + 1 < ch.nrows else st[i, 5]
            ph = np.diff(st[i]) if st[i, 1] else (0, 0, 0, 0, st[i, 5] - st[i, 0])
            print(f"  {name:<36} " + " ".join(f"{v:>6}" for v in ph) + f" {nxt - st[i, 5]:>6}")
        ch.stamps.fill(0)
    with GpuExecutor(weights, "fp16", batch=1, backend=be) as ex:
        ex.eps(x.astype(np.float32), a.t)
        per = {n: us for n, _sym, _grid, us in per_op_times(ex, be, reps=20)}
    shipped = sum(per[op.out] for op in ops)
    print(f"shipped kernels, each op alone (hot), summed: {shipped:.1f} us")
    for op in ops:
        print(f"  {op.out:<28} {per[op.out]:.1f}")


if __name__ == "__main__":
    main()

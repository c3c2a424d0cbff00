"""The low-resolution conv prototype (lowres.cu): check against float64, then time it on an SM slice
beside the shipped op's figures (tools.lab.roofline on the H200's 8-SM slice, 2026-11-28).

    python -m tools.lab.lowres.bench [--sms 8] [--batches 1 4]
"""
from __future__ import annotations

import argparse
import math
import pathlib
import statistics

import numpy as np

from jetson_unet.backends.cupy import CupyBackend
from jetson_unet.paths import kernels_dir

HERE = pathlib.Path(__file__).parent
# name, H = W, Cin, Cout, the shipped op's us at batch 1 / 4 (roofline, H200 slice; conv2 rows include
# the residual and, for ups.1.block1, the 1x1 res_conv)
SHAPES = [
    ("downs.3.block1.conv1", 8, 128, 256, 9.3, 16.6),
    ("mid.block1.conv1", 8, 256, 512, 17.1, 37.4),
    ("mid.block1 (conv2)", 8, 512, 256, 16.1, 43.0),
    ("ups.0.block1.conv1", 8, 384, 512, 21.5, 51.7),
    ("downs.2.block1.conv1", 16, 64, 128, 8.1, 15.7),
    ("ups.1.block1.conv1", 16, 192, 256, 21.5, 57.7),
    ("ups.1.block1 (conv2)", 16, 256, 128, 15.2, 36.3),
]
CONFIGS = [(16, 32), (16, 64), (32, 32), (32, 64)]   # (NT, CS)
L2_GBS, MMA_TFLOPS = 621.0, 57.6   # the slice's measured copy and matmul rates (docs/performance.md)


def gelu(v):
    erf = np.vectorize(math.erf)
    return 0.5 * v * (1 + erf(v / math.sqrt(2)))


def reference(x, w, b, gam, bet, mean, rstd):
    """x (B,H,W,C) fp16 values; w (N,3,3,C): gelu(conv3x3(gn(x)) + b), float64."""
    B, H, W, C = x.shape
    xn = (x.astype(np.float64) - mean) * rstd * gam + bet
    xn = xn.astype(np.float16).astype(np.float64)   # the kernel normalizes into fp16
    xp = np.pad(xn, ((0, 0), (1, 1), (1, 1), (0, 0)))
    out = np.zeros((B, H, W, w.shape[0]))
    for ky in range(3):
        for kx in range(3):
            out += xp[:, ky:ky + H, kx:kx + W, :] @ w[:, ky, kx, :].astype(np.float64).T
    return gelu(out + b)


class Case:
    def __init__(self, cp, mod, B, hw, cin, cout, nt, cs, mode, rng):
        self.cp, self.shape, self.mode = cp, (B, hw, cin, cout), mode
        self.sym = f"lr_conv<{nt}, {cs}, {hw}, {mode}>"
        self.fn = mod.get_function(self.sym)
        tr = 64 // hw
        self.smem = (tr + 2) * (hw + 2) * (cs + 8) * 2 + nt * (9 * cs + 8) * 2
        self.fn.max_dynamic_shared_size_bytes = self.smem
        self.grid = (cout // nt, cin // cs, B * hw // tr)
        self.x = rng.standard_normal((B, hw, hw, cin)).astype(np.float16)
        self.w = (rng.standard_normal((cout, 3, 3, cin)) / math.sqrt(9 * cin)).astype(np.float16)
        self.b = (rng.standard_normal(cout) * 0.1).astype(np.float32)
        self.gam = (1 + 0.1 * rng.standard_normal(cin)).astype(np.float32)
        self.bet = (0.1 * rng.standard_normal(cin)).astype(np.float32)
        self.mean, self.rstd = float(self.x.astype(np.float64).mean()), float(1 / self.x.astype(np.float64).std())
        d = cp.asarray
        self.dx, self.dw, self.db = d(self.x.view(np.uint16)), d(self.w.view(np.uint16)), d(self.b)
        self.dg, self.dbt = d(self.gam), d(self.bet)
        self.ws = cp.zeros(B * hw * hw * cout, cp.float32)
        self.tk = cp.zeros(self.grid[0] * self.grid[2], cp.uint32)
        self.out = cp.full(B * hw * hw * cout, 0x7e00, cp.uint16)   # poisoned (NaN)
        self.stats = cp.zeros(2 * B, cp.float32)

    def launch(self, s):
        B, hw, cin, cout = self.shape
        self.fn(self.grid, (128,), (self.dx, self.dw, self.db, self.dg, self.dbt, np.float32(self.mean),
                                     np.float32(self.rstd), self.ws, self.tk, self.out, self.stats, np.int32(hw),
                                     np.int32(cin), np.int32(cout)), shared_mem=self.smem, stream=s)

    def check(self):
        B, hw, cin, cout = self.shape
        got = self.cp.asnumpy(self.out).view(np.float16).astype(np.float64).reshape(B, hw, hw, cout)
        want = reference(self.x, self.w, self.b, self.gam, self.bet, self.mean, self.rstd)
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        st = self.cp.asnumpy(self.stats).reshape(B, 2)
        srel = np.abs(st[:, 0] - want.reshape(B, -1).sum(1)).max() / np.abs(want).sum()
        ws_zero = not bool(self.cp.asnumpy(self.ws).any())
        return rel, srel, bool(np.isfinite(got).all()) and ws_zero


def timed(cp, case, s, reps):
    s.begin_capture()
    for _ in range(reps):
        case.launch(s)
    g = s.end_capture()
    g.launch(s)
    s.synchronize()
    ts = []
    for _ in range(7):
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
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 4])
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    be = CupyBackend(sms=a.sms or None)
    cp = be.cp
    names = [f"lr_conv<{nt}, {cs}, {hw}, {mode}>" for nt, cs in CONFIGS for hw in (8, 16) for mode in (0, 1, 2)]
    src = (HERE / "lowres.cu").read_text()
    mod = cp.RawModule(code=src, options=("--std=c++17", f"-I{kernels_dir()}"), name_expressions=names)
    s = be.stream()
    rng = np.random.default_rng(3)
    print(f"device {be.device_name()}, {be.sm_count()} SMs")
    for B in a.batches:
        for name, hw, cin, cout, t1, t4 in SHAPES:
            shipped = t1 if B == 1 else t4
            wbytes, flops = 9 * cin * cout * 2, 2 * B * hw * hw * 9 * cin * cout
            floor = max(wbytes / L2_GBS / 1e3, flops / MMA_TFLOPS / 1e6)
            best = None
            for nt, cs in CONFIGS:
                if cin % cs or cout % nt:
                    continue
                c = Case(cp, mod, B, hw, cin, cout, nt, cs, 0, rng)
                c.launch(s)
                s.synchronize()
                rel, srel, ok = c.check()
                us = timed(cp, c, s, a.reps)
                extra = []
                for mode in (1, 2):
                    k = Case(cp, mod, B, hw, cin, cout, nt, cs, mode, rng)
                    extra.append(timed(cp, k, s, a.reps))
                good = ok and rel < 5e-3 and srel < 1e-4
                print(f"b{B} {name:22s} {hw}x{hw} {cin:3d}->{cout:3d} NT{nt} CS{cs} grid {c.grid} smem {c.smem:6d}: "
                      f"{us:6.2f} us (no epilogue {extra[0]:6.2f}, no mma {extra[1]:6.2f}) shipped {shipped:5.1f} "
                      f"floor {floor:5.2f}  rel {rel:.1e} stats {srel:.1e} {'ok' if good else 'BAD'}", flush=True)
                if good and (best is None or us < best[0]):
                    best = (us, nt, cs)
            if best:
                print(f"   best b{B} {name}: {best[0]:.2f} us (NT{best[1]} CS{best[2]}) vs shipped {shipped} us: "
                      f"{shipped / best[0]:.2f}x", flush=True)


if __name__ == "__main__":
    main()

"""Winograd F(2x2,3x3) prototype: check against a float64 conv, then time it on an SM slice.

    python -m tools.lab.winograd.bench [--sms 8] [--batches 1 4] [--v3]
"""
import argparse, math, pathlib, sys, time
import numpy as np
import cupy as cp
from jetson_unet.backends.cupy import CupyBackend

G = np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]], np.float64)
SRC = (pathlib.Path(__file__).parent / "wino_v2.cu").read_text()
SRC3 = (pathlib.Path(__file__).parent / "wino_v3.cu").read_text()
TRTC = {64: (2, 32), 32: (4, 16), 16: (8, 8)}
BN = 32


def pack_u(w: np.ndarray) -> np.ndarray:
    """w (Cout, Cin, 3, 3) -> uint16 words [Cout/BN][Cin/16][16 p][BN/16][32 lanes][8] (B fragments)."""
    cout, cin = w.shape[:2]
    u = np.einsum("ij,ocjk,lk->ilco", G, w.astype(np.float64), G).reshape(16, cin, cout).astype(np.float16)
    out = np.zeros((cout // BN, cin // 16, 16, BN // 16, 32, 8), np.float16)
    lane = np.arange(32)
    g, q = lane >> 2, lane & 3
    for nblk in range(cout // BN):
        for kc in range(cin // 16):
            c0 = kc * 16
            for nbp in range(BN // 16):
                for half in range(2):
                    n = nblk * BN + (2 * nbp + half) * 8 + g
                    for e, dk in enumerate((0, 1, 8, 9)):
                        out[nblk, kc, :, nbp, :, half * 4 + e] = u[:, c0 + 2 * q + dk, n]
    return out.view(np.uint16)


def conv_ref(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """x (B,H,W,C) float64, w (O,C,3,3): gelu(conv + b), NHWC, float64."""
    B, H, W, C = x.shape
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    out = np.zeros((B, H, W, w.shape[0]))
    for ky in range(3):
        for kx in range(3):
            out += xp[:, ky:ky + H, kx:kx + W, :] @ w[:, :, ky, kx].T
    out += b
    erf = np.vectorize(math.erf)
    return 0.5 * out * (1 + erf(out / math.sqrt(2)))


def smem_bytes(tc: int, stages: int) -> int:
    bt, hc = 2 * tc, 2 * tc + 2
    pipe = stages * (6 * hc * 32 + 16 * (BN // 16) * 32 * 16) + 16 * (bt // 16) * 32 * 16
    return max(pipe, 16 * bt * BN * 4)


def smem3(tr, tc, stages):
    pipe = stages * ((2 * tr + 2) * (2 * tc + 2) * 32 + 16 * 2 * 32 * 16) + 16 * 4 * 32 * 16
    return max(pipe, 8 * 64 * 40 * 4)


class Conv:
    def __init__(self, mod, B, H, W, cin, cout, stages, rng, mode=0, v3=False):
        self.tc = 16 if W >= 32 else 8
        self.sym = f"wino_{self.tc}_{BN}_{stages}_{mode}"
        self.smem = smem_bytes(self.tc, stages)
        self.threads = 256
        if v3:
            tr, tc = TRTC[W]
            self.sym, self.smem, self.threads = f"wino3_{tc}_{stages}_{mode}", smem3(tr, tc, stages), 512
        self.fn = mod.get(self.sym)
        self.fn.set_max_dynamic_shared(self.smem)
        self.shape = (B, H, W, cin, cout)
        self.x = rng.standard_normal((B, H, W, cin)).astype(np.float16)
        self.w = (rng.standard_normal((cout, cin, 3, 3)) / math.sqrt(9 * cin)).astype(np.float16).astype(np.float32)
        self.b = rng.standard_normal(cout).astype(np.float32) * 0.1
        self.dx, self.du = cp.asarray(self.x), cp.asarray(pack_u(self.w))
        self.db = cp.asarray(self.b)
        self.dy = cp.full((B, H, W, cout), 0x7e00, cp.uint16)   # poisoned (NaN)
        self.grid = (B * (H // 4) * (W // 2 // self.tc), cout // BN)
        if v3:
            self.grid = (B * (H // 2 // tr) * (W // 2 // tc), cout // BN)

    def launch(self, s):
        B, H, W, cin, cout = self.shape
        self.fn.launch(self.grid, (self.threads,), (self.dx, self.du, self.db, self.dy, np.int32(H), np.int32(W),
                                           np.int32(cin), np.int32(cout)), self.smem, s)

    def check(self):
        got = cp.asnumpy(self.dy).view(np.float16).astype(np.float64)
        want = conv_ref(self.x.astype(np.float64), self.w.astype(np.float64), self.b.astype(np.float64))
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        return rel, float(np.abs(got - want).max()), bool(np.isfinite(got).all())


SHAPES = [  # name, H=W, Cin, Cout (the shipped model's 3x3 stride-1 convs at the 64x64..16x16 levels)
    ("ups.3.block1.conv1", 64, 64, 64),
    ("downs.0.block1.conv1", 64, 32, 64),
    ("ups.3.block1 conv2", 64, 64, 32),
    ("ups.2.block1.conv1", 32, 96, 128),
    ("ups.2.block1 conv2", 32, 128, 64),
    ("downs.1.block1.conv1", 32, 32, 64),
    ("ups.1.block1.conv1", 16, 192, 256),
    ("ups.1.block1 conv2", 16, 256, 128),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sms", type=int, default=8)
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 4])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--v3", action="store_true")
    a = ap.parse_args()
    be = CupyBackend(sms=a.sms or None)
    mod = be.compile_source(SRC3 if a.v3 else SRC, "wino_v2.cu", ("--std=c++17",), ())
    s = be.stream()
    rng = np.random.default_rng(1)
    print(f"device {be.device_name()}, {be.sm_count()} SMs")
    for B in a.batches:
        for name, hw, cin, cout in SHAPES:
            for stages, mode in ((3, 0), (2, 0), (2, 1), (2, 2)):
                c = Conv(mod, B, hw, hw, cin, cout, stages, rng, mode, a.v3)
                c.launch(s); s.synchronize()
                rel, mx, fin = c.check()
                s.begin_capture()
                for _ in range(a.reps):
                    c.launch(s)
                g = s.end_capture()
                g.launch(s); s.synchronize()
                ts = []
                for _ in range(5):
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record(s); g.launch(s); e1.record(s); e1.synchronize()
                    ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3 / a.reps)
                us = sorted(ts)[2]
                fl = 2 * B * hw * hw * cin * cout * 9
                print(f"{'v3 ' if a.v3 else ''}b{B} {name:22s} {hw}x{hw} {cin:3d}->{cout:3d} S{stages} M{mode} grid {c.grid} smem {c.smem}: "
                      f"{us:7.2f} us  {fl / us / 1e6:6.2f} TFLOP/s(direct-equiv)  rel {rel:.2e} max {mx:.2e} "
                      f"{('ok' if fin and rel < 2e-3 else 'BAD') if mode == 0 else ('no epilogue', 'no epilogue, no transform')[mode - 1]}", flush=True)


if __name__ == "__main__":
    main()

"""Prototype (not shipped): the weight-streaming 3x3 conv (wstream.cu) against NumPy, and its time
on an SM slice, per variant, with the phases of each CTA (globaltimer stamps).

python -m tools.lab.wstream.bench 8     (the SM count; 0: the whole GPU)
"""
import sys
from pathlib import Path

import cupy as cp
import numpy as np

from jetson_unet.backends import get_backend
from jetson_unet.bench.timing import timed

SRC = (Path(__file__).parent / "wstream.cu").read_text()
be = s = None


def pack(w):
    """w (COUT, CIN, 3, 3) -> [COUT/16][STEPS][32 lanes][8 halves] in m16n8k16 A-fragment order, k = tap*CIN + c."""
    cout, cin = w.shape[:2]
    a = w.transpose(0, 2, 3, 1).reshape(cout, 9 * cin)          # (co, k)
    steps = 9 * cin // 16
    a = a.reshape(cout // 16, 16, steps, 16).transpose(0, 2, 1, 3)   # (ct, s, row, col)
    lane = np.arange(32)
    g, t = lane >> 2, lane & 3
    out = np.empty((cout // 16, steps, 32, 8), np.float16)
    for i, (rr, cc) in enumerate([(0, 0), (8, 0), (0, 8), (8, 8)]):
        out[..., :, 2 * i] = a[:, :, g + rr, 2 * t + cc]
        out[..., :, 2 * i + 1] = a[:, :, g + rr, 2 * t + cc + 1]
    return out


def reference(x, w, b, mean, rstd, gamma, beta):
    xn = (x.astype(np.float64) - mean) * rstd * gamma + beta            # (H, W, C)
    xn = xn.astype(np.float16).astype(np.float64)
    H, W, C = x.shape
    xp = np.zeros((H + 2, W + 2, C))
    xp[1:-1, 1:-1] = xn
    cols = np.stack([xp[dy:dy + H, dx:dx + W] for dy in range(3) for dx in range(3)], 2)  # H W 9 C
    wf = w.astype(np.float64).transpose(2, 3, 1, 0).reshape(9, C, -1)
    out = np.einsum("hwtc,tco->hwo", cols, wf) + b
    import math
    erf = np.vectorize(math.erf)
    return 0.5 * out * (1 + erf(out / math.sqrt(2)))


def run(cin, cout, mt, nwk, nwp, d, hh=8, ns=1, check=True, fold=0):
    nw = nwk * nwp
    rng = np.random.default_rng(cin * 7 + cout)
    x = rng.standard_normal((ns, hh, hh, cin)).astype(np.float16)
    w = (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(9 * cin)).astype(np.float16)
    b = rng.standard_normal(cout).astype(np.float32) * 0.1
    gamma = (1 + 0.1 * rng.standard_normal(cin)).astype(np.float32)
    beta = (0.1 * rng.standard_normal(cin)).astype(np.float32)
    gn = np.array([[float(x[n].astype(np.float64).mean()), 1.0 / float(np.sqrt(x[n].astype(np.float64).var() + 1e-5))] for n in range(ns)], np.float32)
    opts = ("-std=c++17", f"-DCIN={cin}", f"-DCOUT={cout}", f"-DHH={hh}", f"-DWW={hh}", f"-DNS={ns}",
            f"-DMT={mt}", f"-DNWK={nwk}", f"-DNWP={nwp}", f"-DD={d}", f"-DFOLD={fold}")
    mod = cp.RawModule(code=SRC, options=opts)
    k = mod.get_function("wstream")
    pp = (hh + 2) ** 2
    smem = max(ns * pp * (cin + 8) * 2 + nw * (d + 1) * mt * 512, nwk * ns * hh * hh * (16 * mt + 4) * 4)
    k.max_dynamic_shared_size_bytes = smem
    wf = (w.astype(np.float32) * gamma[None, :, None, None]).astype(np.float16) if fold else w
    sb = np.einsum("ocyx,c->o", w.astype(np.float64), beta.astype(np.float64)).astype(np.float32)
    sg = wf.astype(np.float64).sum((1, 2, 3)).astype(np.float32)
    dx, dw = cp.asarray(x), cp.asarray(pack(wf))
    dsb, dsg = cp.asarray(sb), cp.asarray(sg)
    db, dg, dgam, dbet = cp.asarray(b), cp.asarray(gn), cp.asarray(gamma), cp.asarray(beta)
    dy = cp.full((ns, hh, hh, cout), np.float16(np.nan))
    dst = cp.zeros(2 * ns, cp.float32)
    grid = (cout // (16 * mt), 1)
    tsc = cp.zeros((grid[0], 8), cp.uint64)
    args = (dx, dw, db, dg, dgam, dbet, dy, dst, dsb, dsg, tsc)

    def launch():
        k(grid, (nw * 32,), args, shared_mem=smem, stream=s)
    launch()
    s.synchronize()
    err = float("nan")
    if check:
        ref = np.stack([reference(x[n], w, b, gn[n, 0], gn[n, 1], gamma, beta) for n in range(ns)])
        got = cp.asnumpy(dy).astype(np.float64)
        err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref)) if np.isfinite(got).all() else float("inf")
    for _ in range(3):
        launch()
    s.synchronize()
    ts = cp.asnumpy(tsc).astype(np.int64)
    ph = ts[:, 1:5] - ts[:, 0:4]
    phases = "patch %.2f  kloop %.2f  barrier %.2f  epi %.2f  span %.2f" % (*(ph.mean(0) / 1000), (ts[:, 4].max() - ts[:, 0].min()) / 1000)
    args = args[:-1] + (np.uint64(0),)
    be.capture_begin(s)
    for _ in range(20):
        launch()
    g = be.capture_end(s)
    ms = timed(be, s, lambda: g.launch(s), 3, 10, 5)
    return err, 1000 * ms / 20, k.num_regs, smem, phases


OPS = [  # name, cin, cout, map
    ("downs.3.block1.conv1", 128, 256, 8),
    ("downs.3.block1.conv2", 256, 128, 8),
    ("mid.block1.conv1", 256, 512, 8),
    ("mid.block1.conv2", 512, 256, 8),
    ("ups.0.block1.conv1", 384, 512, 8),
    ("downs.2.block1.conv1", 64, 128, 16),
    ("downs.2.block1.conv2", 128, 64, 16),
    ("ups.1.block1.conv1", 192, 256, 16),
    ("ups.1.block1.conv2", 256, 128, 16),
]
V8 = [(1, 8, 1, 8, 0), (1, 8, 1, 8, 1), (2, 4, 1, 8, 0), (2, 4, 1, 8, 1), (2, 8, 1, 8, 1), (1, 16, 1, 4, 1)]
V16 = [(1, 4, 4, 8, 1), (2, 2, 4, 8, 0), (2, 2, 4, 8, 1)]


def main() -> None:
    global be, s
    sms = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    be = get_backend("cupy", sms or None)
    s = be.stream()
    for name, cin, cout, hh in OPS:
        for mt, nwk, nwp, d, fold in (V8 if hh == 8 else V16):
            if (9 * cin // 16) // nwk < d or cout % (16 * mt):
                continue
            try:
                err, us, regs, smem, phases = run(cin, cout, mt, nwk, nwp, d, hh, fold=fold)
                print(f"{name:22s} {cin:4d}->{cout:4d} {hh}x{hh} MT {mt} NWK {nwk:2d} NWP {nwp} D {d:2d} fold {fold}: {us:6.2f} us  regs {regs:3d} smem {smem // 1024:3d}K rel err {err:.2e} | {phases}", flush=True)
            except Exception as e:  # noqa
                print(f"{name} MT {mt} NWK {nwk} NWP {nwp} D {d}: {type(e).__name__}: {str(e)[:300]}", flush=True)


if __name__ == "__main__":
    main()

"""Does Winograd F(2x2,3x3) with fp16 operands (f16x2 input transform) keep the fp16 path's accuracy? NumPy emulation of the reference: every op's output rounded to fp16, the 3x3 convs direct (fp16 operands) or as Winograd."""
import sys, time, numpy as np
from numpy.lib.stride_tricks import sliding_window_view
import jetson_unet.model.reference as ref
from jetson_unet.model.weights import load_weights
from jetson_unet.pipeline import default_weights_path

BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
G = np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]], np.float64)
AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)
f16 = lambda a: a.astype(np.float16).astype(np.float64)
orig_conv, orig_run_op = ref.conv2d, ref.run_op
MODE = "f64"

def conv_emu(x, w, b, groups=1):
    if MODE == "f64" or groups != 1:
        return orig_conv(x, w, b, groups)
    O, C, k, _ = w.shape
    if MODE == "f16" or k != 3:
        return orig_conv(f16(x), f16(w), b, groups)
    B, _, H, W = x.shape
    xp = np.pad(f16(x), ((0, 0), (0, 0), (1, 1), (1, 1)))
    d = sliding_window_view(xp, (4, 4), axis=(2, 3))[:, :, ::2, ::2]          # B C H/2 W/2 4 4
    V = f16(np.einsum("bcyxij,lj->bcyxil", f16(np.einsum("ij,bcyxjk->bcyxik", BT, d, optimize=True)), BT, optimize=True))
    U = f16(np.einsum("ij,ocjk,lk->ocil", G, f16(w), G, optimize=True))
    M = np.einsum("ocil,bcyxil->boyxil", U, V, optimize=True)
    Y = np.einsum("ij,boyxjk,lk->boyxil", AT, M, AT, optimize=True)            # B O H/2 W/2 2 2
    return Y.transpose(0, 1, 2, 4, 3, 5).reshape(B, O, H, W) + b[None, :, None, None]

def run_op_emu(op, env, p, plan):
    y = orig_run_op(op, env, p, plan)
    return y if MODE == "f64" else f16(y)

ref.conv2d, ref.run_op = conv_emu, run_op_emu
w = load_weights(default_weights_path())
r = ref.Reference(w, np.float64)
rng = np.random.default_rng(0)
x = rng.standard_normal((2, 3, 64, 64))
for t in (99, 60, 20, 2):
    out = {}
    for MODE in ("f64", "f16", "wino"):
        out[MODE] = r.eps(x, np.array([t, t]))
    e = lambda m: np.linalg.norm(out[m] - out["f64"]) / np.linalg.norm(out["f64"])
    print(f"t={t}: eps rel L2 vs float64: fp16 direct {e('f16'):.2e}  fp16 winograd F(2x2,3x3) {e('wino'):.2e}", flush=True)

"""Launchers of kernels/conv.cu: the GEMM conv (every non-depthwise conv between the image ends) and
the attention gate. The kernel family is chosen here (conv_gemm, or the cp.async / halo convs of
jetson_unet.ops.conv_pipe and .conv_halo), the weights packed as the GEMM's B matrix, the GroupNorm
folded where it may be, and the residual joined as a second K segment.
"""
from __future__ import annotations

import dataclasses
import numpy as np
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from jetson_unet.ops.common import (Ctx, ELEM_BYTES, F, I, MAX_STAGES, OpSpec, P, Resolver, SMEM_LIMIT,
                                    VEC_MAX, cdiv, from_device, k_residual, memoized, padded, round_up,
                                    to_device, vec_for)
from jetson_unet.ops import gate as gate_rows
from jetson_unet.ops.conv_halo import ConvGeom, builtin_halo, builtin_rows, conv_geom, halo_problems, halo_smem
from jetson_unet.ops.conv_pipe import (PIPE_DEEP_LIMIT, PIPE_SCRATCH, deep_ring, pipe_ring_bytes, pipe_smem,
                                       pipelined, with_pipeline)
from jetson_unet.ops.tiles import choose_bk, choose_splits, choose_tile
from jetson_unet.errors import ConfigError
from jetson_unet.ops.keys import FEATURES, ConvKey
from jetson_unet.model.plan import CONV, Op, Plan


GEMM_SCRATCH = 1200                                  # conv_gemm's beside its tiles (red, last, epilogue operands)


def check_key(key: ConvKey, n: int, dyn_smem: int, where: str) -> None:
    """A tile the kernels can instantiate (their static_asserts and the smem budget, in Python), so a
    bad tuning entry is a one-line ConfigError rather than an NVRTC failure. (The halo conv's row tiles:
    conv_halo.rows_problems, with the op's geometry.)"""
    if key.rows:
        return
    tc, nt, eb = key.dtype != "fp32", key.threads, ELEM_BYTES[key.dtype]
    kv, vb = key.bk // key.vec, 16 // eb
    rpp = nt // kv if kv and nt % kv == 0 else 0
    ap = cdiv(key.bm, rpp) if rpp else 0
    bvec = key.bn * key.bk // vb
    sliced = key.stages and not key.halo   # the cp.async conv: k slices, spare B-copy threads
    dyn_ring = deep_ring(key)              # its ring in dynamic smem, with its own budget
    # k slices: each takes whole n-fragment column groups and k steps; their exchange fits in the ring
    ks_ok = (sliced and key.ks in (2, 4) and (key.bn // key.wn // 8) % key.ks == 0 and (key.bk // 16) % key.ks == 0
             and 4 * key.bm * key.bn * (key.ks - 1) <= pipe_ring_bytes(key.bm, key.bn, key.bk, key.stages))
    smem = (pipe_ring_bytes(key.bm, key.bn, key.bk, key.stages) + PIPE_SCRATCH if key.stages else
            2 * eb * ((key.bm + key.bn) * (key.bk + 8) if tc else key.bk * (key.bm + key.bn + 8)) + GEMM_SCRATCH)
    problems = [
        (key.bk not in ((32, 64) if tc else (16,)), f"BK {key.bk}"),
        (not rpp or not (key.bm % rpp == 0 or ap == 1) or ap > 32, f"A split of {key.bm} rows over {nt} threads"),
        (bvec % nt != 0 and not (sliced and nt % bvec == 0), f"B split of {key.bn}x{key.bk} over {nt} threads"),
        (tc and ((key.bm // key.wm) % 16 or (key.bn // key.wn) % 16), f"warp tile {key.bm}/{key.wm} x {key.bn}/{key.wn}"),
        (key.ks != 1 and not ks_ok, f"{key.ks} k slices"),
        (not tc and (key.bm % 16 or (key.bn // max(nt // 16, 1)) % 4), "FFMA thread tile"),
        (key.stages and (not tc or key.vec != VEC_MAX[key.dtype] or not 2 <= key.stages <= MAX_STAGES),
         f"cp.async stages {key.stages}"),
        (not key.halo and not dyn_ring and smem + dyn_smem > SMEM_LIMIT, f"{smem + dyn_smem} B of shared memory"),
        (dyn_ring and pipe_smem(key, dyn_smem) > PIPE_DEEP_LIMIT, f"{pipe_smem(key, dyn_smem)} B of dynamic shared memory"),
        (key.gate and key.nsplit != (key.bn < n), f"gate BN {key.bn} for {n} channels with nsplit {key.nsplit}"),
        (key.fold and not fold_fits(key), "a folded GroupNorm"),
        # (the cp.async conv's up2 3x3 keys become sub-pixel ones in gemm_key: ops.conv.subpixel)
        (key.subpixel and not (key.stages and not key.halo),
         "up2 as sub-pixel 2x2 convs on the cp.async conv only"),
    ]
    bad = [msg for cond, msg in problems if cond]
    if bad:
        raise ConfigError(f"{where}: tile {key.symbol} is not supported ({'; '.join(bad)})")


def tuned_key(key: ConvKey, ctx: Ctx, name: str, n: int, dyn_smem: int,
              geom: Optional[ConvGeom] = None) -> Optional[ConvKey]:
    """`key` with the measured tile of op `name` from ctx.tiles, checked; None when there is none."""
    t = ctx.tiles.get(name)
    if t is None:
        return None
    stages = t.stages
    tuned = dataclasses.replace(key, bm=t.bm, bn=t.bn, wm=t.wm, wn=t.wn, bk=t.bk, stages=stages, halo=bool(t.halo),
                                rows=t.halo == 2, ks=t.ks if stages else 1, nsplit=key.gate and t.bn < n)
    check_key(tuned, n, dyn_smem, f"tuned tile of {name}")
    bad = (halo_problems(tuned, geom) if geom else ["a gate"]) if tuned.halo else []
    if bad:
        raise ConfigError(f"tuned tile of {name}: halo conv {tuned.symbol} is not supported ({'; '.join(bad)})")
    return tuned


# ---- weight packing -------------------------------------------------------------------------------

def subpixel_weights(w: np.ndarray) -> List[np.ndarray]:
    """An up2 conv's 3x3 weights (Cout, Cin, 3, 3) as the four sub-pixel 2x2 convs of
    kernels/conv_pipe.cu (SubPixel), one (Cout, 4 Cin) matrix per output parity (py, px), K ordered
    (a, b, c): along each axis parity 0 reads rows i - 1 (tap 0) and i (taps 1 + 2), parity 1 rows i
    (taps 0 + 1) and i + 1 (tap 2). Summed in fp32 from the parameter's values, rounded once where
    packed (pack_gemm)."""
    w = np.asarray(w, dtype=np.float32)
    if w.shape[2:] != (3, 3):
        raise ConfigError(f"sub-pixel up2 needs 3x3 weights, got {w.shape}")
    fold = ([[0], [1, 2]], [[0, 1], [2]])   # parity -> for tap a of the 2x2: the 3x3 taps it sums
    mats = []
    for py in (0, 1):
        for px in (0, 1):
            taps = [[w[:, :, fold[py][a], :][:, :, :, fold[px][b]].sum(axis=(2, 3)) for b in (0, 1)] for a in (0, 1)]
            mats.append(np.ascontiguousarray(np.stack([np.stack(r, axis=1) for r in taps], axis=1)
                                             .reshape(w.shape[0], -1)))   # (Cout, a, b, Cin)
    return mats


def pack_subpixel(precision: str, bn: int, bk: int, w: np.ndarray) -> Tuple[np.ndarray, int, List[int]]:
    """pack_gemm of the four parity classes' matrices (subpixel_weights), one after the other: class p
    at rows p x Npad (kernels/conv_pipe.cu SubPixel)."""
    packs = [pack_gemm(precision, bn, bk, [m]) for m in subpixel_weights(w)]
    return np.concatenate([pk[0] for pk in packs]), packs[0][1], packs[0][2]


def conv_matrix(op: Op, params: Mapping[str, np.ndarray]) -> np.ndarray:
    """(Cout, K) with K ordered (ky, kx, c); unshuffle2's channel c*4+dy*2+dx becomes tap (dy, dx).
    In the parameter's own dtype (fp16 for the shipped weights): pack_gemm converts once, where
    the packed dtype differs, and fold_weights computes in fp32."""
    w = np.asarray(params[op.prefix + ".weight"])
    if op.in_map == "unshuffle2":
        o, c4 = w.shape[:2]
        w = w.reshape(o, c4 // 4, 2, 2).transpose(0, 2, 3, 1)
    else:
        w = w.transpose(0, 2, 3, 1)
    return np.ascontiguousarray(w.reshape(w.shape[0], -1))


def pack_gemm(precision: str, bn: int, bk: int, segs: Sequence[np.ndarray]) -> Tuple[np.ndarray, int, List[int]]:
    """Zero-padded B matrix: K segments each padded to BK, N to BN. 16-bit: [Npad][K] (ldmatrix
    reads k-contiguous rows); fp32: [K][Npad] (the FFMA path reads float4 along n)."""
    n = segs[0].shape[0]
    kps = [round_up(s.shape[1], bk) for s in segs]
    npad = round_up(n, bn)
    # fp16: straight into the packed dtype (an fp16 segment is copied, an fp32 one rounded to nearest
    # even as to_device does); bf16 goes through fp32 and to_device's rounding
    w = np.zeros((npad, sum(kps)), dtype=np.float16 if precision == "fp16" else np.float32)
    k0 = 0
    for s, kp in zip(segs, kps):
        w[:n, k0:k0 + s.shape[1]] = s
        k0 += kp
    if precision == "fp32":
        return np.ascontiguousarray(w.T), npad, [kp // bk for kp in kps]
    return (w if precision == "fp16" else to_device(w, precision)), w.shape[1], [kp // bk for kp in kps]


def fold_fits(key: ConvKey) -> bool:
    """The kernels that have a folded GroupNorm: the 16-bit cp.async and halo convs (key.stages;
    conv_gemm keeps the table) with the epilogue's prefetch (BN <= 128), not the sub-pixel up2 ones."""
    return (bool(key.stages) and key.dtype != "fp32" and not key.gate and key.bn <= 128
            and not key.subpixel)


def scalable_input(op: Op, plan: Plan) -> bool:
    """Whether the tensor op reads can be stored times a per-channel vector by its producer (the
    oscale of kernels/dwconv.cu and of conv.cu's feature o): op is its only reader, and a depthwise or
    GEMM conv between the image ends writes it."""
    src = next((o for o in plan.ops if o.out == op.x), None)
    return (src is not None and src.kind == CONV and src.x != plan.input and src.out != plan.output
            and [o.out for o in plan.ops if op.x in o.reads()] == [op.out])


def fold_norm(key: ConvKey, op: Op, plan: Plan) -> bool:
    """Whether a normalized conv with this key folds its GroupNorm into the GEMM (kernels/conv.cu
    conv_gn_prologue: the producer stores gn_w * x, the weights stay W, padded taps read the
    per-channel value whose normalization is 0, rstd and a per-column term are applied once). Only
    where the kernel has one (fold_fits) and the producer can scale its output (scalable_input)."""
    return bool(op.norm) and fold_fits(key) and scalable_input(op, plan)


def output_scale(op: Op, ctx: Ctx) -> Optional[np.ndarray]:
    """The per-channel factor op's kernel stores its output times: the gn_w of the conv that reads
    it and folds its GroupNorm (fold_norm), else None. (Not memoized: ctx.memo outlives a tile choice.)"""
    readers = [o for o in ctx.plan.ops if op.out in o.reads()]
    if len(readers) != 1 or readers[0].x != op.out or not readers[0].norm or readers[0].kind != CONV:
        return None
    r = readers[0]
    if not fold_norm(gemm_base_key(r, ctx), r, ctx.plan):
        return None
    return np.asarray(ctx.params[r.norm + ".weight"], dtype=np.float32)


def fold_weights(seg0: np.ndarray, bias: np.ndarray, gn_b: np.ndarray) -> np.ndarray:
    """The folded GroupNorm's bias: bias + P, P = W . gn_b over segment 0 of the GEMM (Cout, K, K
    ordered (tap, c)), in float64 from the weights as given (fold_norm; the weights stay W)."""
    taps = seg0.shape[1] // gn_b.size
    b = np.tile(np.asarray(gn_b, np.float64), taps)
    return (bias.astype(np.float64) + np.asarray(seg0, np.float64) @ b).astype(np.float32)


def fold_table(w: np.ndarray, precision: str, k0: int, cin: int, gn_w: np.ndarray, gn_b: np.ndarray) -> np.ndarray:
    """The folded GroupNorm's gn_fold blob: gn_w (Cin), gn_b (Cin), then Q[n] = sum_k W[n][k] gn_w[c(k)]
    over the packed weights' first k0 columns (segment 0, K ordered (tap, c), padding zeros: c(k) = k
    mod Cin for the taps' columns) for each of the Npad rows, in float64."""
    wk = (w[:, :k0] if precision == "fp16" else from_device(w[:, :k0], precision)).astype(np.float64)
    g = np.zeros(k0)
    taps = min(k0, (k0 // cin) * cin)
    g[:taps] = np.tile(np.asarray(gn_w, np.float64), taps // cin)
    return np.concatenate([np.asarray(gn_w, np.float64), np.asarray(gn_b, np.float64), wk @ g]).astype(np.float32)


# ---- the GEMM conv and the gate -------------------------------------------------------------------

def gemm_base_key(op: Op, ctx: Ctx) -> ConvKey:
    """The op's tile and kernel family, before the fold and the features (gemm_key)."""
    plan = ctx.plan
    xt, ot = plan.tensors[op.x], plan.tensors[op.out]
    kh, st, up = {"none": (op.k, 1, 1), "up2": (op.k, 1, 2), "unshuffle2": (2, 2, 1)}[op.in_map]
    if op.in_map == "unshuffle2" and (op.k != 1 or op.norm):
        raise ConfigError(f"{op.out}: unshuffle2 is supported for a 1x1 conv without norm only")
    if op.residual_conv and op.act != "none":
        raise ConfigError(f"{op.out}: a fused residual_conv needs act 'none' (it joins the GEMM)")
    xr = k_residual(op)
    cr = plan.tensors[xr].channels if xr else 0
    vec = vec_for(ctx.precision, ctx, (op.x, xr, op.out), (xt.channels, cr, ot.channels))
    tile = choose_tile(ctx.precision, ot.size * ot.size, ot.channels, ctx.tile_batch or ctx.batch,
                       ctx.sms, gate=False, k=kh * kh * xt.channels + cr, pipelined=pipelined(ctx, vec))
    if vec == 1 and tile[0] > 64:   # scalar loads: 128 rows would hold 32 loads + 64 indices per thread
        tile = (64,) + tuple(tile[1:])
    bm, bn, wm, wn = tile
    key = ConvKey(ctx.precision, bm, bn, choose_bk(ctx.precision, bm, bn, vec, False), wm, wn, kh, st, up,
                  vec, False)
    dyn = 8 * xt.channels if op.norm else 0
    key = (tuned_key(key, ctx, op.out, ot.channels, dyn, conv_geom(op, ctx))
           or builtin_rows(key, op, ctx, ot)
           or builtin_halo(key, op, ctx, ot)
           or with_pipeline(key, ctx, dyn))
    if op.in_map == "up2":
        key = subpixel(key, op, ctx, dyn)
    return key


def gemm_key(op: Op, ctx: Ctx) -> ConvKey:
    key = gemm_base_key(op, ctx)
    if fold_norm(key, op, ctx.plan):
        key = dataclasses.replace(key, fold=True)
    nks = gemm_k_tiles(op, ctx, key)
    m = ctx.plan.tensors[op.out].size ** 2
    has = {"g": op.act == "gelu", "t": bool(op.tbias), "n": bool(op.norm), "k": len(nks) > 1,
           "r": bool(op.residual) and not k_residual(op), "o": output_scale(op, ctx) is not None}
    return with_features(key, op, ctx, has, m, ctx.plan.tensors[op.out].channels, sum(nks))


def gemm_k_tiles(op: Op, ctx: Ctx, key: ConvKey) -> List[int]:
    """The k-tile counts of the GEMM's K segments, as gemm_blobs packs them (pack_gemm, pack_subpixel),
    from the shapes alone: the op's weights (K = Cin x taps; a sub-pixel class 4 Cin), then the
    residual's rows (K = its channels) where it joins as a second segment."""
    w = np.shape(ctx.params[op.prefix + ".weight"])
    if key.subpixel:
        return [cdiv(4 * w[1], key.bk)]
    xr = k_residual(op)
    ks = [int(np.prod(w[1:]))] + ([ctx.plan.tensors[xr].channels] if xr else [])
    return [cdiv(k, key.bk) for k in ks]


def emits_stats(op: Op, plan: Plan) -> bool:
    """Whether a consumer normalizes op's output, so that op writes its GroupNorm partials (st_part)."""
    return any(o.norm and o.x == op.out for o in plan.ops)


def op_splits(key: ConvKey, ctx: Ctx, name: str, mtiles: int, ntiles: int, nk: int) -> int:
    """The op's split-K factor: its tuned one, else choose_splits' for the batch its tiles are chosen
    for (the halo conv's row tiles have none)."""
    t = ctx.tiles.get(name)
    if key.rows:
        return 1
    if t and t.splits:
        return min(t.splits, nk)
    return choose_splits(nk, mtiles * ntiles * (ctx.tile_batch or ctx.batch), ctx.sms)


def with_features(key: ConvKey, op: Op, ctx: Ctx, has: Dict[str, bool], m: int, n: int, nk: int) -> ConvKey:
    """`key` for the op's features (keys.FEATURES): `has`, the statistics and split-K. A split-K op
    gets every feature (the generic kernel): folded, 3 of the tuner's split-K tiles spilled 8-36
    bytes on sm_87, for 1% of a batch-1 call on an 8-SM slice (docs/kernels.md, "Op features")."""
    if op_splits(key, ctx, op.out, cdiv(m, key.bm), cdiv(n, key.bn), nk) > 1:
        return dataclasses.replace(key, feat=FEATURES)
    has = dict(has, s=emits_stats(op, ctx.plan), p=False)
    return dataclasses.replace(key, feat="".join(c for c in FEATURES if has[c]))


def check_features(key: ConvKey, name: str, nks: Sequence[int], splits: int) -> None:
    """The packed K segments and the split-K of an op's spec agree with the features its key was
    compiled for (a mismatch would run the wrong code: an internal error, never a user's)."""
    seg1 = len(nks) > 1 and nks[1] > 0
    if ("p" in key.feat) != (splits > 1) or (splits == 1 and ("k" in key.feat) != seg1):
        raise ConfigError(f"{name}: kernel {key.symbol} was chosen for other K segments or split-K "
                          f"({len(nks)} segments, {splits} splits): an internal error")


def subpixel_rows(key: ConvKey, rows: int) -> int:
    """BM of an up2 conv's sub-pixel tile, whose tiles each lie in one parity class of `rows` input
    pixels: key.bm, halved while it exceeds them (0 when no such BM divides them)."""
    bm = key.bm
    while bm > rows and bm > 32:
        bm //= 2
    return bm if rows % bm == 0 else 0


def subpixel(key: ConvKey, op: Op, ctx: Ctx, dyn: int) -> ConvKey:
    """An up2 conv's key: on the cp.async conv its four sub-pixel 2x2 convs (kh 2; kernels/conv_pipe.cu
    SubPixel: 4 of the 3x3's 9 multiply-adds per output), BM within a parity class (subpixel_rows);
    the halo conv and conv_gemm keep the 3x3 map of the upsampled input, and conv_gemm takes what
    the sub-pixel kernel cannot (a residual, no BM that divides the input's pixels)."""
    if not key.stages or key.halo:
        return key
    bm = subpixel_rows(key, ctx.plan.tensors[op.x].size ** 2)
    if bm and not (op.residual or op.residual_conv):
        sub = dataclasses.replace(key, kh=2, bm=bm, wm=min(key.wm, max(bm // 16, 1)))
        try:
            check_key(sub, ctx.plan.tensors[op.out].channels, dyn, op.out)
            return sub
        except ConfigError:
            pass
    return dataclasses.replace(key, stages=0, ks=1, fold=False, bk=choose_bk(key.dtype, key.bm, key.bn, key.vec, False))


def gemm_blobs(op: Op, ctx: Ctx, key: ConvKey) -> Tuple[Dict[str, np.ndarray], int, List[int]]:
    """The GEMM conv's packed weights and the vectors beside them (bias, GroupNorm), their leading
    dimension and the K segments' k-tile counts: a function of the params, the op and key's dtype, BN,
    BK, fold and sub-pixel form."""
    plan, p, prec = ctx.plan, ctx.params, ctx.precision
    xt, n = plan.tensors[op.x], plan.tensors[op.out].channels
    segs = [conv_matrix(op, p)]
    bias = np.asarray(p[op.prefix + ".bias"], dtype=np.float32)
    xr = k_residual(op)
    cr = plan.tensors[xr].channels if xr else 0
    if op.residual_conv:
        segs.append(np.asarray(p[op.residual_conv + ".weight"]).reshape(n, cr))
        bias = bias + np.asarray(p[op.residual_conv + ".bias"], dtype=np.float32)
    elif xr:
        if cr != n:
            raise ConfigError(f"{op.out}: identity residual {xr} has {cr} channels, the conv {n}")
        segs.append(np.eye(n, dtype=np.float32))
    gn_w, gn_b = (p[op.norm + ".weight"], p[op.norm + ".bias"]) if op.norm else (None, None)
    if key.fold:   # gemm_key decided (fold_norm)
        bias = fold_weights(segs[0], bias, gn_b)
    if key.subpixel:
        w, ldw, nks = pack_subpixel(prec, key.bn, key.bk, p[op.prefix + ".weight"])
    else:
        w, ldw, nks = pack_gemm(prec, key.bn, key.bk, segs)
    blobs = {"w": w, "bias": padded(bias, round_up(n, key.bn))}
    if key.fold:
        blobs["gn_fold"] = fold_table(w, prec, nks[0] * key.bk, xt.channels, gn_w, gn_b)
    elif op.norm:
        blobs["gn_w"] = padded(gn_w, xt.channels)
        blobs["gn_b"] = padded(gn_b, xt.channels)
    return blobs, ldw, nks


def gemm_conv_spec(op: Op, ctx: Ctx) -> OpSpec:
    plan = ctx.plan
    xt, ot = plan.tensors[op.x], plan.tensors[op.out]
    key = gemm_key(op, ctx)
    tile = (key.bm, key.bn)
    n, m = ot.channels, ot.size * ot.size
    xr = k_residual(op)
    cr = plan.tensors[xr].channels if xr else 0
    res = op.residual if (op.residual and not xr) else None
    fold = key.fold
    packed = memoized(ctx, ("gemm_blobs", op.out, key.dtype, key.bn, key.bk, key.fold, key.subpixel),
                      lambda: gemm_blobs(op, ctx, key))
    blobs, ldw, nks = dict(packed[0]), packed[1], packed[2]   # split_k adds to the op's own dict
    oscale = output_scale(op, ctx) if "o" in key.feat else None   # the generic kernel's o: maybe none
    if oscale is not None:
        blobs["oscale"] = padded(oscale, round_up(n, key.bn))
    mtiles, ntiles = cdiv(m, tile[0]), cdiv(n, tile[1])
    splits, ws_bytes = split_k(blobs, mtiles, ntiles, sum(nks), key, ctx, op.out)
    check_features(key, op.out, nks, splits)
    grid = (mtiles * splits, ntiles, ctx.batch)
    # (normalized: 8 * Cin bytes for the table; a folded norm uses 2 * Cin of them)
    smem = halo_smem(key, conv_geom(op, ctx)) if key.halo else pipe_smem(key, 8 * xt.channels if op.norm else 0)
    act = {"none": 0, "gelu": 1}[op.act]

    def make_args(r: Resolver) -> Tuple[Any, ...]:
        x_ptr, ldx = r.tensor(op.x)
        xr_ptr, ldr = r.tensor(xr) if xr else (0, 0)
        res_ptr, ldres = r.tensor(res) if res else (0, 0)
        out_ptr, ldo = r.tensor(op.out)
        tb_ptr, tb_stride = r.tbias(op.tbias) if op.tbias else (0, 0)
        gn_part, gn_n = r.stats_in(op) if op.norm else (0, 0)
        gn_w_ptr = r.blob(op.out, "gn_w") if op.norm and not fold else 0
        gn_b_ptr = r.blob(op.out, "gn_b") if op.norm and not fold else 0
        gn_fold = r.blob(op.out, "gn_fold") if fold else 0
        return (P(x_ptr), I(xt.size), I(xt.size), I(xt.channels), I(ldx), P(xr_ptr), I(cr), I(ldr),
                P(r.blob(op.out, "w")), I(ldw), I(nks[0]), I(nks[1] if len(nks) > 1 else 0),
                P(r.blob(op.out, "bias")), P(tb_ptr), I(tb_stride), r.t_idx if op.tbias else P(0),
                P(gn_w_ptr), P(gn_b_ptr), P(gn_fold), P(gn_part), I(gn_n), F(r.norm_eps), P(res_ptr), I(ldres),
                P(out_ptr), I(ot.size), I(ot.size), I(n), I(ldo), P(r.stats_out(op.out)), I(act),
                P(0), F(0.0), *split_args(r, op.out, splits, ws_bytes),
                P(r.blob(op.out, "oscale") if oscale is not None else 0))

    return OpSpec(op, key, grid, (key.threads, 1, 1), smem, blobs, make_args, mtiles * ntiles, ws_bytes)


def gemm_workspace(batch: int, mtiles: int, ntiles: int, splits: int, bm: int, bn: int, gate: bool) -> Tuple[int, int]:
    """(fp32 workspace elements, int32 counters) of a GEMM launch, as kernels/conv.cu conv_finish lays
    them out: with splits > 1 the split-K partial tiles and one ticket per (sample, tile); then, for
    a gate whose N is split over ntiles CTAs, each (sample, m tile)'s row partials of psi and its
    ticket."""
    tiles = batch * mtiles * ntiles
    ws, ctr = (tiles * splits * bm * bn, tiles) if splits > 1 else (0, 0)
    if gate and ntiles > 1:
        ws, ctr = ws + tiles * bm, ctr + batch * mtiles
    return ws, ctr


def split_k(blobs: Dict[str, np.ndarray], mtiles: int, ntiles: int, nk: int, key: ConvKey, ctx: Ctx,
            name: str) -> Tuple[int, int]:
    """Splits, workspace bytes; adds the zeroed tickets (gemm_workspace) to the op's blobs."""
    splits = op_splits(key, ctx, name, mtiles, ntiles, nk)
    ws, ctr = gemm_workspace(ctx.batch, mtiles, ntiles, splits, key.bm, key.bn, key.gate)
    if ctr:
        blobs["counters"] = np.zeros(ctr, dtype=np.int32)
    return splits, 4 * ws


def split_args(r: Resolver, name: str, splits: int, ws_bytes: int) -> Tuple[Any, ...]:
    if not ws_bytes:
        return I(splits), P(0), P(0)
    return I(splits), P(r.workspace(name)), P(r.blob(name, "counters"))


def gate_key(op: Op, ctx: Ctx) -> Any:
    """The narrow gates' gate.cu key (ops.gate.rows_gate), else the GEMM gate's ConvKey."""
    if gate_rows.rows_gate(op, ctx):
        return gate_rows.rows_key(op, ctx)
    xname, skip = op.inputs
    g, r_ch, size = (ctx.plan.tensors[xname].channels, ctx.plan.tensors[skip].channels,
                     ctx.plan.tensors[skip].size)
    vec = vec_for(ctx.precision, ctx, (xname, skip, op.out), (g, r_ch))
    pipe = pipelined(ctx, vec)
    bm, bn, wm, wn = choose_tile(ctx.precision, size * size, g, ctx.tile_batch or ctx.batch, ctx.sms, gate=True,
                                 pipelined=pipe)
    bk = 64 if (pipe and bn < g) else choose_bk(ctx.precision, bm, bn, vec, True)   # the split gates' tuned BK
    key = ConvKey(ctx.precision, bm, bn, bk, wm, wn, 1, 1, 1, vec, True, nsplit=bn < g)
    key = tuned_key(key, ctx, op.out, g, 0) or with_pipeline(key, ctx, 0)
    return with_features(key, op, ctx, {"g": False, "t": False, "n": False, "k": True, "r": False, "o": False},
                         size * size, g,
                         cdiv(g, key.bk) + cdiv(r_ch, key.bk))


def gate_spec(op: Op, ctx: Ctx) -> OpSpec:
    if gate_rows.rows_gate(op, ctx):
        return gate_rows.rows_spec(op, ctx)
    plan, p, prec = ctx.plan, ctx.params, ctx.precision
    xname, skip = op.inputs
    g, r_ch, size = plan.tensors[xname].channels, plan.tensors[skip].channels, plan.tensors[skip].size
    m = size * size
    key = gate_key(op, ctx)
    tile = (key.bm, key.bn)
    f32 = lambda k: np.asarray(p[op.prefix + k], dtype=np.float32)  # noqa: E731
    segs = [np.asarray(p[op.prefix + ".gate_conv.weight"]).reshape(g, g),   # their own dtype: pack_gemm converts
            np.asarray(p[op.prefix + ".residual_conv.weight"]).reshape(g, r_ch)]
    bias = f32(".gate_conv.bias") + f32(".residual_conv.bias")
    w, ldw, nks = pack_gemm(prec, tile[1], key.bk, segs)
    npad = round_up(g, tile[1])
    blobs = {"w": w, "bias": padded(bias, npad), "psi": padded(f32(".psi.weight"), npad)}
    psi_b = float(f32(".psi.bias").ravel()[0])
    mtiles, ntiles = cdiv(m, tile[0]), cdiv(g, tile[1])   # ntiles > 1: N split, psi summed by a ticket
    splits, ws_bytes = split_k(blobs, mtiles, ntiles, sum(nks), key, ctx, op.out)
    check_features(key, op.out, nks, splits)
    grid = (mtiles * splits, ntiles, ctx.batch)

    def make_args(r: Resolver) -> Tuple[Any, ...]:
        x_ptr, ldx = r.tensor(xname)
        s_ptr, lds = r.tensor(skip)
        out_ptr, ldo = r.tensor(op.out)
        return (P(x_ptr), I(size), I(size), I(g), I(ldx), P(s_ptr), I(r_ch), I(lds),
                P(r.blob(op.out, "w")), I(ldw), I(nks[0]), I(nks[1]),
                P(r.blob(op.out, "bias")), P(0), I(0), P(0),
                P(0), P(0), P(0), P(0), I(0), F(0.0), P(0), I(0),
                P(out_ptr), I(size), I(size), I(g), I(ldo), P(0), I(0),
                P(r.blob(op.out, "psi")), F(psi_b), *split_args(r, op.out, splits, ws_bytes), P(0))

    return OpSpec(op, key, grid, (key.threads, 1, 1), pipe_smem(key, 0), blobs, make_args, 0, ws_bytes)

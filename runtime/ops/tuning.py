"""Measured tiles: the candidate tiles of each GEMM conv and gate (what `jetson-tune` times) and the
tuning file that records the fastest per op, which the executor then uses instead of the built-in
rules (jetson_unet.ops.tiles) when its KernelPolicy finds or names one.

A tuning file belongs to one (model config, device, SM count, precision, batch): tiles that win on
an H100 at batch 16 say nothing about an Orin Nano at batch 1, so `load_tiles` refuses a file made
for other ones. Format (JSON): {"format": 1, "device", "sms", "precision", "batch", "config",
"tiles": {op: {bm, bn, wm, wn, bk, stages, splits, halo, ks}}, ...measurements}; halo (1: the halo
conv, kernels/conv_halo.cu; 2: its row tiles) and ks (k slices of the cp.async conv) may be absent (0, 1).

Where `find_tiles` looks: the user's folder (jetson_unet.paths.user_tiles_dir: $JETSON_UNET_TILES,
else ~/.cache/jetson-unet/tiles, where `jetson-tune` writes), then the files shipped as package data
(jetson_unet.tiles, measured on the lent H100 and H200). The file name carries the device, so one
folder serves several GPUs.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from jetson_unet.errors import ConfigError
from jetson_unet.files import atomic_open
from jetson_unet.paths import shipped_tiles_dir, user_tiles_dir
from jetson_unet.model.plan import CONV, GATE, Op
from jetson_unet.ops.conv_halo import HALO_STAGES, conv_geom, halo_problems, rows_key
from jetson_unet.ops.common import MAX_STAGES, SMEM_LIMIT, VEC_MAX, Ctx, TileChoice, cdiv, k_residual
from jetson_unet.ops.conv_pipe import PIPE_RING_LIMIT, PIPE_SCRATCH, pipe_ring_bytes
from jetson_unet.ops.gate import rows_gate
from jetson_unet.ops.conv import check_key, conv_matrix, gate_key, gemm_key, subpixel_rows
from jetson_unet.ops.specs import kernel_kind, op_spec

FORMAT = 1
SHIPPED = shipped_tiles_dir()
# (BM, BN, WM, WN): 4-warp tiles from 32x32 to 128x64, and 8-warp ones for 128-row / 128-column tiles
TC_TILES = ((32, 32, 2, 2), (32, 64, 2, 2), (64, 32, 2, 2), (64, 64, 2, 2), (128, 32, 2, 2), (128, 64, 2, 2),
            (64, 128, 2, 2), (128, 64, 4, 2), (64, 128, 2, 4), (128, 128, 4, 2), (64, 64, 2, 1))
FFMA_TILES = ((32, 32, 2, 2), (64, 32, 2, 2), (32, 64, 2, 2), (64, 64, 2, 2))
GATE_ROWS = ((32, 2, 2), (64, 2, 2), (32, 1, 4), (64, 1, 4))
# the halo conv's tiles (kernels/conv_halo.cu), each with BK 64 where Cin allows it, else 32; all
# with <= 32 accumulators per thread (128x128 with 8 warps spilled on sm_87)
HALO_TILES = ((32, 32, 2, 2), (32, 64, 2, 2), (64, 32, 2, 2), (64, 64, 2, 2), (128, 32, 2, 2), (128, 64, 4, 2),
              (64, 128, 2, 4))
# the row tiles' (rows per tile, channels per warp), at BN 32 to 128 and 2 or 3 stages (conv_halo.rows_problems
# keeps those that fit)
ROWS_TILES = ((2, 32), (4, 32), (8, 16))
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)


def tunable(op: Op, ctx: Ctx) -> bool:
    """The GEMM convs and the GEMM gates (the narrow gates run gate.cu, which has no tiles)."""
    if op.kind == GATE:
        return not rows_gate(op, ctx)
    return op.kind == CONV and kernel_kind(op, ctx.plan) == "gemm"


def base_key(op: Op, ctx: Ctx) -> Any:
    """The heuristic's key of `op` (no tuned tile), whose vec / kh / stride / up a candidate keeps."""
    plain = dataclasses.replace(ctx, tiles={})
    return gate_key(op, plain) if op.kind == GATE else gemm_key(op, plain)


def candidates(op: Op, ctx: Ctx) -> List[TileChoice]:
    """Every tile of `op` worth timing that the kernels can instantiate (ops.check_key), splits left
    to the heuristic; the heuristic's own tile first."""
    heur = base_key(op, ctx)
    # what the im2col candidates derive from (the tile decides the fold and, for up2, the sub-pixel
    # form again: ops.gemm_key)
    up2 = op.kind != GATE and op.in_map == "up2"
    key = dataclasses.replace(heur, halo=False, rows=False, fold=False, kh=3 if up2 else heur.kh)
    rows = ctx.plan.tensors[op.x].size ** 2
    gate = op.kind == GATE
    n = ctx.plan.tensors[op.x if gate else op.out].channels
    dyn = 0 if gate or not op.norm else 8 * ctx.plan.tensors[op.x].channels
    tc = ctx.precision != "fp32"
    if gate:
        # the whole N in one CTA, or split over 2-4 CTAs whose psi partials meet through a ticket;
        # split ones with <= 16 accumulators per thread (at 32, ptxas spilled 16-24 bytes on sm_87
        # around the ticket epilogue, at the 128- and at the 168-register cap alike)
        shapes = [(bm, bn, wm, wn) for bn in (key.bn, key.bn // 2, key.bn // 4) if bn >= 32
                  for bm, wm, wn in GATE_ROWS if bn == key.bn or bm * bn <= 512 * wm * wn]
    else:
        widest = max(32, 1 << (n - 1).bit_length())   # no BN wider than N rounded up to a power of two
        shapes = [s for s in (TC_TILES if tc else FFMA_TILES) if s[1] <= widest]
    pipe = tc and key.vec == VEC_MAX[ctx.precision]
    out = [TileChoice(heur.bm, heur.bn, heur.wm, heur.wn, heur.bk, heur.stages, halo=halo_kind(heur))]
    for bm, bn, wm, wn in shapes:
        variants = []
        if pipe:
            for stages in range(3, min(4, MAX_STAGES) + 1):
                # the deepest static ring; at 3 stages also each deeper one (BK 64 over a static BK 32,
                # or a tile no static ring fits) in dynamic smem (ops.deep_ring; check_key keeps those
                # that fit)
                budget = min(PIPE_RING_LIMIT, SMEM_LIMIT - PIPE_SCRATCH - dyn)
                for bk in (64, 32):
                    static = pipe_ring_bytes(bm, bn, bk, stages) <= budget
                    if static or stages == 3:
                        variants.append((bk, stages))
                    if static:
                        break
        else:
            variants = [(64, 0), (32, 0)] if tc else [(16, 0)]
        for bk, stages in variants:
            # k slices for tiles of up to 4 warps and 32 accumulators per thread (8 warps with them,
            # still two CTAs per SM at the 128-register cap: more warps per tile, the batch-1 case)
            for ks in ((1, 2) if stages and wm * wn <= 4 and bm * bn <= 1024 * wm * wn else (1,)):
                t = TileChoice(bm, bn, wm, wn, bk, stages, ks=ks)
                try:
                    if up2 and stages and subpixel_rows(t, rows) != bm:
                        continue   # a sub-pixel tile lies in one parity class (ops.conv.subpixel)
                    check_key(dataclasses.replace(key, bm=bm, bn=bn, wm=wm, wn=wn, bk=bk, stages=stages, ks=ks,
                                                  kh=2 if up2 and stages else key.kh,
                                                  nsplit=gate and bn < n), n, dyn, op.out)
                except ConfigError:
                    continue
                if t not in out:
                    out.append(t)
    if pipe and not gate:
        geom = conv_geom(op, ctx)
        for bm, bn, wm, wn in HALO_TILES:
            if bn > widest:
                continue
            for bk in (64, 32):
                k = dataclasses.replace(key, bm=bm, bn=bn, wm=wm, wn=wn, bk=bk, stages=HALO_STAGES, halo=True)
                if not halo_problems(k, geom):
                    t = TileChoice(bm, bn, wm, wn, bk, HALO_STAGES, halo=1)
                    if t not in out:
                        out.append(t)
                    break
        for th, wtn in ROWS_TILES:
            for bn in (32, 64, 128):
                for stages in (2, 3):
                    k = rows_key(key, geom, th, bn, stages, wtn)
                    if bn <= widest and n % bn == 0 and not halo_problems(k, geom):
                        t = TileChoice(k.bm, k.bn, k.wm, k.wn, k.bk, stages, halo=2)
                        if t not in out:
                            out.append(t)
    return out


def halo_kind(key: Any) -> int:
    """TileChoice.halo of a key: 0 im2col, 1 the halo conv, 2 its row tiles."""
    return 2 if key.rows else int(key.halo)


def builtin_tiles(ctx: Ctx) -> Dict[str, TileChoice]:
    """The built-in heuristic's tile of every tunable op for ctx's batch and SM count, with its split-K
    factor: what an untuned GPU of ctx.sms SMs runs, as a tile mapping any GPU can run (tests/gpu runs
    an Orin's on the lent GPU)."""
    plain = dataclasses.replace(ctx, tiles={})
    out = {}
    for op in ctx.plan.ops:
        if tunable(op, plain):
            spec = op_spec(op, plain)
            k, m = spec.key, ctx.plan.tensors[op.out].size ** 2
            out[op.out] = TileChoice(k.bm, k.bn, k.wm, k.wn, k.bk, k.stages, splits=spec.grid[0] // cdiv(m, k.bm),
                                     halo=halo_kind(k), ks=k.ks)
    return out


def k_segments(op: Op, ctx: Ctx) -> List[int]:
    """The GEMM's K segments (the conv, then its residual's (ops.k_residual) or the gate's skip input)."""
    t = ctx.plan.tensors
    if op.kind == GATE:
        return [t[op.inputs[0]].channels, t[op.inputs[1]].channels]
    xr = k_residual(op)
    return [conv_matrix(op, ctx.params).shape[1]] + ([t[xr].channels] if xr else [])


def with_splits(t: TileChoice, segments: List[int]) -> List[TileChoice]:
    """`t` with each split-K factor that leaves every split at least two k-tiles (the row tiles: none)."""
    if t.halo == 2:
        return []
    nk = sum(cdiv(k, t.bk) for k in segments)
    return [dataclasses.replace(t, splits=s) for s in SPLITS if s <= max(1, nk // 2)]


def dump_tiles(path: Path, tiles: Mapping[str, TileChoice], meta: Mapping[str, Any]) -> None:
    doc = dict(meta)
    doc["format"] = FORMAT
    doc["tiles"] = {name: dataclasses.asdict(t) for name, t in sorted(tiles.items())}
    with atomic_open(Path(path), "w") as f:
        f.write(json.dumps(doc, indent=1) + "\n")


def load_tiles(path: Path, precision: str, batch: int, sms: int, config: Any = None) -> Dict[str, TileChoice]:
    """The tiles of a tuning file, refused (ConfigError, one line) when it was measured for another
    precision, batch, SM count or (when given) model config, or is not a tuning file."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
        tiles = {str(k): TileChoice(**{f: int(v[f]) for f in ("bm", "bn", "wm", "wn", "bk", "stages", "splits")},
                                    halo=int(v.get("halo", 0)), ks=int(v.get("ks", 1)))
                 for k, v in doc["tiles"].items()}
        several = sorted(k for k, v in doc["tiles"].items() if int(v.get("mt", 1)) != 1)
        made = (str(doc["precision"]), int(doc["batch"]), int(doc["sms"]))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the tuning file ({e.strerror or e})") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"{path}: not a tuning file of format {FORMAT} ({type(e).__name__}: {e})") from None
    if several:   # an older tuner's kernels with several M tiles per CTA, which no longer exist
        raise ConfigError(f"{path}: {several[0]} asks for several M tiles per CTA, which this version does not "
                          "have; measure the tiles again with jetson-tune")
    if made != (precision, int(batch), int(sms)):
        raise ConfigError(f"{path}: tiles measured for {made[0]} batch {made[1]} on {made[2]} SMs, "
                          f"not {precision} batch {batch} on {sms} SMs")
    if config is not None and doc.get("config") != config.to_dict():
        raise ConfigError(f"{path}: tiles measured for another model config")
    return tiles


def tiles_dirs() -> List[Path]:
    """Where find_tiles looks, first match wins: the user's tuning files (jetson_unet.paths), then
    the shipped ones."""
    return [user_tiles_dir(), SHIPPED]


def device_slug(device: str) -> str:
    """The device's part of its tuning files' names ("NVIDIA H200" -> "nvidia-h200")."""
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "gpu"


def file_name(device: str, sms: int, precision: str, batch: int) -> str:
    """The tuning file's name (FILE_NAME)."""
    return f"tiles-{device_slug(device)}-{int(sms)}sm-{precision}-b{int(batch)}.json"


FILE_NAME = re.compile(r"tiles-(?P<device>[a-z0-9-]+)-(?P<sms>[0-9]+)sm-(?P<precision>[a-z0-9]+)-b(?P<batch>[0-9]+)\.json")


def builtin_tiles_notice(device: str, sms: int, precision: str, batch: int) -> str:
    """What the executor says when find_tiles found nothing for this GPU: it runs the built-in tiles (on
    the H200 a call was 2.5% / 1.5% slower at batch 1 / 16 with them than with its measured ones)."""
    return (f"no measured tiles for {device} ({sms} SMs), {precision}, batch {batch}: built-in tiles; "
            f"`jetson-tune --precision {precision} --batch {batch}` measures them once "
            "(a few minutes)")


# A file of another batch, or of another SM count of the same GPU, stands in at the same number of
# images per SM, or the nearest in octaves, where both give the GPU at least one image per
# NEIGHBOUR_SMS_PER_IMAGE SMs: there the call is compute-bound and an op's fastest tile hardly moves
# with the load. H200, one call as a graph replay against the built-in tiles (docs/kernels.md,
# "Measured tiles"): on 8 SMs the batch-4 and batch-16 files won at batch 2 to 32 (1-11%); on 132 SMs
# the batch-16 and batch-64 files won at 24, 32 and 128 (8-18%), and the batch-1 and batch-16 files
# lost at batch 4 (17-21%) and 8 (1-48%), where a whole GPU's grids are a few waves deep; on 16 SMs
# the 8-SM files of half the batch won at batch 2, 4, 8 and 32 (9-13%), as much as 16-SM tunes.
NEIGHBOUR_SMS_PER_IMAGE = 10


@dataclasses.dataclass(frozen=True)
class Found:
    """A tuning file find_tiles takes: its tiles, and the batch and SM count they were measured at."""
    path: Path
    tiles: Dict[str, TileChoice]
    batch: int
    sms: int


def neighbour_load(batch: int, sms: int, measured: Sequence[Tuple[int, int]]) -> Optional[Tuple[int, int]]:
    """The measured (batch, SM count) whose tuning file a run of `batch` on `sms` SMs takes: its own,
    else the nearest in images per SM, in octaves (the larger on a tie), among those where both are
    compute-bound (NEIGHBOUR_SMS_PER_IMAGE); None where none is."""
    def compute_bound(b: int, s: int) -> bool:
        return NEIGHBOUR_SMS_PER_IMAGE * b >= s
    if (batch, sms) in measured:
        return batch, sms
    if not compute_bound(batch, sms):
        return None
    near = [(b, s) for b, s in set(measured) if compute_bound(b, s)]
    if not near:
        return None
    # octaves apart in images per SM; on a tie the more images per SM, then the more SMs
    return min(near, key=lambda m: (abs(math.log2(m[0] * sms / (m[1] * batch))), -m[0] / m[1], -m[1]))


def neighbour_tiles_notice(device: str, sms: int, precision: str, batch: int, found: Found) -> str:
    """What the executor says when a neighbouring batch's file, or another SM count's, stands in."""
    which = (f"those of batch {found.batch}" if found.sms == sms else
             f"those measured on {found.sms} SMs at batch {found.batch}")
    return (f"no measured tiles for {device} ({sms} SMs), {precision}, batch {batch}: {which}; "
            f"`jetson-tune --precision {precision} --batch {batch}` measures this batch's once (a few minutes)")


def find_tiles(config: Any, device: str, sms: int, precision: str, batch: int,
               dirs: Optional[Sequence[Path]] = None) -> Optional[Found]:
    """The first tuning file for this (device, SMs, precision, batch) whose config matches; else the
    neighbouring batch's (neighbour_load) among this SM count's files, or, where this device has none
    for this SM count, among its files for other SM counts (an Orin Nano 4GB takes the 8-SM files at
    twice its batch), which the run then takes as it was measured (every rule at that batch and SM
    count: Ctx.tile_batch, Ctx.sms); else None. A file that exists but does not fit (another config,
    corrupt) is skipped, not fatal: the built-in tiles always work."""
    dirs = tiles_dirs() if dirs is None else dirs
    name = file_name(device, sms, precision, batch)
    for d in dirs:
        path = Path(d) / name
        if path.is_file():
            try:
                return Found(path, load_tiles(path, precision, batch, sms, config), int(batch), int(sms))
            except ConfigError:
                continue
    files = {(b, s): (path, tiles) for b, s, path, tiles in usable_files(config, precision, dirs, device=device)}
    own = [m for m in files if m[1] == sms]
    near = neighbour_load(batch, sms, own or list(files))
    return None if near is None else Found(files[near][0], files[near][1], near[0], near[1])


def usable_files(config: Any, precision: str, dirs: Sequence[Path], device: Optional[str] = None,
                 sms: Optional[int] = None) -> List[Tuple[int, int, Path, Dict[str, TileChoice]]]:
    """(batch, SM count, path, tiles) of each tuning file in `dirs` for this precision and config, of
    this device and SM count where given (else of any), the first folder winning per file name."""
    out: List[Tuple[int, int, Path, Dict[str, TileChoice]]] = []
    seen = set()
    for d in dirs:
        for path in sorted(Path(d).glob(f"tiles-*-{precision}-b*.json")):
            m = FILE_NAME.fullmatch(path.name)
            if m is None or path.name in seen:
                continue
            seen.add(path.name)
            if (device is not None and m["device"] != device_slug(device)) or (sms is not None and int(m["sms"]) != sms):
                continue
            try:
                batch, count = int(m["batch"]), int(m["sms"])
                out.append((batch, count, path, load_tiles(path, precision, batch, count, config)))
            except ConfigError:
                continue
    return out


def tile_files(config: Any, sms: int, precision: str,
               dirs: Optional[Sequence[Path]] = None) -> List[Tuple[int, Dict[str, TileChoice]]]:
    """(batch, tiles) of every usable tuning file of this SM count, precision and config in the tile
    folders, whatever its device and batch, the first folder winning per file name as in find_tiles.
    Their tiles join the module of every run of that SM count and precision (ops.specs.all_tile_keys),
    so a batch size with a file of its own, or running its neighbour's (find_tiles), compiles nothing
    of its own."""
    files = usable_files(config, precision, tiles_dirs() if dirs is None else dirs, sms=sms)
    return [(b, tiles) for b, _sms, _path, tiles in files]

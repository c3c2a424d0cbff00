"""What another batch's tuning file does at a batch: the whole call as a graph replay with the
built-in tiles and with each named batch's file of this GPU, three rounds in turns (jetson-tune's
whole-call timing), one process and one module for all.

    python -m tools.lab.neighbour_tiles --sms 8 --batch 8 --files 4 16    # on an 8-SM slice
    python -m tools.lab.neighbour_tiles --batch 4 --files 1 16            # on the whole GPU
    python -m tools.lab.neighbour_tiles --sms 16 --batch 2 --files 2 1@8  # and the 8-SM slice's batch-1 file

Each file runs as a run without a file of its own runs it (jetson_unet.ops.tuning.find_tiles: every
rule at the file's batch), found alone in a scratch folder; where the neighbour rule would not take it
(ops.tuning.neighbour_load), its tiles run as this batch's own ("as b<batch>": split-K and the
untuned ops follow the batch). What the rule's threshold rests on (docs/kernels.md, "Measured tiles").
`B@S` names the file of batch B measured on S SMs of this GPU, its tiles run as this batch's own: how
far tiles carry to another SM count at the same images per SM (docs/kernels.md, an SM count without files).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from jetson_unet.bench.timing import bench_weights
from jetson_unet.model.plan import build_plan
from jetson_unet.ops.policy import BUILTIN, KernelPolicy, run_context
from jetson_unet.ops.specs import module_keys
from jetson_unet.ops.tuning import file_name, find_tiles, neighbour_load
from jetson_unet.tune import build_shards, time_calls
from tools.lab import cupy_backend

PRECISION = "fp16"


def file_arg(text: str) -> Tuple[int, Optional[int]]:
    """A --files entry: "B" (this SM count's file of batch B) or "B@S" (that of S SMs)."""
    try:
        b, _, s = text.partition("@")
        return int(b), (int(s) if s else None)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--files takes B or B@S (batch, SM count), got {text!r}") from None


def policies(weights, device: str, sms: int, batch: int, files: List[Tuple[int, Optional[int]]],
             scratch: Path) -> Dict[str, KernelPolicy]:
    """{label: policy}: the built-in tiles, then each file as a neighbour (or as this batch's own)."""
    out = {"built-in": KernelPolicy(tiles=BUILTIN, sms=sms)}
    for b, at in files:
        found = find_tiles(weights.config, device, at or sms, PRECISION, b)
        if found is None or (found.batch, found.sms) != (b, at or sms):
            raise SystemExit(f"neighbour_tiles: no tuning file for {device} ({at or sms} SMs), {PRECISION}, batch {b}")
        if at is not None:
            out[f"b{b}@{at} as b{batch}"] = KernelPolicy(tiles=found.tiles, sms=sms)
        elif neighbour_load(batch, sms, [(b, sms)]) == (b, sms):
            folder = scratch / f"b{b}"
            folder.mkdir()
            shutil.copy(found.path, folder / file_name(device, sms, PRECISION, b))
            out[f"b{b}'s file"] = KernelPolicy(tile_dirs=[folder], sms=sms)
        else:
            out[f"b{b}'s file as b{batch}"] = KernelPolicy(tiles=found.tiles, sms=sms)
    return out


def shared_keys(weights, sms: int, batch: int, calls: Dict[str, KernelPolicy], device: str) -> List:
    """Every key of every variant's module (ops.policy.run_context): one module text for all executors."""
    plan = build_plan(weights.config)
    keys = set()
    for p in calls.values():
        ctx, *_, tuned = run_context(weights, plan, PRECISION, batch, device, sms, p)
        keys.update(module_keys(ctx, tuned))
    return sorted(keys, key=lambda k: k.symbol)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.lab.neighbour_tiles", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, required=True, help="the batch timed")
    ap.add_argument("--files", type=file_arg, nargs="+", required=True,
                    help="the batches whose tuning files run there (B@S: the file of S SMs)")
    ap.add_argument("--sms", type=int, default=None, help="on a slice of N SMs (a CUDA green context)")
    args = ap.parse_args(argv)
    backend = cupy_backend("neighbour_tiles", args.sms)
    if backend is None:
        return 2
    weights, _ = bench_weights()
    device, sms = backend.device_name(), backend.sm_count()
    with tempfile.TemporaryDirectory() as scratch:
        calls = policies(weights, device, sms, args.batch, args.files, Path(scratch))
        keys = shared_keys(weights, sms, args.batch, calls, device)
        ms, _eps = time_calls(weights, PRECISION, args.batch, backend, calls, keys, build_shards(), {})
    base = ms["built-in"]
    print(f"{device}, {sms} SMs, {PRECISION} batch {args.batch}, one call as a graph replay, median of 3 rounds:")
    for label, v in ms.items():
        print(f"  {label:24s} {v:8.3f} ms  {100.0 * (v / base - 1.0):+6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Launch chosen kernels of one U-Net call inside an NVTX range, for Nsight Compute to profile just
those (on a Jetson as on a workstation):

    ncu --nvtx --nvtx-include "ops/" --section SpeedOfLight --section WarpStateStats \\
        python3 tools/ncu_ops.py --batch 16 --ops ups.3.block1.conv1 downs.0.block1.dw
    python3 tools/ncu_ops.py --batch 1 --list          # the op names, kernels and grids

The executor first runs one whole call (every input of the chosen ops is then real data, and every
kernel is loaded), then launches each chosen op once inside the range "ops". --tiles uses a tuning
file (tools/tune_tiles.py) instead of the built-in tiles.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jetson_unet.errors import UsageError  # noqa: E402
from jetson_unet.backends import get_backend  # noqa: E402
from jetson_unet.executor.executor import GpuExecutor, device_sm_count  # noqa: E402
from jetson_unet.ops.tuning import load_tiles  # noqa: E402
from bench_unet import bench_weights  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precision", default="fp16", choices=("fp32", "fp16", "bf16"))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--ops", nargs="*", default=[], help="tensor names of the ops to launch")
    ap.add_argument("--list", action="store_true", help="print every op's kernel and grid, launch nothing")
    ap.add_argument("--tiles", default="", help="a tuning file for this precision, batch and GPU")
    args = ap.parse_args(argv)
    backend = get_backend("cupy")
    weights, _ = bench_weights()
    tiles = load_tiles(args.tiles, args.precision, args.batch, device_sm_count(backend)) if args.tiles else None
    with GpuExecutor(weights, args.precision, batch=args.batch, backend=backend, tiles=tiles) as ex:
        if args.list:
            for L in ex.launches:
                print(f"{L.name:28s} {L.fn.symbol:40s} grid {L.grid} block {L.block}")
            return 0
        names = {L.name for L in ex.launches}
        unknown = [n for n in args.ops if n not in names]
        if unknown:
            raise UsageError(f"no op named {', '.join(unknown)} (see --list)")
        cfg = ex.config
        x = np.random.default_rng(0).standard_normal((args.batch, cfg.channels, cfg.image_size,
                                                      cfg.image_size)).astype(np.float32)
        ex.eps(x, 50)
        backend.nvtx_push("ops")
        for n in args.ops:
            ex.launch_op(n)
        backend.nvtx_pop()
        ex.stream.synchronize()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UsageError as e:
        print(f"ncu_ops: {e}", file=sys.stderr)
        sys.exit(2)

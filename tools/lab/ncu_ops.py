"""Launch chosen kernels of one U-Net call inside an NVTX range, for Nsight Compute to profile just
those (on a Jetson as on a workstation):

    ncu --nvtx --nvtx-include "ops/" --section SpeedOfLight --section WarpStateStats \\
        python3 -m tools.lab.ncu_ops --batch 16 --ops ups.3.block1.conv1 downs.0.block1.ds_conv
    python3 -m tools.lab.ncu_ops --batch 1 --list      # the op names, kernels and grids
    python3 -m tools.lab.ncu_ops --batch 1 --sms 8 --ops mid.block1.conv1   # on an 8-SM slice

The executor first runs one whole call (every input of the chosen ops is then real data, and every
kernel is loaded), then launches each chosen op once inside the range "ops". --tiles uses that tuning
file (written by `jetson-tune`); without it the executor takes the one measured for this GPU and
batch where there is one, else the built-in tiles.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from jetson_unet.backends import get_backend
from jetson_unet.bench.timing import bench_weights
from jetson_unet.errors import UsageError
from jetson_unet.executor.executor import GpuExecutor
from jetson_unet.ops.policy import KernelPolicy


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precision", default="fp16", choices=("fp32", "fp16", "bf16"))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--ops", nargs="*", default=[], help="tensor names of the ops to launch")
    ap.add_argument("--list", action="store_true", help="print every op's kernel and grid, launch nothing")
    ap.add_argument("--tiles", default="", help="a tuning file for this precision, batch and GPU")
    ap.add_argument("--sms", type=int, default=None, metavar="N",
                    help="run on a slice of N SMs (a CUDA green context), with the tiles for N SMs")
    args = ap.parse_args(argv)
    if args.sms is not None and args.sms < 1:
        raise UsageError(f"--sms takes a positive SM count, got {args.sms}")
    backend = get_backend("cupy", args.sms)
    weights, _ = bench_weights()
    policy = KernelPolicy(tiles=args.tiles or None)   # a file: checked against this precision, batch and GPU
    with GpuExecutor(weights, args.precision, batch=args.batch, backend=backend, policy=policy) as ex:
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

"""How the GPU executor picks its kernels: one object, passed from the Pipeline (or a CLI) down to
the executor. Nothing below it reads the environment or decides on its own.

    KernelPolicy()                            # the tuning file measured for this GPU and batch (else a
                                              # neighbouring batch's or SM count's), else the built-in tiles
    KernelPolicy(tiles="builtin")             # the built-in tile rules (jetson_unet.ops.tiles)
    KernelPolicy(tiles="tiles-orin.json")     # that tuning file (refused unless made for this run)
    KernelPolicy(sms=8)                       # tiles chosen for 8 SMs (a green-context slice of a larger GPU)

Within the tiles, the kernel family of each op follows the rules of jetson_unet.ops (docs/kernels.md).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from jetson_unet.errors import UsageError
from jetson_unet.model.arena import view_layout
from jetson_unet.ops.common import Ctx, TileChoice
from jetson_unet.ops.tuning import (builtin_tiles_notice, find_tiles, load_tiles, neighbour_tiles_notice,
                                    tile_files)

log = logging.getLogger(__name__)
BUILTIN = "builtin"
Tiles = Union[None, str, Path, Mapping[str, TileChoice]]


@dataclass(frozen=True)
class KernelPolicy:
    tiles: Tiles = None                          # None: find a tuning file; "builtin"; a file; {op: TileChoice}
    tile_dirs: Optional[Sequence[Path]] = None   # where None looks (default: jetson_unet.ops.tuning.tiles_dirs)
    sms: Optional[int] = None                    # the SM count tiles are chosen for (default: the device's)

    def __post_init__(self) -> None:
        if self.sms is not None and (isinstance(self.sms, bool) or not isinstance(self.sms, int) or self.sms < 1):
            raise UsageError(f"the SM count must be a positive integer, got {self.sms!r}")

    def device_sms(self, backend: Any) -> int:
        return int(self.sms) if self.sms else int(backend.sm_count())

    def resolve(self, config: Any, device: str, sms: int, precision: str, batch: int,
                quiet: bool = False) -> Tuple[Dict[str, TileChoice], Optional[str], Optional[int], Optional[int]]:
        """(the tiles, where they come from, the batch and the SM count they were measured at): {} are
        the built-in tiles (source None); a tuning file's path; "given" for a mapping. The batch and SM
        count are None but where a neighbouring batch's file, or another SM count's, stands in
        (ops.tuning.find_tiles): the run then takes every rule as at that batch and SM count
        (Ctx.tile_batch, Ctx.sms), and the module of that SM count. quiet: without the notice that
        says so (jetson-sample --prepare, which plans runs but makes none)."""
        t = self.tiles
        if t is None:
            found = find_tiles(config, device, sms, precision, batch, self.tile_dirs)
            if found is None:
                if not quiet:
                    log.info(builtin_tiles_notice(device, sms, precision, batch))
                return {}, None, None, None
            if (found.batch, found.sms) == (batch, sms):
                return found.tiles, str(found.path), None, None
            if not quiet:
                log.info(neighbour_tiles_notice(device, sms, precision, batch, found))
            return found.tiles, str(found.path), found.batch, (None if found.sms == sms else found.sms)
        if isinstance(t, str) and t == BUILTIN:
            return {}, None, None, None
        if isinstance(t, (str, Path)):
            return load_tiles(Path(t), precision, batch, sms, config), str(t), None, None
        return dict(t), ("given" if t else None), None, None

    def module_tiles(self, config: Any, sms: int, precision: str) -> List[Tuple[int, Dict[str, TileChoice]]]:
        """(batch, tiles) of the tuning files in this policy's folders for this SM count and precision,
        whichever tiles the run takes: they join every module of that SM count (ops.specs.all_tile_keys)."""
        return tile_files(config, sms, precision, self.tile_dirs)


def run_context(weights: Any, plan: Any, precision: str, batch: int, device: str, sms: int, policy: KernelPolicy,
                memo: Optional[Dict[Any, Any]] = None,
                quiet: bool = False) -> Tuple[Ctx, Optional[str], Optional[int], Optional[int], list]:
    """How a run of `policy` on `sms` SMs of `device` picks its kernels, before anything is built: (its
    Ctx, where its tiles come from, the batch and SM count they were measured at where another's file
    stands in (KernelPolicy.resolve), the tuning files whose tiles join its module). A file of another
    SM count brings its rules and its module: the run is, kernel for kernel, one of that SM count."""
    tiles, source, tile_batch, tile_sms = policy.resolve(weights.config, device, sms, precision, batch, quiet)
    sms = tile_sms or sms
    ctx = Ctx(plan, weights.params, precision, batch, sms, view_layout(plan), tiles=tiles,
              memo={} if memo is None else memo, tile_batch=tile_batch)
    return ctx, source, tile_batch, tile_sms, policy.module_tiles(weights.config, sms, precision)

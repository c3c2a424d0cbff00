"""Where the package's files and caches live: the one place for folders and the environment
variables that move them (read here and in the CLIs only).

| variable | what it moves | default |
| --- | --- | --- |
| JETSON_UNET_CACHE | the kernel cache root (cubins in `cubins/v1/`) | $XDG_CACHE_HOME/jetson-unet |
| JETSON_UNET_TILES | the folder of measured tuning files (`jetson-tune` writes there) | $XDG_CACHE_HOME/jetson-unet/tiles |
| XDG_CACHE_HOME | the user's cache folder | ~/.cache |
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

CACHE_ENV = "JETSON_UNET_CACHE"
TILES_ENV = "JETSON_UNET_TILES"


def models_dir() -> Path:
    """Folder of the shipped models: the package data `jetson_unet.models` (the repo's weights/)."""
    import jetson_unet.models as models
    return Path(models.__file__).parent


def kernels_dir() -> Path:
    """Folder of the CUDA sources: the package data `jetson_unet.kernels` (the repo's kernels/)."""
    import jetson_unet.kernels as kernels
    return Path(kernels.__file__).parent


def shipped_tiles_dir() -> Path:
    """The tuning files measured on the lent H100/H200, shipped as package data `jetson_unet.tiles`."""
    return Path(__file__).resolve().parent / "tiles"


def shipped_cubins_dir() -> Path:
    """The cubins of the shipped model, built at release time (`python -m tools.build_kernels`), shipped
    as package data `jetson_unet.cubins` and read-only to the loader."""
    return Path(__file__).resolve().parent / "cubins"


def _user_cache(environ: Mapping[str, str]) -> Path:
    """$XDG_CACHE_HOME (or ~/.cache)/jetson-unet."""
    return Path(environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")) / "jetson-unet"


def cache_root(environ: Mapping[str, str] = os.environ) -> Path:
    """The kernel cache root: $JETSON_UNET_CACHE, else $XDG_CACHE_HOME (or ~/.cache)/jetson-unet."""
    return Path(environ[CACHE_ENV]) if environ.get(CACHE_ENV) else _user_cache(environ)


def user_tiles_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """Where `jetson-tune` writes and the executor first looks: $JETSON_UNET_TILES, else
    $XDG_CACHE_HOME (or ~/.cache)/jetson-unet/tiles."""
    return Path(environ[TILES_ENV]) if environ.get(TILES_ENV) else _user_cache(environ) / "tiles"

"""Weights format: one .npz with every parameter under its dotted spec name, plus a JSON manifest.

The manifest is stored inside the same .npz as the entry `__manifest__` (UTF-8 JSON bytes as a
uint8 array), so a model is one file that cannot lose its manifest:

    {"format": "seed-unet-weights", "format_version": 1, "config": {...}, "schedule": {...},
     "param_dtype": "float16" | "float32", "content_hash": "sha256:...", "n_params": ...}

The content hash covers, per parameter in sorted name order: the name, dtype, shape and raw
little-endian bytes. Loading never unpickles (`allow_pickle=False`) and validates everything
before any tensor is handed out; each failure is a typed `WeightsError` naming the file and the
first offending tensor.
"""
from __future__ import annotations

import hashlib
import json
import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Union

import numpy as np

from jetson_unet.model.config import UNetConfig
from jetson_unet.errors import (ConfigError, WeightsDtypeError, WeightsError, WeightsFileError,
                                WeightsFormatError, WeightsHashError, WeightsNameError, WeightsShapeError,
                                WeightsValueError)
from jetson_unet.files import atomic_open
from jetson_unet.model.plan import param_shapes

FORMAT = "seed-unet-weights"
FORMAT_VERSION = 1
MANIFEST_KEY = "__manifest__"
PARAM_DTYPES = ("float16", "float32")
PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class Weights:
    path: str
    config: UNetConfig
    params: Dict[str, np.ndarray]   # dotted name -> array (PyTorch layout), in plan order
    manifest: Dict[str, Any]

    @property
    def param_dtype(self) -> str:
        return str(self.manifest["param_dtype"])


def content_hash(params: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(params):
        a = np.ascontiguousarray(params[name])
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        h.update(f"{name}|{a.dtype.str}|{a.shape}\n".encode())
        h.update(a.tobytes())
    return "sha256:" + h.hexdigest()


def random_params(config: UNetConfig, seed: int = 0, dtype: str = "float32") -> Dict[str, np.ndarray]:
    """PyTorch-like default init (uniform +-1/sqrt(fan_in)); norms start at weight 1, bias 0.

    For tests and benchmarks until/unless a trained model is used: the values are random but
    of realistic scale, so activations stay O(1) through the network."""
    rng = np.random.Generator(np.random.PCG64(seed))
    out: Dict[str, np.ndarray] = {}
    shapes = param_shapes(config)
    for name, shape in shapes.items():
        prefix, kind = name.rsplit(".", 1)
        if prefix.endswith((".norm1", ".norm2")):
            value = np.ones(shape) if kind == "weight" else np.zeros(shape)
            value = value + rng.uniform(-0.1, 0.1, size=shape)  # not exactly 1/0: tests see the affine
        else:
            w_shape = shapes[prefix + ".weight"]
            fan_in = int(np.prod(w_shape[1:]))
            bound = 1.0 / np.sqrt(fan_in)
            value = rng.uniform(-bound, bound, size=shape)
        out[name] = value.astype(dtype)
    return out


def save_weights(path: PathLike, config: UNetConfig, params: Mapping[str, np.ndarray],
                 dtype: str = "float32", extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Write `params` (cast to `dtype`) and the manifest atomically; returns the manifest.

    The names and shapes are checked against the config first, so nothing invalid is written."""
    if dtype not in PARAM_DTYPES:
        raise WeightsError(path, f"param dtype must be one of {PARAM_DTYPES}, got {dtype!r}")
    arrays = {name: np.ascontiguousarray(np.asarray(params[name]), dtype=dtype) for name in params}
    _check_tensors(str(path), config, arrays, dtype)
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "config": config.to_dict(), "schedule": config.to_dict()["schedule"],
        "param_dtype": dtype, "content_hash": content_hash(arrays),
        "n_params": int(sum(a.size for a in arrays.values())),
    }
    if extra:
        manifest["extra"] = extra
    blob = np.frombuffer(json.dumps(manifest, sort_keys=True).encode(), dtype=np.uint8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "wb") as f:
        np.savez(f, **{MANIFEST_KEY: blob}, **arrays)   # stored, not deflated: 16-bit weights shrink
        # ~8% compressed, and inflating them cost 0.12 s of every cold start on a 2-core x86 host
    return manifest


def load_weights(path: PathLike) -> Weights:
    """Read and validate a weights file; raises a `WeightsError` subclass on the first problem."""
    spath = str(path)
    if not os.path.isfile(spath):
        raise WeightsFileError(spath, "no such file")
    try:
        npz = np.load(spath, allow_pickle=False)
        if not isinstance(npz, np.lib.npyio.NpzFile):   # a plain .npy loads as one array
            raise WeightsFileError(spath, "not an .npz archive (a single .npy array?)")
        with npz:
            manifest = _read_manifest(spath, npz)
            arrays = {name: npz[name] for name in npz.files if name != MANIFEST_KEY}
    except WeightsError:
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, KeyError) as e:
        raise WeightsFileError(spath, f"unreadable or truncated .npz ({type(e).__name__}: {e})") from None
    try:
        config = UNetConfig.from_dict(manifest.get("config"))  # type: ignore[arg-type]
    except ConfigError as e:
        raise WeightsFormatError(spath, f"manifest config is invalid: {e}") from None
    dtype = manifest.get("param_dtype")
    if dtype not in PARAM_DTYPES:
        raise WeightsFormatError(spath, f"manifest param_dtype must be one of {PARAM_DTYPES}, got {dtype!r}")
    _check_tensors(spath, config, arrays, dtype)
    if content_hash(arrays) != manifest.get("content_hash"):
        raise WeightsHashError(spath, "content hash does not match the manifest (file modified or corrupt)")
    ordered = {name: arrays[name] for name in param_shapes(config)}
    return Weights(spath, config, ordered, manifest)


def _read_manifest(path: str, npz: Any) -> Dict[str, Any]:
    if MANIFEST_KEY not in npz.files:
        raise WeightsFormatError(path, f"no {MANIFEST_KEY} entry: not a seed-unet weights file")
    try:
        manifest = json.loads(npz[MANIFEST_KEY].tobytes().decode())
    except ValueError as e:
        raise WeightsFormatError(path, f"manifest is not valid JSON: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise WeightsFormatError(path, f"manifest format is not {FORMAT!r}")
    version = manifest.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:   # JSON true == 1 in Python
        raise WeightsFormatError(path, f"format version {manifest.get('format_version')!r} is not "
                                       f"supported (this runtime reads version {FORMAT_VERSION})")
    return manifest


def _check_tensors(path: str, config: UNetConfig, arrays: Mapping[str, np.ndarray], dtype: str) -> None:
    expected = param_shapes(config)
    for name in expected:
        if name not in arrays:
            raise WeightsNameError(path, "missing parameter", tensor=name)
    for name in arrays:
        if name not in expected:
            raise WeightsNameError(path, "unexpected parameter (not in the seed-unet spec for this config)", tensor=name)
    for name, shape in expected.items():
        a = arrays[name]
        if tuple(a.shape) != tuple(shape):
            raise WeightsShapeError(path, f"shape {tuple(a.shape)} does not match the config's {tuple(shape)}", tensor=name)
        if a.dtype != np.dtype(dtype):
            raise WeightsDtypeError(path, f"dtype {a.dtype} differs from the manifest's {dtype}", tensor=name)
        if not np.isfinite(a).all():
            raise WeightsValueError(path, "contains NaN or Inf", tensor=name)

"""Weights format: one .npz with every parameter under its dotted spec name, plus a JSON manifest.

The manifest is stored inside the same .npz as the entry `__manifest__` (UTF-8 JSON bytes as a
uint8 array), so a model is one file that cannot lose its manifest:

    {"format": "seed-unet-weights", "format_version": 1, "config": {...}, "schedule": {...},
     "param_dtype": "float16" | "float32", "content_hash": "sha256:...", "n_params": ...}

The content hash (`file_hash`) covers everything the file claims: every manifest field but the
hash itself (format, version, config, dtype, ..., as canonical JSON) and the tensors
(`content_hash`: per parameter in sorted name order, its name, dtype, shape and raw little-endian
bytes).

Loading never unpickles and checks before it reads: the file is a regular file; the zip's central
directory names exactly the config's parameters; each member's .npy header (read alone) has the
config's shape and the manifest's dtype, and the zip's declared size is what that header implies
(and not inflated from a much smaller compressed size). Only then is any tensor's data read, so
a hostile file cannot make it allocate more than its (bounded) config implies. Each failure is a
typed `WeightsError` naming the file and the first offending tensor.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import stat
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Dict, Iterator, Mapping, NamedTuple, Optional, Tuple, Union

import numpy as np

from jetson_unet.model.config import UNetConfig
from jetson_unet.errors import (ConfigError, WeightsDtypeError, WeightsError, WeightsFileError,
                                WeightsFormatError, WeightsHashError, WeightsNameError, WeightsShapeError,
                                WeightsValueError)
from jetson_unet.files import atomic_open
from jetson_unet.model.plan import build_plan, param_shapes

FORMAT = "seed-unet-weights"
FORMAT_VERSION = 1
MANIFEST_KEY = "__manifest__"
PARAM_DTYPES = ("float16", "float32")
MAX_MANIFEST_BYTES = 1 << 20   # the JSON is ~1 KB with the training notes; 1 MiB leaves room
MAX_INFLATION = 100            # deflated weights shrink ~8%: a member may inflate 100x (+ 1 MiB), not 1000x
NOT_REGULAR = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device",
               stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}
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
    """The tensors' digest: name, dtype, shape and bytes of each. The file's hash covers it."""
    h = hashlib.sha256()
    for name in sorted(params):
        a = np.ascontiguousarray(params[name])
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        h.update(f"{name}|{a.dtype.str}|{a.shape}\n".encode())
        h.update(a.tobytes())
    return "sha256:" + h.hexdigest()


def file_hash(manifest: Mapping[str, Any], params: Mapping[str, np.ndarray]) -> str:
    """The manifest's `content_hash`: every manifest field but that one, as canonical JSON, then the
    tensors' `content_hash`."""
    claims = json.dumps({k: v for k, v in manifest.items() if k != "content_hash"}, sort_keys=True,
                        separators=(",", ":"))
    return "sha256:" + hashlib.sha256(f"{claims}\n{content_hash(params)}".encode()).hexdigest()


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
    manifest: Dict[str, Any] = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "config": config.to_dict(), "schedule": config.to_dict()["schedule"],
        "param_dtype": dtype, "n_params": int(sum(a.size for a in arrays.values())),
    }
    if extra:
        manifest["extra"] = extra
    manifest["content_hash"] = file_hash(manifest, arrays)
    blob = np.frombuffer(json.dumps(manifest, sort_keys=True).encode(), dtype=np.uint8)
    if blob.size > MAX_MANIFEST_BYTES:
        raise WeightsError(path, f"manifest of {blob.size:,} bytes exceeds {MAX_MANIFEST_BYTES:,} (extra too large)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "wb") as f:
        np.savez(f, **{MANIFEST_KEY: blob}, **arrays)   # stored, not deflated: 16-bit weights shrink
        # ~8% compressed, and inflating them cost 0.12 s of every cold start on a 2-core x86 host
    return manifest


def load_weights(path: PathLike) -> Weights:
    """Read and validate a weights file; raises a `WeightsError` subclass on the first problem."""
    spath = str(path)
    _check_path(spath)
    try:
        zf = zipfile.ZipFile(spath)
    except zipfile.BadZipFile:
        raise WeightsFileError(spath, _not_a_zip(spath)) from None
    except (OSError, EOFError, ValueError, NotImplementedError) as e:   # NotImplemented: a newer zip version
        raise WeightsFileError(spath, f"cannot read it as an .npz ({getattr(e, 'strerror', None) or e})") from None
    with zf:
        try:
            return _load(spath, zf)
        except WeightsError:
            raise
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError) as e:
            raise WeightsFileError(spath, f"truncated or corrupt .npz ({type(e).__name__}: {e})") from None


def _check_path(path: str) -> None:
    """A regular, non-empty file: a directory, FIFO or device says what it is."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise WeightsFileError(path, "no such file" + (" (a broken symbolic link)" if os.path.islink(path) else "")) from None
    except OSError as e:
        raise WeightsFileError(path, f"cannot access it ({e.strerror})") from None
    kind = NOT_REGULAR.get(stat.S_IFMT(st.st_mode))
    if kind or not stat.S_ISREG(st.st_mode):
        raise WeightsFileError(path, f"is {kind or 'a special file'}, not a regular file")
    if st.st_size == 0:
        raise WeightsFileError(path, "is empty (0 bytes), not an .npz")


def _not_a_zip(path: str) -> str:
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
    except OSError as e:
        return f"cannot read it ({e.strerror})"
    if magic == b"\x93NUMPY":
        return "is a single .npy array, not an .npz archive"
    return "is not an .npz (zip) file, or is truncated"


def _load(path: str, zf: zipfile.ZipFile) -> Weights:
    infos = _members(path, zf)
    manifest = _read_manifest(path, zf, infos.pop(MANIFEST_KEY, None))
    config, dtype = _claims(path, manifest)
    expected = param_shapes(config)
    _check_names(path, expected, infos)
    headers = {}
    for name, shape in expected.items():      # every header before any data
        headers[name] = h = _npy_header(path, zf, infos[name], name)
        _check_layout(path, name, h.shape, h.dtype, shape, dtype)
    arrays = {}
    for name in expected:
        arrays[name] = _read_array(path, zf, infos[name], name, headers[name])
        _check_finite(path, name, arrays[name])
    if file_hash(manifest, arrays) != manifest.get("content_hash"):
        raise WeightsHashError(path, "content hash does not match the manifest (file modified or corrupt)")
    return Weights(path, config, arrays, manifest)


def _members(path: str, zf: zipfile.ZipFile) -> Dict[str, zipfile.ZipInfo]:
    """Array name -> its zip entry, from the central directory alone."""
    infos: Dict[str, zipfile.ZipInfo] = {}
    for info in zf.infolist():
        if not info.filename.endswith(".npy"):
            raise WeightsNameError(path, "unexpected archive member (not a .npy array)", tensor=info.filename)
        name = info.filename[:-4]
        if name in infos:
            raise WeightsFileError(path, "the archive holds this member twice", tensor=name)
        infos[name] = info
    return infos


class _Header(NamedTuple):
    shape: Tuple[int, ...]
    dtype: np.dtype
    fortran: bool
    offset: int            # where the data starts in the member


@contextlib.contextmanager
def _open(path: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo, tensor: Optional[str]) -> Iterator[IO[bytes]]:
    """The member's stream; a zip-level failure inside becomes a WeightsFileError naming `tensor`."""
    try:
        with zf.open(info) as f:
            yield f
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
        raise WeightsFileError(path, f"member is truncated or corrupt ({e})", tensor) from None
    except NotImplementedError as e:   # a newer zip version, patched data, ...
        raise WeightsFileError(path, f"member needs a zip feature this reader lacks ({e})", tensor) from None


def _npy_header(path: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo, tensor: Optional[str]) -> _Header:
    """The member's .npy header, read alone; the sizes the zip directory declares must agree with it."""
    if info.flag_bits & 0x1 or info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise WeightsFileError(path, "member is encrypted or compressed with a method other than deflate", tensor)
    with _open(path, zf, info, tensor) as f:
        try:
            version = np.lib.format.read_magic(f)
            read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
            shape, fortran, dtype = read[version](f)
        except Exception:   # ValueError, KeyError, tokenize.TokenError, ...: its message may suggest allow_pickle
            raise WeightsFileError(path, "member is not a .npy array of version 1 or 2 (bad header)", tensor) from None
        header = _Header(tuple(shape), dtype, bool(fortran), f.tell())
    size = header.offset + math.prod(shape) * dtype.itemsize
    if info.file_size != size:
        raise WeightsFileError(path, f"the zip directory declares {info.file_size:,} bytes, the .npy header "
                                     f"({header.shape}, {dtype}) implies {size:,}", tensor)
    if size > MAX_INFLATION * info.compress_size + (1 << 20):
        raise WeightsFileError(path, f"{info.compress_size:,} compressed bytes inflate to {size:,}: refusing a "
                                     "likely zip bomb", tensor)
    return header


def _read_array(path: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo, tensor: Optional[str],
                header: _Header) -> np.ndarray:
    """The member's data, once `_npy_header` passed: exactly the bytes its header implies."""
    a = np.empty(header.shape[::-1] if header.fortran else header.shape, header.dtype)
    with _open(path, zf, info, tensor) as f:
        f.read(header.offset)
        if f.readinto(a.data.cast("B")) != a.nbytes:
            raise WeightsFileError(path, "member data is truncated", tensor)
    return a.T if header.fortran else a


def _read_manifest(path: str, zf: zipfile.ZipFile, info: Optional[zipfile.ZipInfo]) -> Dict[str, Any]:
    if info is None:
        raise WeightsFormatError(path, f"no {MANIFEST_KEY} entry: not a seed-unet weights file")
    header = _npy_header(path, zf, info, None)
    if header.dtype != np.uint8 or len(header.shape) != 1 or header.shape[0] > MAX_MANIFEST_BYTES:
        raise WeightsFormatError(path, f"the manifest must be at most {MAX_MANIFEST_BYTES:,} bytes (1-D uint8), "
                                       f"got {header.dtype} of shape {header.shape}")
    try:
        manifest = json.loads(_read_array(path, zf, info, None, header).tobytes().decode())
    except (ValueError, RecursionError) as e:
        raise WeightsFormatError(path, f"manifest is not valid JSON: {type(e).__name__}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise WeightsFormatError(path, f"manifest format is not {FORMAT!r}")
    version = manifest.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:   # JSON true == 1 in Python
        raise WeightsFormatError(path, f"format version {manifest.get('format_version')!r} is not "
                                       f"supported (this runtime reads version {FORMAT_VERSION})")
    return manifest


def _claims(path: str, manifest: Dict[str, Any]) -> Tuple[UNetConfig, str]:
    """The manifest's config (bounded by UNetConfig) and dtype, and its derived fields agreeing."""
    try:
        config = UNetConfig.from_dict(manifest.get("config"))  # type: ignore[arg-type]
        n_params = build_plan(config).n_params               # bounded there
    except ConfigError as e:
        raise WeightsFormatError(path, f"manifest config is invalid: {e}") from None
    dtype = manifest.get("param_dtype")
    if dtype not in PARAM_DTYPES:
        raise WeightsFormatError(path, f"manifest param_dtype must be one of {PARAM_DTYPES}, got {dtype!r}")
    schedule = config.to_dict()["schedule"]
    if manifest.get("schedule", schedule) != schedule:
        raise WeightsFormatError(path, "manifest schedule differs from the config's")
    if manifest.get("n_params") != n_params:
        raise WeightsFormatError(path, f"manifest n_params {manifest.get('n_params')!r} differs from the "
                                       f"config's {n_params:,}")
    return config, dtype


def _check_tensors(path: str, config: UNetConfig, arrays: Mapping[str, np.ndarray], dtype: str) -> None:
    """The writer's checks of arrays in memory: the loader's, in the same order."""
    expected = param_shapes(config)
    _check_names(path, expected, arrays)
    for name, shape in expected.items():
        _check_layout(path, name, tuple(arrays[name].shape), arrays[name].dtype, shape, dtype)
        _check_finite(path, name, arrays[name])


def _check_names(path: str, expected: Mapping[str, Any], names: Mapping[str, Any]) -> None:
    for name in expected:
        if name not in names:
            raise WeightsNameError(path, "missing parameter", tensor=name)
    for name in names:
        if name not in expected:
            raise WeightsNameError(path, "unexpected parameter (not in the seed-unet spec for this config)", tensor=name)


def _check_layout(path: str, name: str, shape: Tuple[int, ...], dtype: np.dtype,
                  want_shape: Tuple[int, ...], want_dtype: str) -> None:
    if tuple(shape) != tuple(want_shape):
        raise WeightsShapeError(path, f"shape {tuple(shape)} does not match the config's {tuple(want_shape)}", tensor=name)
    if dtype != np.dtype(want_dtype):
        raise WeightsDtypeError(path, f"dtype {dtype} ({dtype.str}) differs from the manifest's {want_dtype}", tensor=name)


def _check_finite(path: str, name: str, a: np.ndarray) -> None:
    if not np.isfinite(a).all():
        raise WeightsValueError(path, "contains NaN or Inf", tensor=name)

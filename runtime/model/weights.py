"""Weights formats: safetensors (the shipped model's, and what tools/train.py writes) and .npz (still
read and written), each holding every parameter under its dotted spec name plus a JSON manifest:

    {"format": "seed-unet-weights", "format_version": 1, "config": {...}, "schedule": {...},
     "param_dtype": "float16" | "float32", "content_hash": "sha256:...", "n_params": ..., "extra": {...}}

- `.safetensors`: an 8-byte little-endian header length N, N bytes of JSON header (padded with
  spaces to a multiple of 8), then the raw little-endian tensor data. The header maps each name to
  {"dtype": "F16" | "F32", "shape": [...], "data_offsets": [begin, end]} (into the data section, in
  plan order, contiguous), and `__metadata__` holds one key, `seed-unet`: the manifest as a JSON
  string. The `safetensors` library reads it (`safetensors.numpy.load_file`); this module's own
  reader and writer need no package.
- `.npz`: the manifest is the entry `__manifest__` (UTF-8 JSON bytes as a uint8 array).

The content hash (`file_hash`) covers everything the file claims: every manifest field but the
hash itself (format, version, config, dtype, ..., as canonical JSON) and the tensors
(`content_hash`: per parameter in sorted name order, its name, dtype, shape and raw little-endian
bytes). Nothing of the container enters it, so `convert_weights` keeps a file's hash.

Loading dispatches on content (a zip's "PK", else a safetensors header), never unpickles and
checks before it reads: the file is a regular file; the names are exactly the config's
parameters; each tensor's shape is the config's and its dtype the manifest's. For .npz, each
member's .npy header is read alone and the zip's declared size must be what that header implies
(and not inflated from a much smaller compressed size); for .safetensors, the header length is
bounded (`MAX_HEADER_BYTES`) and the data offsets must be in bounds, match each shape and dtype,
and tile the data section exactly (no gap, no overlap, nothing after). Only then is any tensor's
data read, so a hostile file cannot make it allocate more than its (bounded) config implies.
Each failure is a typed `WeightsError` naming the file and the first offending tensor.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import stat
import struct
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
SAFETENSORS_KEY = "seed-unet"   # the safetensors __metadata__ key whose value is the manifest JSON
MAX_HEADER_BYTES = 4 << 20     # a safetensors header: the manifest (<= 1 MiB, escaped) + ~100 bytes a tensor
ST_DTYPES = {"F16": np.dtype("<f2"), "F32": np.dtype("<f4")}   # safetensors dtype codes read and written
ST_CODES = {"float16": "F16", "float32": "F32"}
SUFFIXES = {".safetensors": "safetensors", ".npz": "npz"}      # what save_weights writes, by extension
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
    file_format: Optional[str] = None   # "safetensors" or "npz" when loaded from a file

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


def weights_format(path: PathLike) -> Optional[str]:
    """The format `save_weights` writes to `path` by its extension: "safetensors", "npz" or None."""
    return SUFFIXES.get(Path(path).suffix.lower())


def save_weights(path: PathLike, config: UNetConfig, params: Mapping[str, np.ndarray],
                 dtype: str = "float32", extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Write `params` (cast to `dtype`) and the manifest atomically, as .safetensors or .npz by the
    extension of `path`; returns the manifest.

    The names and shapes are checked against the config first, so nothing invalid is written."""
    fmt = _writable_format(path)
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
    _write(path, fmt, manifest, {name: arrays[name] for name in param_shapes(config)})
    return manifest


def convert_weights(src: PathLike, dst: PathLike) -> Weights:
    """Load and validate `src` (either format), write it to `dst` in the format of dst's extension,
    atomically. The manifest is written as it is, content hash included: the hash covers no part
    of the container, so it stays valid. Returns the loaded weights."""
    fmt = _writable_format(dst)
    w = load_weights(src)
    _write(dst, fmt, w.manifest, w.params)
    return w


def _writable_format(path: PathLike) -> str:
    fmt = weights_format(path)
    if fmt is None:
        raise WeightsError(path, f"a weights file must end in {' or '.join(SUFFIXES)} (the format it is written in)")
    return fmt


def _write(path: PathLike, fmt: str, manifest: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
    """Write a validated manifest and its arrays (plan order) in `fmt`, atomically."""
    text = json.dumps(manifest, sort_keys=True)
    if len(text.encode()) > MAX_MANIFEST_BYTES:
        raise WeightsError(path, f"manifest of {len(text.encode()):,} bytes exceeds {MAX_MANIFEST_BYTES:,} "
                                 "(extra too large)")
    header = _st_header_bytes(path, text, arrays) if fmt == "safetensors" else b""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "wb") as f:
        if fmt == "safetensors":
            f.write(header)
            for a in arrays.values():
                f.write(np.ascontiguousarray(a, a.dtype.newbyteorder("<")).reshape(-1).view(np.uint8).data)
        else:
            blob = np.frombuffer(text.encode(), dtype=np.uint8)
            np.savez(f, **{MANIFEST_KEY: blob}, **arrays)   # stored, not deflated: 16-bit weights shrink
            # ~8% compressed, and inflating them cost 0.12 s of every cold start on a 2-core x86 host


def _st_header_bytes(path: PathLike, manifest_text: str, arrays: Mapping[str, np.ndarray]) -> bytes:
    """The safetensors length prefix and header: tensors contiguous in the given order, the header
    padded with spaces to a multiple of 8 (so the data section is 8-byte aligned)."""
    header: Dict[str, Any] = {"__metadata__": {SAFETENSORS_KEY: manifest_text}}
    pos = 0
    for name, a in arrays.items():
        header[name] = {"dtype": ST_CODES[a.dtype.name], "shape": list(a.shape), "data_offsets": [pos, pos + a.nbytes]}
        pos += a.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    if len(blob) > MAX_HEADER_BYTES:
        raise WeightsError(path, f"safetensors header of {len(blob):,} bytes exceeds {MAX_HEADER_BYTES:,} "
                                 "(extra too large)")
    return struct.pack("<Q", len(blob)) + blob


def load_weights(path: PathLike) -> Weights:
    """Read and validate a weights file (.safetensors or .npz, told apart by content); raises a
    `WeightsError` subclass on the first problem."""
    spath = str(path)
    _check_path(spath)
    if _sniff(spath) == "safetensors":
        return _load_safetensors(spath)
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


def _sniff(path: str) -> str:
    """"npz" for a zip ("PK"), "safetensors" for a safetensors header (8 bytes of length, then "{")
    or, failing both, a name ending in .safetensors (its reader then says what is wrong)."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError as e:
        raise WeightsFileError(path, f"cannot read it ({e.strerror})") from None
    if head[:2] == b"PK":
        return "npz"
    if head[8:9] == b"{" or path.lower().endswith(".safetensors"):
        return "safetensors"
    return "npz"


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
        raise WeightsFileError(path, "is empty (0 bytes), not a weights file")


def _not_a_zip(path: str) -> str:
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
    except OSError as e:
        return f"cannot read it ({e.strerror})"
    if magic == b"\x93NUMPY":
        return "is a single .npy array, not an .npz archive"
    return "is not an .npz (zip) file or a .safetensors file, or is truncated"


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
    return Weights(path, config, arrays, manifest, "npz")


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
    return _parse_manifest(path, _read_array(path, zf, info, None, header).tobytes())


def _parse_manifest(path: str, data: bytes) -> Dict[str, Any]:
    """The manifest's JSON (at most MAX_MANIFEST_BYTES, checked by the caller): its format and version."""
    try:
        manifest = json.loads(data.decode())
    except (ValueError, RecursionError) as e:   # UnicodeDecodeError is a ValueError
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


# ---- safetensors ------------------------------------------------------------------------------

def _load_safetensors(path: str) -> Weights:
    try:
        with open(path, "rb") as f:
            return _load_st(path, f, os.fstat(f.fileno()).st_size)
    except OSError as e:
        raise WeightsFileError(path, f"cannot read it ({e.strerror or e})") from None


def _load_st(path: str, f: IO[bytes], size: int) -> Weights:
    header, start = _st_header(path, f, size)
    manifest = _st_manifest(path, header.pop("__metadata__", None))
    config, dtype = _claims(path, manifest)
    expected = param_shapes(config)
    _check_names(path, expected, header)
    spans = {name: _st_entry(path, name, header[name], shape, dtype, size - start)
             for name, shape in expected.items()}                 # every entry before any data
    _st_tiling(path, spans, size - start)
    arrays = {}
    for name, shape in expected.items():
        arrays[name] = _read_tensor(path, f, name, start + spans[name][0], shape, ST_DTYPES[ST_CODES[dtype]])
        _check_finite(path, name, arrays[name])
    if file_hash(manifest, arrays) != manifest.get("content_hash"):
        raise WeightsHashError(path, "content hash does not match the manifest (file modified or corrupt)")
    return Weights(path, config, arrays, manifest, "safetensors")


def _unique_keys(pairs: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


class _Duplicate(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")   # NaN, Infinity: Python's json reads them, JSON has none


def _st_header(path: str, f: IO[bytes], size: int) -> Tuple[Dict[str, Any], int]:
    """The header (a JSON object, no key twice) and where the data section starts; the length is
    checked against MAX_HEADER_BYTES and the file's size before anything is read."""
    prefix = f.read(8)
    if len(prefix) < 8:
        raise WeightsFileError(path, f"is {size} bytes: too short for a .safetensors file")
    n = struct.unpack("<Q", prefix)[0]
    if n > MAX_HEADER_BYTES:
        raise WeightsFileError(path, f"safetensors header length {n:,} exceeds {MAX_HEADER_BYTES:,} bytes "
                                     "(not a .safetensors file, or a hostile one)")
    if 8 + n > size:
        raise WeightsFileError(path, f"truncated: the safetensors header declares {n:,} bytes, the file "
                                     f"holds {size - 8:,} after the length")
    raw = f.read(n)
    if len(raw) != n:
        raise WeightsFileError(path, "truncated: the safetensors header is cut short")
    if raw[:1] != b"{":
        raise WeightsFileError(path, "is not a .safetensors file (its header is not a JSON object)")
    try:
        header = json.loads(raw.decode(), object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except _Duplicate as e:
        raise WeightsFileError(path, "the safetensors header holds this key twice", tensor=str(e)) from None
    except (ValueError, RecursionError) as e:   # UnicodeDecodeError is a ValueError
        raise WeightsFileError(path, f"safetensors header is not valid JSON ({type(e).__name__})") from None
    if not isinstance(header, dict):
        raise WeightsFileError(path, "is not a .safetensors file (its header is not a JSON object)")
    return header, 8 + n


def _st_manifest(path: str, meta: Any) -> Dict[str, Any]:
    """The manifest from `__metadata__`, which holds exactly one key, SAFETENSORS_KEY: everything a
    file claims is covered by its hash."""
    if meta is None:
        raise WeightsFormatError(path, "no __metadata__ in the safetensors header: not a seed-unet weights file")
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise WeightsFormatError(path, "safetensors __metadata__ must map strings to strings")
    if SAFETENSORS_KEY not in meta:
        raise WeightsFormatError(path, f"no {SAFETENSORS_KEY!r} key in the safetensors __metadata__: not a "
                                       "seed-unet weights file")
    other = sorted(k for k in meta if k != SAFETENSORS_KEY)
    if other:
        raise WeightsFormatError(path, f"unexpected safetensors __metadata__ key {other[0]!r} (only "
                                       f"{SAFETENSORS_KEY!r}, the manifest, is read)")
    data = meta[SAFETENSORS_KEY].encode("utf-8", "replace")
    if len(data) > MAX_MANIFEST_BYTES:
        raise WeightsFormatError(path, f"the manifest must be at most {MAX_MANIFEST_BYTES:,} bytes, got {len(data):,}")
    return _parse_manifest(path, data)


def _is_int(v: Any) -> bool:
    return type(v) is int and v >= 0


def _st_entry(path: str, name: str, entry: Any, want_shape: Tuple[int, ...], want_dtype: str,
              data_size: int) -> Tuple[int, int]:
    """One header entry, checked against the config and the manifest: its [begin, end) in the data."""
    if not isinstance(entry, dict) or sorted(entry) != ["data_offsets", "dtype", "shape"]:
        raise WeightsFileError(path, "header entry must be an object of dtype, shape and data_offsets", tensor=name)
    shape, code, offsets = entry["shape"], entry["dtype"], entry["data_offsets"]
    if not isinstance(shape, list) or not all(_is_int(d) for d in shape):
        raise WeightsFileError(path, f"header shape {_short(shape)} is not a list of non-negative integers",
                               tensor=name)
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)
            and offsets[0] <= offsets[1]):
        raise WeightsFileError(path, f"data_offsets {_short(offsets)} are not [begin, end] with 0 <= begin <= end",
                               tensor=name)
    if tuple(shape) != tuple(want_shape):
        raise WeightsShapeError(path, f"shape {_short(tuple(shape))} does not match the config's {tuple(want_shape)}",
                                tensor=name)
    dtype = ST_DTYPES.get(code) if isinstance(code, str) else None
    if dtype is None:
        raise WeightsDtypeError(path, f"dtype {_short(code)} is not one this runtime reads ({', '.join(ST_DTYPES)})",
                                tensor=name)
    _check_layout(path, name, tuple(shape), dtype, want_shape, want_dtype)
    begin, end = offsets
    if end > data_size:
        raise WeightsFileError(path, f"data_offsets [{begin:,}, {end:,}] run past the data section's {data_size:,} "
                                     "bytes (truncated or hostile)", tensor=name)
    need = math.prod(want_shape) * dtype.itemsize
    if end - begin != need:
        raise WeightsFileError(path, f"data_offsets [{begin:,}, {end:,}] span {end - begin:,} bytes, its shape and "
                                     f"dtype imply {need:,}", tensor=name)
    return begin, end


def _st_tiling(path: str, spans: Mapping[str, Tuple[int, int]], data_size: int) -> None:
    """The tensors' data tiles the data section: no gap, no overlap, nothing after the last."""
    pos, prev = 0, None
    for name, (begin, end) in sorted(spans.items(), key=lambda kv: (kv[1], kv[0])):
        if begin < pos:
            raise WeightsFileError(path, f"data overlaps tensor {prev!r}'s", tensor=name)
        if begin > pos:
            raise WeightsFileError(path, f"{begin - pos:,} bytes of the data section before this tensor's data "
                                         "belong to no tensor", tensor=name)
        pos, prev = end, name
    if pos != data_size:
        raise WeightsFileError(path, f"{data_size - pos:,} bytes after the last tensor's data belong to no tensor")


def _read_tensor(path: str, f: IO[bytes], name: str, offset: int, shape: Tuple[int, ...],
                 dtype: np.dtype) -> np.ndarray:
    """A tensor's data, once every header check passed: exactly the bytes its shape implies."""
    a = np.empty(shape, dtype)
    f.seek(offset)
    if a.nbytes and f.readinto(a.reshape(-1).view(np.uint8).data) != a.nbytes:
        raise WeightsFileError(path, "data is truncated", tensor=name)
    return a


def _short(value: Any) -> str:
    """A header value as an error shows it: its repr, at most 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

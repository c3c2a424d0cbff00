"""The cubin cache: compiled kernel modules on disk, one `.cubin` plus a JSON sidecar per entry.

Layout: `$JETSON_UNET_CACHE/cubins/v1/` (default `~/.cache/jetson-unet/cubins/v1/`). An entry is
`<name>-sm<arch>-<key>.cubin` and `<same>.json`, where key = sha256 over (sha256 of the module source
text, the code-generation options, the arch, the toolchain's version string). The sidecar repeats
those fields and adds the sha256 of the cubin bytes.

What is compared, and why:
- options: only the ones that change the code. The target (`--gpu-architecture`, `-arch`) is keyed
  separately as the arch, and include paths (`-I`) are dropped: every kernel source is inlined into
  the module text (kernels.module_source), so the folders differ between machines (a checkout, a
  wheel on a Jetson) while the compiled code does not.
- toolchain: part of the key, so cubins from NVRTC and nvcc, or two CUDA versions, live side by
  side. A lookup prefers this machine's toolchain but accepts ANY toolchain's cubin for the same
  source, options and arch: a cubin is SASS for one arch, loaded by the driver without a compiler,
  which is what lets x86 cross-compile for sm_87 and copy the cache to the board. A driver too old
  for the toolchain that built a cubin refuses it at load time: the caller then discards it and
  compiles with its own toolchain (kernels.load_module).
- before anything is loaded: the file name must equal the key of the sidecar's fields, the bytes
  must hash to the sidecar's sha256, start with the ELF magic, be a CUDA ELF (e_machine 190) whose
  e_flags name the requested arch, and hold every kernel symbol asked for. An entry that fails any
  check is deleted (corrupt, foreign-arch or mismatched: it would never load correctly) and rebuilt.
Writes are atomic (a temporary file, then a rename; the cubin before its sidecar), so a concurrent
process sees a whole entry or none; a torn pair fails the sha256 check and is rebuilt. Two processes
that miss the same entry compile it once: `lock` holds a file lock per entry (build.locks) around the
loader's check-compile-store, and the second finds what the first stored.

A read-only cache (the cubins shipped as package data, jetson_unet.cubins) is validated the same way,
but an entry that fails is only skipped, never deleted.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ContextManager, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from jetson_unet.build.locks import exclusive
from jetson_unet.files import atomic_open
from jetson_unet.paths import cache_root

CACHE_VERSION = "v1"
FORMAT = "jetson-unet-cubin/1"
ELF_MAGIC = b"\x7fELF"
EM_CUDA = 190
log = logging.getLogger(__name__)


def cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """<the cache root>/cubins/v1 (jetson_unet.paths.cache_root: $JETSON_UNET_CACHE, else
    $XDG_CACHE_HOME or ~/.cache, then jetson-unet)."""
    return cache_root(environ) / "cubins" / CACHE_VERSION


def key_options(options: Iterable[str]) -> Tuple[str, ...]:
    """The options that change the generated code: without the target and the include paths."""
    out: List[str] = []
    skip_next = False
    for opt in options:
        if skip_next:
            skip_next = False
            continue
        if opt in ("-arch", "--gpu-architecture", "-I", "--include-path"):
            skip_next = True
        elif not opt.startswith(("-arch=", "--gpu-architecture=", "-I", "--include-path=")):
            out.append(opt)
    return tuple(out)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cache_key(source_sha: str, options: Sequence[str], arch: int, toolchain: str) -> str:
    h = hashlib.sha256(FORMAT.encode())
    for part in (source_sha, "\x1f".join(key_options(options)), str(int(arch)), toolchain):
        h.update(b"\0" + part.encode())
    return h.hexdigest()


# ---- ELF: the cubin's own arch ----------------------------------------------------------------------
def elf_arch(data: bytes) -> Optional[int]:
    """The SM number a CUDA ELF targets (87 for sm_87), None when `data` is not a CUDA ELF.
    e_flags hold it in bits 0-7 under ABI version 7 (CUDA 11 and 12: NVRTC 11.8 and 12.9 write it for
    sm_72 and sm_87, e.g. 0x480548) and in bits 8-15 under ABI version 8 (CUDA 13: 0x6005704 for
    sm_87; docs/jetson.md): LLVM's BinaryFormat/ELF.h, EF_CUDA_SM / EF_CUDA_SM_MASK, EF_CUDA_SM_OFFSET."""
    if len(data) < 64 or data[:4] != ELF_MAGIC or data[4] != 2 or data[5] != 1:   # 64-bit little-endian
        return None
    machine, = struct.unpack_from("<H", data, 18)
    if machine != EM_CUDA:
        return None
    flags, = struct.unpack_from("<I", data, 48)
    abi_version = data[8]
    return (flags & 0xFF) if abi_version <= 7 else (flags >> 8) & 0xFF


def check_cubin(data: bytes, arch: int, symbols: Sequence[str] = ()) -> Optional[str]:
    """None when `data` is a cubin for sm_<arch> holding every symbol; else what is wrong."""
    if data[:4] != ELF_MAGIC:
        return "not an ELF file"
    got = elf_arch(data)
    if got is None:
        return "not a CUDA ELF (64-bit, e_machine 190)"
    if got != int(arch):
        return f"built for sm_{got}, not sm_{arch}"
    missing = [s for s in symbols if (b".text." + s.encode() + b"\0") not in data]
    if missing:
        return f"no kernel {missing[0]!r} in it"
    return None


def toolchain_version(toolchain: str) -> Tuple[int, ...]:
    """(major, minor) of a toolchain string ("nvrtc 12.2", "nvcc: release 13.0, V13.0.88"); () if none."""
    m = re.search(r"(\d+)\.(\d+)", toolchain)
    return (int(m.group(1)), int(m.group(2))) if m else ()


# ---- the cache ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    cubin: Path
    meta: Dict[str, object]

    @property
    def sidecar(self) -> Path:
        return self.cubin.with_suffix(".json")

    @property
    def toolchain(self) -> str:
        return str(self.meta.get("toolchain", ""))


class CubinCache:
    def __init__(self, root: Optional[Path] = None, read_only: bool = False) -> None:
        self.root = Path(root) if root is not None else cache_dir()
        self.read_only = read_only

    def path_for(self, name: str, source_sha: str, options: Sequence[str], arch: int, toolchain: str) -> Path:
        return self.root / f"{name}-sm{int(arch)}-{cache_key(source_sha, options, arch, toolchain)}.cubin"

    def find(self, source: str, options: Sequence[str], arch: int, toolchain: Optional[str],
             symbols: Sequence[str] = (), name: str = "seed-unet") -> Iterator[Entry]:
        """Valid entries for this module and arch, lazily: this toolchain's first (none: no
        preference), then any other toolchain's, the newest toolchain version first (its code is
        the faster; a driver too old for it refuses it), then the newest entry. An invalid entry met
        on the way is deleted."""
        src_sha, opts = sha256(source.encode()), list(key_options(options))
        exact = self.path_for(name, src_sha, options, arch, toolchain) if toolchain is not None else None
        if exact is not None and (exact.exists() or exact.with_suffix(".json").exists()):
            e = self._validated(exact, arch, symbols)
            if e is not None:
                yield e
        others = []
        for side in sorted(self.root.glob(f"*-sm{int(arch)}-*.json")) if self.root.is_dir() else []:
            meta = _read_json(side)
            if side.with_suffix(".cubin") == exact or (meta is not None and (
                    meta.get("source_sha256") != src_sha or meta.get("options") != opts or meta.get("arch") != int(arch))):
                continue   # ours was judged above; another module's entry is not ours to judge
            m = meta or {}
            others.append((toolchain_version(str(m.get("toolchain", ""))), str(m.get("created", "")),
                           side.with_suffix(".cubin")))
        for _, _, cub in sorted(others, reverse=True):
            e = self._validated(cub, arch, symbols)
            if e is not None:
                yield e

    def _validated(self, cubin: Path, arch: int, symbols: Sequence[str]) -> Optional[Entry]:
        meta = _read_json(cubin.with_suffix(".json"))
        why = _check_entry(cubin, meta, arch, symbols)
        if why is None:
            return Entry(cubin, meta or {})
        self.discard(cubin, why)
        return None

    def discard(self, cubin: Path, why: str) -> None:
        """Delete an entry that must not be loaded (and say so once); in a read-only cache, only say so."""
        if self.read_only:
            log.info("skipped the shipped kernels %s: %s", cubin.name, why)
            return
        for p in (cubin, cubin.with_suffix(".json")):
            try:
                p.unlink()
            except FileNotFoundError:
                pass
            except OSError:
                pass   # an unwritable folder: the entry stays, but is still never loaded
        log.warning("discarded cached kernels %s: %s; rebuilding", cubin.name, why)

    def lock(self, name: str, source: str, options: Sequence[str], arch: int, toolchain: str) -> ContextManager[None]:
        """The lock of one entry (locks/<entry>.lock in the cache folder): held around check, compile,
        store, so that of two processes missing the same entry one compiles and the other then finds it."""
        stem = self.path_for(name, sha256(source.encode()), options, arch, toolchain).stem
        return exclusive(self.root / "locks" / f"{stem}.lock", stem[:stem.rindex("-") + 13])

    def store(self, cubin: bytes, source: str, options: Sequence[str], arch: int, toolchain: str,
              symbols: Sequence[str] = (), name: str = "seed-unet") -> Path:
        """Write an entry atomically; raises OSError when the cache folder is not writable."""
        src_sha = sha256(source.encode())
        path = self.path_for(name, src_sha, options, arch, toolchain)
        meta = {"format": FORMAT, "name": name, "arch": int(arch), "options": list(key_options(options)),
                "toolchain": toolchain, "source_sha256": src_sha, "cubin_sha256": sha256(cubin),
                "cubin_bytes": len(cubin), "symbols": sorted(symbols),
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.root.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, cubin)
        _atomic_write(path.with_suffix(".json"), (json.dumps(meta, indent=1) + "\n").encode())
        return path


def _check_entry(cubin: Path, meta: Optional[Dict[str, object]], arch: int, symbols: Sequence[str]) -> Optional[str]:
    if meta is None:
        return "sidecar missing or unreadable"
    try:
        want = cache_key(str(meta["source_sha256"]), list(meta["options"]), int(meta["arch"]),  # type: ignore
                         str(meta["toolchain"]))
    except (KeyError, TypeError, ValueError):
        return "sidecar incomplete"
    if meta.get("format") != FORMAT or not cubin.name.endswith(f"-{want}.cubin"):
        return "sidecar does not match the file name"
    if meta["arch"] != int(arch):
        return f"sidecar says sm_{meta['arch']}, not sm_{arch}"
    try:
        data = cubin.read_bytes()
    except OSError as e:
        return f"cubin unreadable ({e.strerror or e})"
    if sha256(data) != meta.get("cubin_sha256"):
        return "sha256 of the cubin differs from its sidecar (truncated or changed)"
    return check_cubin(data, arch, symbols)


def _read_json(path: Path) -> Optional[Dict[str, object]]:
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return meta if isinstance(meta, dict) else None


def _atomic_write(path: Path, data: bytes) -> None:
    with atomic_open(path, "wb") as f:   # world-readable: a cache may be copied to another machine
        f.write(data)

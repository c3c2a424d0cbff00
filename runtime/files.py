"""Files written whole or not at all, and outputs proven writable before the work that makes them.

- `check_writable`: before any long work, a temporary file is created and removed where an output
  will go; what stops it is one UsageError naming the flag, the path and why.
- `output_set`: a set of outputs that lands all or nothing (every file written to a temporary in
  its folder, all renamed when all were written; on any failure every temporary is removed and an
  OSError becomes one OutputError line).
- `atomic_open`: one file the same way, its OSError passed on as is (a cache treats it as a miss);
  `writing(path)` around it turns that OSError into the OutputError line.
"""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator, List, Optional, Tuple, Union

from jetson_unet.errors import RuntimeErrorBase, UsageError

PathLike = Union[str, "os.PathLike[str]"]
PSEUDO_FS = ("proc", "sys")   # kernel file systems: a create fails oddly (ENOENT in /proc) or lands in a cgroup


class OutputError(RuntimeErrorBase):
    """An output could not be written (a full disk, an I/O error) after the work: nothing of its set is left."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _why(e: OSError) -> str:
    text = e.strerror or str(e)
    return text[:1].lower() + text[1:]


def check_writable(path: PathLike, flag: str, folder: bool = False, create: bool = False) -> None:
    """Prove that `path` (a file, or with `folder` a folder) can be written: a temporary file is
    created and removed in the folder it goes to. With `create` a missing folder is fine where it
    could be made: the proof is made in its nearest existing parent. Raises UsageError
    "`flag` `path`: why" (not a folder, permission denied, read-only file system, /proc, ...)."""
    path = Path(path)
    why = _unwritable(path, folder, create)
    if why is not None:
        raise UsageError(f"{flag} {path}: {why}")


def _unwritable(path: Path, folder: bool, create: bool) -> Optional[str]:
    where = path if folder else path.parent
    if not folder and path.is_dir():
        return "is a folder"
    while create and not where.exists() and where != where.parent:
        where = where.parent
    if not where.exists():
        return f"folder {where} does not exist"
    if not where.is_dir():
        return "not a folder" if where == path else f"{where} is not a folder"
    top = where.resolve().parts[1:2]
    if top and top[0] in PSEUDO_FS:
        return f"/{top[0]} is a kernel file system, not a place for files"
    try:
        fd, tmp = tempfile.mkstemp(prefix=".jetson-unet-", suffix=".tmp", dir=str(where))
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        return _why(e)
    return None


class Staged:
    """Temporary files beside their targets, renamed over them by commit() or removed by discard()."""

    def __init__(self) -> None:
        self.pending: List[Tuple[str, Path]] = []
        self.current: Optional[Path] = None   # the target being written (named when it fails)

    def path(self, target: PathLike) -> Path:
        """A fresh empty temporary for `target`, to write by any means (it is renamed, not opened, later)."""
        target = Path(target)
        self.current = target
        fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=str(target.parent))
        os.close(fd)
        self.pending.append((tmp, target))
        return Path(tmp)

    @contextmanager
    def open(self, target: PathLike, mode: str = "wb", newline: Optional[str] = None) -> Iterator[IO[Any]]:
        tmp = self.path(target)
        with open(tmp, mode, **({} if "b" in mode else {"newline": newline})) as f:
            yield f

    def commit(self) -> None:
        """Every temporary renamed over its target (permissions from the umask; mkstemp's 0600 is for
        secrets). A rename that fails takes the targets already renamed with it."""
        mode, landed = 0o666 & ~_umask(), []
        try:
            while self.pending:
                tmp, target = self.pending[0]
                self.current = target
                os.chmod(tmp, mode)
                os.replace(tmp, target)
                landed.append(self.pending.pop(0)[1])
        except BaseException:
            _remove(landed)
            raise

    def discard(self) -> None:
        _remove([tmp for tmp, _ in self.pending])
        self.pending = []


def _remove(paths: List[Any]) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except OSError:
            pass


def _failed(path: Any, e: OSError) -> OutputError:
    return OutputError(f"cannot write {path}: {_why(e)}; nothing written")


@contextmanager
def writing(path: PathLike) -> Iterator[None]:
    """Around a whole-or-nothing write of `path` (atomic_open, save_weights): an OSError becomes one
    OutputError line naming it."""
    try:
        yield
    except OSError as e:
        raise _failed(path, e) from None


@contextmanager
def _staged(wrap: bool) -> Iterator[Staged]:
    staged = Staged()
    try:
        yield staged
        staged.commit()
    except BaseException as e:
        staged.discard()
        if wrap and isinstance(e, OSError):
            raise _failed(staged.current, e) from None
        raise


def output_set() -> Any:
    """`with output_set() as out:` then `out.open(path)` / `out.path(path)` per file: all of them land
    when the block ends without an error, none when it raises (an OSError becomes an OutputError)."""
    return _staged(wrap=True)


@contextmanager
def atomic_open(path: PathLike, mode: str = "wb", newline: Optional[str] = None) -> Iterator[IO[Any]]:
    """A temporary file in the target's folder, renamed over `path` when the block ends without an
    error and removed when it raises (Ctrl-C included): readers see the old file or the whole new
    one, never a half-written one. Permissions follow the umask."""
    with _staged(wrap=False) as staged:
        with staged.open(path, mode, newline) as f:
            yield f

"""Files written whole or not at all: the one atomic-write helper of the runtime."""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator, Optional, Union


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_open(path: Union[str, "os.PathLike[str]"], mode: str = "wb",
                newline: Optional[str] = None) -> Iterator[IO[Any]]:
    """A temporary file in the target's folder, renamed over `path` when the block ends without an
    error and removed when it raises (Ctrl-C included): readers see the old file or the whole new
    one, never a half-written one. Permissions follow the umask (mkstemp's 0600 is for secrets)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"newline": newline})) as f:
            yield f
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise

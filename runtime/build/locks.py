"""One process at a time: an exclusive advisory lock on a file (fcntl.flock), for the cubin cache's
check-compile-store (build.cache.CubinCache.lock).

The kernel releases a flock when its holder exits or is killed, so a crashed compile never blocks
the next process. A waiter says so at info level after NOTE_AFTER_S and, past GIVE_UP_AFTER_S, warns
and goes on without the lock: the cache's writes are atomic, so that costs a second compile, never a
torn entry. Where there is no fcntl (Windows) or the lock file cannot be made (a read-only cache
folder), nothing is locked.
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator, Optional

try:
    import fcntl
except ImportError:   # not POSIX
    fcntl = None   # type: ignore[assignment]

NOTE_AFTER_S = 5.0
GIVE_UP_AFTER_S = 900.0
POLL_S = 0.05
log = logging.getLogger(__name__)


@contextmanager
def exclusive(path: Path, what: str, note_after: float = NOTE_AFTER_S,
              give_up_after: float = GIVE_UP_AFTER_S) -> Iterator[None]:
    """Hold the lock on `path` (created with its folder as needed) for the block; `what` names the
    work in the waiting lines."""
    f = _open(path)
    held = f is not None and _acquire(f, path, what, note_after, give_up_after)
    try:
        yield
    finally:
        if f is not None:
            if held:
                fcntl.flock(f, fcntl.LOCK_UN)
            f.close()


def _open(path: Path) -> Optional[IO[bytes]]:
    if fcntl is None:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return open(path, "ab")
    except OSError:
        return None


def _acquire(f: IO[bytes], path: Path, what: str, note_after: float, give_up_after: float) -> bool:
    """True once the lock is held; False after give_up_after seconds of another process holding it."""
    t0, noted = time.monotonic(), False
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        except OSError:   # a file system without flock
            return False
        waited = time.monotonic() - t0
        if waited >= give_up_after:
            log.warning("another process has held %s for %.0f s; compiling %s without waiting for it", path,
                        waited, what)
            return False
        if not noted and waited >= note_after:
            log.info("waiting for another process compiling %s (lock %s)", what, path)
            noted = True
        time.sleep(POLL_S)

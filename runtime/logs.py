"""The package's notices go to the standard `logging` module, under the logger `jetson_unet` (each
module logs to its child, `logging.getLogger(__name__)`). An application sees warnings on stderr
by default (Python's last-resort handler) and configures logging as usual to see more.

The command-line tools call `configure(verbosity)` once: one line per record on stderr, written
through tqdm so that a progress bar is not torn; `captured()` collects the records of a block (the
benchmarks keep them in their report).
"""
from __future__ import annotations

import contextlib
import logging
import sys
from typing import Iterator, List

NAME = "jetson_unet"
LEVELS = {-1: logging.WARNING, 0: logging.INFO, 1: logging.DEBUG}   # --quiet, default, -v


class _Lines(logging.Handler):
    """`note: ...` / `warning: ...` on stderr, one line per record, through tqdm.write."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            prefix = "warning" if record.levelno >= logging.WARNING else "note"
            msg = f"{prefix}: {record.getMessage()}"
            try:
                from tqdm import tqdm
                tqdm.write(msg, file=sys.stderr)
            except ImportError:
                print(msg, file=sys.stderr, flush=True)
        except Exception:
            self.handleError(record)


def configure(verbosity: int = 0) -> logging.Logger:
    """The CLI's set-up: the package logger at --quiet (-1), default (0) or -v (1) level with one
    line handler (a second call replaces the first's)."""
    logger = logging.getLogger(NAME)
    for h in [h for h in logger.handlers if isinstance(h, _Lines)]:
        logger.removeHandler(h)
    level = LEVELS[max(-1, min(1, verbosity))]
    handler = _Lines(level)
    logger.addHandler(handler)
    logger.setLevel(level)
    return logger


class _Collect(logging.Handler):
    def __init__(self, into: List[str]) -> None:
        super().__init__(logging.DEBUG)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


@contextlib.contextmanager
def captured(name: str = NAME, level: int = logging.INFO) -> Iterator[List[str]]:
    """The messages logged under `name` at `level` or above while the block runs."""
    logger, out = logging.getLogger(name), []
    handler, old = _Collect(out), logger.level
    handler.setLevel(level)
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > level:
        logger.setLevel(level)
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


@contextlib.contextmanager
def muted(name: str, below: int = logging.WARNING) -> Iterator[None]:
    """The records of logger `name` under level `below` dropped while the block runs: a tool that
    builds many executors of one kind (jetson-tune's rounds) says what their notice would once."""
    logger = logging.getLogger(name)
    old = logger.level
    logger.setLevel(max(below, logger.getEffectiveLevel()))
    try:
        yield
    finally:
        logger.setLevel(old)

"""One compile at a time (build.locks, the cache's lock per entry): two processes that miss the same
module compile it once and load the same entry; a holder killed mid-compile does not block the next
process; a lock held too long is waited for with a notice, then given up with a warning. Real
processes (tests/helpers/lock_child.py) over a fake compiler; no GPU."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.lock_child import ARCH, NAME, OPTIONS, SOURCE, TOOLCHAIN, symbols_of

from jetson_unet import logs
from jetson_unet.build import locks
from jetson_unet.build.cache import CubinCache

pytestmark = pytest.mark.skipif(locks.fcntl is None, reason="no fcntl: nothing is locked")
ROOT = Path(__file__).resolve().parents[2]


def child(*args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "tests.helpers.lock_child", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_processes_compile_a_module_once(tmp_path):
    cache, counter, go = tmp_path / "cubins", tmp_path / "builds", tmp_path / "go"
    procs = [child("load", str(cache), str(counter), str(go)) for _ in range(2)]
    assert [p.stdout.readline().strip() for p in procs] == ["ready", "ready"]
    go.touch()                                          # both start now
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert counter.read_text().splitlines() == ["build"]
    loaded = {out.strip() for out, _ in outs}
    entries = list(CubinCache(cache).find(SOURCE, OPTIONS, ARCH, TOOLCHAIN, symbols_of(SOURCE), NAME))
    assert len(entries) == 1 and loaded == {str(entries[0].cubin)}


def test_a_killed_holder_does_not_block_and_a_long_hold_is_given_up(tmp_path):
    cache = CubinCache(tmp_path / "cubins")
    holder = child("hold", str(cache.root))
    try:
        assert holder.stdout.readline().strip() == "held"
        with logs.captured(level=logging.INFO) as notes:
            t0 = time.monotonic()
            with locks.exclusive(next((cache.root / "locks").glob("*.lock")), "the test module", note_after=0.2,
                                 give_up_after=0.6):
                waited = time.monotonic() - t0
        assert 0.6 <= waited < 5, waited
        assert any(n.startswith("waiting for another process compiling the test module") for n in notes), notes
        assert any("without waiting for it" in n for n in notes), notes
    finally:
        holder.kill()                                   # SIGKILL while holding: the kernel drops its lock
        holder.wait(timeout=10)
    t0 = time.monotonic()
    with cache.lock(NAME, SOURCE, OPTIONS, ARCH, TOOLCHAIN):
        assert time.monotonic() - t0 < locks.NOTE_AFTER_S


def test_no_lock_where_the_folder_cannot_hold_one(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with locks.exclusive(blocker / "locks" / "x.lock", "x"):   # its folder cannot be made: runs unlocked
        pass
    monkeypatch.setattr(locks, "fcntl", None)                  # a platform without fcntl
    with locks.exclusive(tmp_path / "y.lock", "y"):
        pass
    assert not (tmp_path / "y.lock").exists()

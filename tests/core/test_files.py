"""jetson_unet.files.atomic_open: whole file or nothing, permissions from the umask."""
from __future__ import annotations

import os
import stat

import pytest

from jetson_unet.files import atomic_open


def test_replaces_whole_and_follows_umask(tmp_path):
    path = tmp_path / "out.bin"
    path.write_bytes(b"old")
    old = os.umask(0o022)
    try:
        with atomic_open(path, "wb") as f:
            f.write(b"new contents")
    finally:
        os.umask(old)
    assert path.read_bytes() == b"new contents"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_failure_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_open(path, "w") as f:
            f.write("half")
            raise KeyboardInterrupt
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]

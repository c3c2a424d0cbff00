"""jetson_unet.files: outputs proven writable before the work (check_writable), a set of files that
lands all or nothing (output_set), one file whole or nothing (atomic_open); permissions from the umask."""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from jetson_unet import files
from jetson_unet.errors import UsageError
from jetson_unet.files import OutputError, atomic_open, check_writable, output_set

ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def files_under(folder: Path) -> list:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


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


# ---- the helper: a temporary file proves a location writable ----------------------------------------

def test_check_writable_leaves_nothing_and_accepts_a_folder_to_be_made(tmp_path):
    check_writable(tmp_path / "x.png", "--out")
    check_writable(tmp_path, "--save-each", folder=True)
    check_writable(tmp_path / "a" / "b", "--cache", folder=True, create=True)   # made later, under tmp_path
    assert files_under(tmp_path) == []


@pytest.mark.parametrize("target, kw, why", [
    ("f/x.png", {}, "f is not a folder"),                      # a file where a folder should be
    ("f", {"folder": True}, "f: not a folder"),
    ("f/a/b", {"folder": True, "create": True}, "f is not a folder"),
    ("d", {}, "d: is a folder"),                               # a folder where a file should be
    ("nope/x.png", {}, "folder"),                              # a missing folder (not to be made)
    ("/proc/x.png", {}, "/proc is a kernel file system"),      # a create fails there (ENOENT) ...
    ("/proc", {"folder": True}, "/proc is a kernel file system"),
    ("/sys/x.png", {}, "/sys is a kernel file system"),        # ... or succeeds (cgroup folders): never real files
    ("/proc/self/x", {"folder": True, "create": True}, "/proc is a kernel file system"),
])
def test_check_writable_refuses_in_one_line_naming_flag_and_path(tmp_path, target, kw, why):
    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    path = target if target.startswith("/") else str(tmp_path / target)
    with pytest.raises(UsageError) as e:
        check_writable(path, "--flag", **kw)
    msg = str(e.value)
    assert msg.startswith(f"--flag {path}: ") and why in msg and "\n" not in msg, msg


@pytest.mark.parametrize("code, why", [(errno.EACCES, "permission denied"), (errno.EROFS, "read-only file system"),
                                       (errno.ENOSPC, "no space left on device")])
def test_check_writable_names_why_the_create_failed(tmp_path, monkeypatch, code, why):
    def refuse(*a, **kw):
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(files.tempfile, "mkstemp", refuse)
    with pytest.raises(UsageError, match=f"^--out {tmp_path}/x.png: {why}$"):
        check_writable(tmp_path / "x.png", "--out")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through any permission")
def test_check_writable_a_real_read_only_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    with pytest.raises(UsageError, match="permission denied"):
        check_writable(ro / "x.png", "--out")


# ---- a set of outputs lands all or nothing --------------------------------------------------------

def test_output_set_lands_all_with_umask_permissions(tmp_path):
    with output_set() as out:
        with out.open(tmp_path / "a.bin") as f:
            f.write(b"a")
        out.path(tmp_path / "b.txt").write_text("b")
    assert files_under(tmp_path) == ["a.bin", "b.txt"]
    assert (tmp_path / "b.txt").read_text() == "b"
    assert (tmp_path / "a.bin").stat().st_mode & 0o777 == 0o666 & ~files._umask()


def test_a_full_disk_at_any_file_leaves_none_and_is_one_line(tmp_path):
    (tmp_path / "old.bin").write_bytes(b"old")
    with pytest.raises(OutputError) as e:
        with output_set() as out:
            with out.open(tmp_path / "a.bin") as f:
                f.write(b"a")
            with out.open(tmp_path / "old.bin") as f:
                raise ENOSPC
    assert str(e.value) == f"cannot write {tmp_path}/old.bin: no space left on device; nothing written"
    assert files_under(tmp_path) == ["old.bin"] and (tmp_path / "old.bin").read_bytes() == b"old"


def test_a_rename_that_fails_takes_the_landed_ones_with_it(tmp_path, monkeypatch):
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(src, dst)

    monkeypatch.setattr(files.os, "replace", replace)
    with pytest.raises(OutputError, match="input/output error"):
        with output_set() as out:
            for name in ("a", "b", "c"):
                out.path(tmp_path / name).write_text(name)
    assert files_under(tmp_path) == []


def test_atomic_open_passes_an_oserror_on_as_is(tmp_path):
    """The cubin cache treats an unwritable cache as a miss: atomic_open must not turn it into an OutputError."""
    with pytest.raises(OSError) as e:
        with atomic_open(tmp_path / "x.bin") as f:
            f.write(b"half")
            raise ENOSPC
    assert not isinstance(e.value, OutputError) and files_under(tmp_path) == []

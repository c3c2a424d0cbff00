"""A compiler run (nvcc for `jetson-sample --prepare` and the runtime) ends with its caller: on
Ctrl-C, SIGTERM or any error the compiler and its children (cicc, ptxas) are killed, and the
temporary folder (the source, nvcc's own temporaries: $TMPDIR points there) is removed. A fake nvcc
stands in: a shell script that writes a temporary, starts a long-running child (as nvcc starts cicc)
and waits for it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jetson_unet.build import compilers
from jetson_unet.build.compilers import nvcc_cubin, nvcc_toolchain
from jetson_unet.errors import KernelCompileError

pytestmark = pytest.mark.skipif(os.name != "posix" or not Path("/proc").is_dir(), reason="POSIX signals, /proc")

FAKE_NVCC = """#!/bin/sh
case "$1" in
  --version) echo "Cuda compilation tools, release 99.9, V99.9.0"; exit 0;;
  --list-gpu-arch) echo "compute_87"; exit 0;;
esac
if [ "$FAKE_NVCC_MODE" = fail ]; then echo "m.cu(1): error: expected a declaration"; exit 2; fi
echo partial > "$TMPDIR/tmpxft_0000_fake.cpp"
sleep 300 &
echo $! > "$FAKE_NVCC_CHILD.tmp" && mv "$FAKE_NVCC_CHILD.tmp" "$FAKE_NVCC_CHILD"
wait
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """(nvcc path, the file its child's pid lands in, the temp root); TMPDIR moved into tmp_path."""
    bin_dir, tmp = tmp_path / "bin", tmp_path / "tmp"
    bin_dir.mkdir()
    tmp.mkdir()
    nvcc = bin_dir / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    child = tmp_path / "child.pid"
    monkeypatch.setenv("FAKE_NVCC_CHILD", str(child))
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr("tempfile.tempdir", None)   # re-read $TMPDIR
    return nvcc, child, tmp


def gone(pid: int, wait_s: float = 5.0) -> bool:
    """The process has exited (a zombie left for init to reap counts as gone)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def wait_for(path: Path, proc: "subprocess.Popen[bytes]", wait_s: float = 60.0) -> int:
    deadline = time.monotonic() + wait_s
    while not path.exists():
        assert proc.poll() is None, f"exited early: {proc.communicate()}"
        assert time.monotonic() < deadline, "the fake compiler never started its child"
        time.sleep(0.02)
    return int(path.read_text())


def leftovers(tmp: Path) -> list:
    return sorted(p.name for p in tmp.iterdir())


def run_python(code: str) -> "subprocess.Popen[bytes]":
    """`code` in a Python process of its own, with Ctrl-C's default handler: a test run started as a
    background job (`pytest &` in a script) hands its children SIGINT ignored, and Python then keeps
    it ignored."""
    prelude = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    return subprocess.Popen([sys.executable, "-c", prelude + code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def interrupt(proc: "subprocess.Popen[bytes]", child_file: Path, sigs) -> int:
    """Once the compiler's child runs: send `sigs` to the Python process; its exit status."""
    child = wait_for(child_file, proc)
    for sig in sigs:
        proc.send_signal(sig)
    try:
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert gone(child), f"the compiler's child {child} outlived its caller"
    return proc.returncode


@pytest.mark.parametrize("sigs,status", [([signal.SIGTERM], 128 + signal.SIGTERM),
                                         ([signal.SIGTERM, signal.SIGTERM], 128 + signal.SIGTERM),
                                         ([signal.SIGINT], None)],
                         ids=["sigterm", "sigterm-twice", "sigint"])
def test_signal_during_nvcc_cubin(fake, sigs, status):
    """The compile in a Python process of its own (the test runner keeps its signals): SIGTERM exits
    143 after the cleanup, Ctrl-C raises KeyboardInterrupt after it."""
    nvcc, child_file, tmp = fake
    proc = run_python("from jetson_unet.build.compilers import nvcc_cubin\n"
                      f"nvcc_cubin('x', 'm.cu', ['--gpu-architecture=sm_87'], 87, {str(nvcc)!r})")
    rc = interrupt(proc, child_file, sigs)
    assert rc == status if status is not None else rc != 0
    assert leftovers(tmp) == []


def test_sigterm_during_prepare(fake, tiny_weights_path, tmp_path, monkeypatch):
    """`jetson-sample --prepare --compiler nvcc` killed with SIGTERM: no compiler left running, no
    /tmp/jetson-unet-nvcc-* folder, no nvcc temporaries."""
    nvcc, child_file, tmp = fake
    monkeypatch.setenv("PATH", f"{nvcc.parent}{os.pathsep}{os.environ['PATH']}")   # the fake is the nvcc found
    proc = run_python("import sys\nfrom jetson_unet.cli import main\n"
                      f"sys.exit(main(['--prepare', '--compiler', 'nvcc', '--arch', '87', '--precision', 'fp32', "
                      f"'--batch', '1', '--weights', {str(tiny_weights_path)!r}, "
                      f"'--cache', {str(tmp_path / 'cache')!r}]))")
    rc = interrupt(proc, child_file, [signal.SIGTERM])
    assert rc != 0
    assert leftovers(tmp) == []


def test_error_during_compile_ends_the_compiler(fake, monkeypatch):
    """Any exception while the compiler runs (here from the wait itself) kills its process group
    and removes the folder, in this process."""
    nvcc, child_file, tmp = fake
    real = subprocess.Popen.communicate

    def broken(self, *a, **k):
        if self.args[1:2] == ["-cubin"]:
            wait_for(child_file, self)
            raise RuntimeError("the wait failed")
        return real(self, *a, **k)

    monkeypatch.setattr(subprocess.Popen, "communicate", broken)
    with pytest.raises(RuntimeError, match="the wait failed"):
        nvcc_cubin("x", "m.cu", ["--gpu-architecture=sm_87"], 87, str(nvcc))
    assert gone(int(child_file.read_text()))
    assert leftovers(tmp) == []


def test_failed_compile_is_one_error_and_leaves_nothing(fake, monkeypatch):
    nvcc, child_file, tmp = fake
    monkeypatch.setenv("FAKE_NVCC_MODE", "fail")
    with pytest.raises(KernelCompileError, match="expected a declaration"):
        nvcc_cubin("x", "m.cu", ["--gpu-architecture=sm_87"], 87, str(nvcc))
    assert leftovers(tmp) == []


def test_quick_calls_and_handlers(fake):
    """--version through the same runner; SIGTERM's default action is back after a compile, and an
    application's own SIGTERM handler is left alone."""
    nvcc, _, _ = fake
    assert nvcc_toolchain(str(nvcc)) == "nvcc: Cuda compilation tools, release 99.9, V99.9.0"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    mine = lambda signum, frame: None   # noqa: E731
    old = signal.signal(signal.SIGTERM, mine)
    try:
        with compilers._sigterm_exits():
            assert signal.getsignal(signal.SIGTERM) is mine
        assert compilers.run_tool([str(nvcc), "--list-gpu-arch"]) == (0, "compute_87\n")
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, old)


def group_gone(pgid: int, wait_s: float = 5.0) -> bool:
    """No process is left in group `pgid` (zombies are reaped by init soon after their parent ends)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def test_sigterm_while_the_compiler_starts_still_ends_it(fake, tmp_path):
    """A SIGTERM that lands while Popen is still starting the compiler (as it can under load, or
    when another thread of the process takes the signal) still ends the compiler's group: the
    signal waits until the call holds the process."""
    nvcc, _, tmp = fake
    pidfile = tmp_path / "group.pid"
    proc = run_python("import os, signal, subprocess\n"
                      "class P(subprocess.Popen):\n"
                      "    def __init__(self, cmd, **kw):\n"
                      "        super().__init__(cmd, **kw)\n"
                      "        if '-cubin' in cmd:\n"
                      f"            open({str(pidfile)!r}, 'w').write(str(self.pid))\n"
                      "            os.kill(os.getpid(), signal.SIGTERM)   # before Popen returns\n"
                      "subprocess.Popen = P\n"
                      "from jetson_unet.build.compilers import nvcc_cubin\n"
                      f"nvcc_cubin('x', 'm.cu', ['--gpu-architecture=sm_87'], 87, {str(nvcc)!r})")
    try:
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    pgid = int(pidfile.read_text())
    try:
        assert group_gone(pgid), "the compiler's group outlived its caller"
    finally:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 128 + signal.SIGTERM
    assert leftovers(tmp) == []

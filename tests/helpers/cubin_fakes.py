"""Fakes of the cubin toolchain for the CPU tests: a minimal CUDA ELF, a backend that loads cubins
(as CuPy's does), CuPy's NVRTC binding and RawModule, an nvcc script, and a `Compiler` that records
what it builds (the loader's `compiler=` and `jetson-sample --prepare`'s)."""
from __future__ import annotations

import re
import stat
import struct
import types
from pathlib import Path

from tests.helpers.fakes import FakeBackend, FakeModule

from jetson_unet.errors import KernelCompileError
from jetson_unet.build import compilers
from jetson_unet.build import cache as cubins
from jetson_unet.backends.cupy import CupyBackend


def fake_cubin(arch: int, symbols, abi: int = 8) -> bytes:
    """A minimal CUDA ELF header (64-bit, e_machine 190, the arch in e_flags as nvcc writes it)
    followed by the kernels' section names, as a real cubin holds them."""
    flags = (0x06000004 | (arch << 8)) if abi >= 8 else (0x00050000 | arch)
    ident = b"\x7fELF" + bytes([2, 1, 1, 65 if abi >= 8 else 51, abi]) + bytes(7)
    head = ident + struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, 0, flags, 64, 0, 0, 64, 0, 0)
    return head + b"".join(b".text." + s.encode() + b"\0" for s in symbols)


def symbols_of(source: str):
    return sorted(set(re.findall(r"_INSTANCE\((\w+),", source)))


class CubinBackend(FakeBackend):
    """FakeBackend that loads cubins, as CuPy's does (compiler "nvrtc": the loader builds its cubins
    with NVRTC, or with the Compiler a test hands it); load_cubin refuses (AssertionError) anything
    that a real driver should never have been handed, and the driver's refusal of the files named in
    `refuse`. Modules that go through compile_source land in `compiled` (FakeBackend's)."""
    compiler = "nvrtc"

    def __init__(self, arch=87, refuse=()):
        super().__init__(arch=arch)
        self.refuse = set(refuse)
        self.loads = []

    def load_cubin(self, path, symbols=()):
        data = Path(path).read_bytes()
        assert cubins.check_cubin(data, self._arch, symbols) is None, "an invalid cubin reached the driver"
        self.loads.append(Path(path))
        if Path(path).name in self.refuse:
            raise KernelCompileError(str(path), (), "CUDA_ERROR_INVALID_IMAGE: device kernel image is invalid")
        return FakeModule(self.launches, self)


class FakeNvrtc:
    class NVRTCError(Exception):
        pass

    def __init__(self, archs=(75, 80, 86, 87, 89, 90), fail=None):
        self.archs, self.fail, self.calls, self.destroyed = archs, fail, [], 0

    getVersion = staticmethod(lambda: (12, 6))  # noqa: E731

    def getSupportedArchs(self):
        return self.archs

    def createProgram(self, src, name, headers, include_names):
        self.src = src
        return 7

    def compileProgram(self, prog, options):
        self.calls.append(list(options))
        if self.fail:
            raise self.NVRTCError("NVRTC_ERROR_COMPILATION (6)")

    def getProgramLog(self, prog):
        return 'seed-unet.cu(3): error: identifier "x" is undefined'

    def getCUBIN(self, prog):
        arch = int(self.calls[-1][-1].split("sm_")[1])
        return fake_cubin(arch, symbols_of(self.src))

    def destroyProgram(self, prog):
        self.destroyed += 1


class FakeRawModule:
    """cupy.RawModule: path= a cubin (its kernels looked up as the driver would), or code= source
    that CuPy's own NVRTC path compiles lazily (any kernel then exists)."""

    def __init__(self, code=None, options=(), path=None):
        self.code, self.options, self.path = code, tuple(options), path

    def get_function(self, name):
        if self.path is not None and b".text." + name.encode() + b"\0" not in Path(self.path).read_bytes():
            raise RuntimeError("CUDA_ERROR_NOT_FOUND: named symbol not found")
        return ("kernel", name)


def fake_cupy_backend():
    """A CupyBackend over a fake `cupy` (no device): only its module paths are exercised, load_cubin
    and compile_source; it compiles no cubins itself (jetson_unet.build.compilers does)."""
    be = CupyBackend.__new__(CupyBackend)
    be.cp = types.SimpleNamespace(RawModule=FakeRawModule, cuda=types.SimpleNamespace(
        compiler=types.SimpleNamespace(CompileException=type("CE", (Exception,), {}))))
    return be


def cupy_nvrtc(monkeypatch, nvrtc=None):
    """Make `nvrtc` (default a new FakeNvrtc) what compilers.runtime_compiler("nvrtc") finds as CuPy's
    binding (cupy.cuda.nvrtc), so that a backend whose compiler is "nvrtc" builds through it when the
    loader is handed no compiler (the executor's KernelSet). Returns it: its `calls` are the builds."""
    nvrtc = nvrtc if nvrtc is not None else FakeNvrtc()
    real = compilers.nvrtc_module
    monkeypatch.setattr(compilers, "nvrtc_module", lambda mod=None: real(mod) if mod is not None else nvrtc)
    return nvrtc


def hide_nvcc(monkeypatch, tmp_path):
    """No nvcc to be found here: not on PATH, no $CUDA_ROOT / $CUDA_HOME / $CUDA_PATH, no CUDA_ROOTS."""
    monkeypatch.setenv("PATH", str(tmp_path / "no-nvcc-here"))
    for var in ("CUDA_ROOT", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(compilers, "CUDA_ROOTS", ())


FAKE_NVCC = r"""#!/bin/sh
# A stand-in for nvcc: --version, --list-gpu-arch, and -cubin writing a fake CUDA ELF (a source
# holding BROKEN fails as a compile error does).
case "$1" in
  --version) echo "nvcc: NVIDIA (R) Cuda compiler driver"; echo "Cuda compilation tools, release 12.6, V12.6.68"; exit 0;;
  --list-gpu-arch) echo compute_75; echo compute_87; exit 0;;
esac
echo "$@" > "$(dirname "$0")/args"
out=""; prev=""; src=""
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; src="$a"; done
case "$*" in *-arch=sm_72*) echo "nvcc fatal   : Unsupported gpu architecture 'sm_72'"; exit 1;; esac
if grep -q BROKEN "$src"; then
  echo "$(basename "$src")(3): error: identifier \"x\" is undefined"; echo "1 error detected"; exit 2
fi
cp "$(dirname "$0")/payload" "$out"
"""


def write_fake_nvcc(folder: Path, payload: bytes) -> Path:
    nvcc = folder / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    (folder / "payload").write_bytes(payload)
    return nvcc


def fake_compiler(log, toolchain="nvrtc 12.6", unsupported=(), kind="nvrtc"):
    """A jetson_unet.build.compilers.Compiler that appends (arch, source name) to `log` per build and
    returns a fake cubin of the source's kernels; ArchUnsupported for an arch in `unsupported`."""
    def build(src, name, options, arch):
        log.append((arch, name))
        assert f"--gpu-architecture=sm_{arch}" in options, options
        if arch in unsupported:
            raise compilers.ArchUnsupported(name, options, f"{toolchain} cannot target sm_{arch}")
        return fake_cubin(arch, symbols_of(src))
    return compilers.Compiler(kind, toolchain, build)

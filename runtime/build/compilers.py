"""Source text -> cubin bytes, with no GPU needed: NVRTC (through CuPy's thin NVRTC binding, or any
libnvrtc.so through nvrtc_lib.NvrtcLib, which has the same calls) or nvcc.

NVRTC is driven directly (`cupy.cuda.nvrtc`: createProgram / compileProgram / getCUBIN), not through
`cupy.cuda.compiler.compile_using_nvrtc`: the latter asks the current device for its arch even when
one is passed (a memoized per-device helper calls cudaGetDevice), so it fails on a machine without
a driver, where an x86 box cross-compiling for sm_87 usually is. `--gpu-architecture=sm_XX` makes
NVRTC emit a cubin (SASS) rather than PTX.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from typing import Any, Optional, Sequence, Tuple

from jetson_unet.errors import KernelCompileError


class ArchUnsupported(KernelCompileError):
    """The toolchain cannot target this arch (e.g. CUDA 13 dropped sm_72)."""


def nvrtc_module(nvrtc: Any = None) -> Any:
    if nvrtc is not None:
        return nvrtc
    from cupy.cuda import nvrtc as mod   # ImportError when CuPy is absent
    return mod


def nvrtc_version(nvrtc: Any = None) -> Tuple[int, int]:
    major, minor = nvrtc_module(nvrtc).getVersion()
    return int(major), int(minor)


def nvrtc_toolchain(nvrtc: Any = None) -> str:
    major, minor = nvrtc_version(nvrtc)
    return f"nvrtc {major}.{minor}"


def nvrtc_label(nvrtc: Any = None) -> str:
    """`nvrtc 12.9 (/path/libnvrtc.so.12)` for a library binding (nvrtc_lib), `nvrtc 13.0` for CuPy's."""
    mod = nvrtc_module(nvrtc)
    library = getattr(mod, "library", None)
    return f"{nvrtc_toolchain(mod)} ({library})" if library else nvrtc_toolchain(mod)


def nvrtc_archs(nvrtc: Any = None) -> Optional[Tuple[int, ...]]:
    """The SM numbers this NVRTC can build cubins for (None when it cannot say: NVRTC < 11.2)."""
    try:
        return tuple(int(a) for a in nvrtc_module(nvrtc).getSupportedArchs())
    except Exception:   # an old binding without the call (AttributeError), or an NVRTC error
        return None


def nvrtc_cubin(source: str, source_name: str, options: Sequence[str], arch: int, nvrtc: Any = None) -> bytes:
    """Compile with NVRTC for sm_<arch>; errors carry the NVRTC log."""
    mod = nvrtc_module(nvrtc)
    archs = nvrtc_archs(mod)
    if archs is not None and int(arch) not in archs:
        raise ArchUnsupported(source_name, tuple(options),
                              f"{nvrtc_label(mod)} cannot target sm_{arch} (it builds {_span(archs)})")
    opts = [o for o in options if not o.startswith(("-arch=", "--gpu-architecture="))]
    opts.append(f"--gpu-architecture=sm_{int(arch)}")
    prog = mod.createProgram(source, source_name, (), ())
    try:
        try:
            mod.compileProgram(prog, opts)
        except mod.NVRTCError as e:
            log = ""
            try:
                log = mod.getProgramLog(prog)
            except Exception:
                pass
            where = f"\n[{nvrtc_label(mod)}]" if getattr(mod, "library", None) else ""
            raise KernelCompileError(source_name, tuple(opts), (log or str(e)) + where) from None
        return bytes(mod.getCUBIN(prog))
    finally:
        mod.destroyProgram(prog)


# ---- nvcc ---------------------------------------------------------------------------------------------
def nvcc_toolchain(nvcc: str) -> str:
    """`nvcc: Cuda compilation tools, release 13.0, V13.0.88` (the release line of --version)."""
    try:
        out = subprocess.run([nvcc, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             check=False).stdout.decode("utf-8", "replace")
    except OSError as e:
        raise KernelCompileError("kernels", (), f"cannot run {nvcc} --version: {e}") from None
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return "nvcc: " + next((ln for ln in lines if "release" in ln), lines[-1] if lines else "unknown version")


def nvcc_archs(nvcc: str) -> Optional[Tuple[int, ...]]:
    """`nvcc --list-gpu-arch` as SM numbers (None when this nvcc cannot list them)."""
    try:
        out = subprocess.run([nvcc, "--list-gpu-arch"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             check=False)
    except OSError:
        return None
    archs = tuple(int(a) for a in re.findall(r"compute_(\d+)", out.stdout.decode("utf-8", "replace")))
    return archs if out.returncode == 0 and archs else None


def nvcc_cubin(source: str, source_name: str, options: Sequence[str], arch: int, nvcc: str) -> bytes:
    """`nvcc -cubin -arch=sm_XX` with the NVRTC options translated (backend_pycuda.nvcc_args)."""
    from jetson_unet.backends.pycuda import nvcc_args  # pure helpers; pycuda itself is not imported
    archs = nvcc_archs(nvcc)
    if archs is not None and int(arch) not in archs:
        raise ArchUnsupported(source_name, tuple(options),
                              f"{nvcc_toolchain(nvcc)} cannot target sm_{arch} (it builds {_span(archs)})")
    nv = nvcc_args([o for o in options if not o.startswith(("-arch=", "--gpu-architecture="))]
                   + [f"--gpu-architecture=sm_{int(arch)}"], source_name)
    with tempfile.TemporaryDirectory(prefix="jetson-unet-nvcc-") as tmp:
        src, out = os.path.join(tmp, source_name), os.path.join(tmp, "module.cubin")
        with open(src, "w") as f:
            f.write(source)
        cmd = [nvcc, "-cubin", f"-arch={nv.arch}", *nv.options, *("-I" + d for d in nv.include_dirs), "-o", out, src]
        try:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
        except OSError as e:
            raise KernelCompileError(source_name, tuple(cmd[1:]), f"cannot run {nvcc}: {e}") from None
        log = r.stdout.decode("utf-8", "replace")
        if r.returncode != 0:
            cls = ArchUnsupported if "Unsupported gpu architecture" in log else KernelCompileError
            raise cls(source_name, tuple(cmd[1:-3]), log.strip())
        with open(out, "rb") as f:
            return f.read()


def _span(archs: Sequence[int]) -> str:
    return f"sm_{min(archs)}..sm_{max(archs)}" if archs else "nothing"

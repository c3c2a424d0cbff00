"""Source text -> cubin bytes, with no GPU needed: NVRTC (through CuPy's thin NVRTC binding, or any
libnvrtc.so through nvrtc_lib.NvrtcLib, which has the same calls) or nvcc. A `Compiler` wraps one of
them for the loader (the backend's `compiler`: `runtime_compiler`) and for `jetson-sample --prepare`
(jetson_unet.build.aot.pick_compiler).

NVRTC is driven directly (`cupy.cuda.nvrtc`: createProgram / compileProgram / getCUBIN), not through
`cupy.cuda.compiler.compile_using_nvrtc`: the latter asks the current device for its arch even when
one is passed (a memoized per-device helper calls cudaGetDevice), so it fails on a machine without
a driver, where an x86 box cross-compiling for sm_87 usually is. `--gpu-architecture=sm_XX` makes
NVRTC emit a cubin (SASS) rather than PTX.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence, Tuple

from jetson_unet.errors import KernelCompileError


CUDA_ROOTS = ("/usr/local/cuda",)   # where JetPack and the x86 installers put the toolkit
NVRTC_ONLY = ("-default-device", "--device-as-default-execution-space", "-pch", "--pch", "--create-pch",
              "--use-pch", "--pch-dir", "--minimal", "-no-source-include", "--no-source-include")


class ArchUnsupported(KernelCompileError):
    """The toolchain cannot target this arch (e.g. CUDA 13 dropped sm_72)."""


@dataclass(frozen=True)
class Compiler:
    kind: str                                                   # "nvrtc" | "nvcc"
    toolchain: str                                              # part of the cache key
    build: Callable[[str, str, Tuple[str, ...], int], bytes]    # (source, name, options, arch) -> cubin
    archs: Optional[Tuple[int, ...]] = None                     # what it can target; None: cannot tell
    label: str = ""                                             # for messages: toolchain and where from
    fallback: Optional[Callable[[], Optional["Compiler"]]] = None   # for an arch outside `archs`

    @property
    def name(self) -> str:
        return self.label or self.toolchain

    def targets(self, arch: int) -> bool:
        return self.archs is None or int(arch) in self.archs

    def for_arch(self, arch: int) -> "Compiler":
        """This compiler, or its fallback where only the fallback can target `arch`."""
        if self.targets(arch) or self.fallback is None:
            return self
        other = self.fallback()
        return other if other is not None and other.archs is not None and other.targets(arch) else self


def nvrtc_compiler(mod: Any) -> Compiler:
    """A Compiler over an NVRTC binding (CuPy's or an nvrtc_lib.NvrtcLib)."""
    return Compiler("nvrtc", nvrtc_toolchain(mod), lambda s, n, o, a: nvrtc_cubin(s, n, o, a, mod),
                    archs=nvrtc_archs(mod), label=nvrtc_label(mod))


def nvcc_compiler(nvcc: str) -> Compiler:
    """A Compiler over an nvcc executable (it says itself when it cannot target an arch)."""
    return Compiler("nvcc", nvcc_toolchain(nvcc), lambda s, n, o, a: nvcc_cubin(s, n, o, a, nvcc))


def runtime_compiler(kind: Optional[str]) -> Optional[Compiler]:
    """What builds a backend's cubins (its `compiler`): "nvrtc", CuPy's NVRTC binding where it can
    hand out a cubin; "nvcc", the nvcc that find_nvcc finds. None where there is none: the loader
    then uses the cache alone, or the backend's compile_source."""
    if kind == "nvrtc":
        try:
            mod = nvrtc_module()
        except Exception:   # no CuPy, or no libnvrtc behind it
            return None
        return nvrtc_compiler(mod) if hasattr(mod, "getCUBIN") else None
    if kind == "nvcc":
        nvcc = find_nvcc()
        return nvcc_compiler(nvcc) if nvcc else None
    return None


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
class NvccArgs(NamedTuple):
    arch: str                        # "sm_87": pycuda passes it as `-arch sm_87`
    include_dirs: Tuple[str, ...]
    options: Tuple[str, ...]         # everything else, spelled the same for nvcc and NVRTC

    def command_options(self) -> Tuple[str, ...]:
        """What nvcc finally sees (less pycuda's own include dir): the cache key and error text."""
        return self.options + ("-arch", self.arch) + tuple("-I" + d for d in self.include_dirs)


def nvcc_args(options: Sequence[str], source_name: str = "kernels") -> NvccArgs:
    """NVRTC options (kernels.nvrtc_options) -> nvcc's: the target becomes `arch`, include paths
    become include_dirs; -std, -D, -U, --use_fast_math, --fmad, -lineinfo, --maxrregcount and the
    like are spelled the same by both. A virtual target (compute_XX) becomes sm_XX: we build cubins."""
    arch, incs, rest = None, [], []
    it = iter(options)
    for opt in it:
        if opt in ("-arch", "--gpu-architecture", "-I", "--include-path"):
            value = next(it, None)
            if value is None:
                raise KernelCompileError(source_name, tuple(options), f"option {opt} needs a value")
            opt = opt + ("=" if opt.startswith("--") or opt == "-arch" else "") + value
        if opt.startswith(("-arch=", "--gpu-architecture=")):
            arch = opt.split("=", 1)[1].replace("compute_", "sm_")
        elif opt.startswith("--include-path="):
            incs.append(opt.split("=", 1)[1])
        elif opt.startswith("-I"):
            incs.append(opt[2:])
        elif opt.split("=", 1)[0] in NVRTC_ONLY:
            raise KernelCompileError(source_name, tuple(options), f"{opt} is an NVRTC-only option; nvcc has none like it")
        else:
            rest.append(opt)
    if arch is None:
        raise KernelCompileError(source_name, tuple(options), "no target (--gpu-architecture=sm_XX) in the options")
    return NvccArgs(arch, tuple(dict.fromkeys(incs)), tuple(rest))


def find_nvcc(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """nvcc on PATH, else under $CUDA_ROOT / $CUDA_HOME / $CUDA_PATH, else /usr/local/cuda/bin."""
    found = shutil.which("nvcc", path=environ.get("PATH"))
    if found:
        return found
    roots = [environ.get(k) for k in ("CUDA_ROOT", "CUDA_HOME", "CUDA_PATH")] + list(CUDA_ROOTS)
    for root in roots:
        if root and os.access(os.path.join(root, "bin", "nvcc"), os.X_OK):
            return os.path.join(root, "bin", "nvcc")
    return None


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
    """`nvcc -cubin -arch=sm_XX` with the NVRTC options translated (nvcc_args)."""
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

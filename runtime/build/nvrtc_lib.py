"""Any libnvrtc.so through ctypes, shaped like CuPy's `cupy.cuda.nvrtc` so that compilers.nvrtc_cubin
drives it unchanged (same options, cache key `nvrtc X.Y`, errors): no second compile path.

Why: CUDA 13 (CuPy's NVRTC 13, nvcc 13) dropped sm_72, Jetson Xavier. NVIDIA ships NVRTC alone as pip
wheels that need no CUDA install, no GPU and no CuPy: `nvidia-cuda-nvrtc-cu11` (11.8,
libnvrtc.so.11.2; cubins a JetPack 5 / CUDA 11.4 driver loads) and `nvidia-cuda-nvrtc-cu12` (12.x,
libnvrtc.so.12). Both install the module `nvidia.cuda_nvrtc` with the library in its `lib/` folder
(cu12 as a namespace package, cu11 with __init__.py files); CUDA 13's wheel uses `nvidia/cu13/`.

Where a library comes from (aot.pick_compiler): `--nvrtc PATH`, else $JETSON_UNET_NVRTC (a file, or a
folder holding one), used for every arch; else, for an arch CuPy's NVRTC cannot target, or when CuPy
is absent, the pip package when importable (`pip_library`).
"""
from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import re
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from jetson_unet.errors import KernelCompileError, UsageError

ENV = "JETSON_UNET_NVRTC"
PIP_MODULE = "nvidia.cuda_nvrtc"
PIP_HINT = "pip install nvidia-cuda-nvrtc-cu11"   # 11.8: targets sm_35..sm_90, loadable by JetPack 5
_NAME = re.compile(r"^libnvrtc\.so(\.\d+)*$")     # not libnvrtc-builtins, not libnvrtc.alt
_CALLS = ("nvrtcVersion", "nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcGetProgramLogSize",
          "nvrtcGetProgramLog", "nvrtcGetCUBINSize", "nvrtcGetCUBIN", "nvrtcDestroyProgram", "nvrtcGetErrorString")


class NVRTCError(KernelCompileError):
    """An NVRTC call returned an error: the call, NVRTC's status text and the library it came from."""

    def __init__(self, library: str, call: str, status: int, text: str) -> None:
        super().__init__(os.path.basename(library), (), f"{call}: {text} ({status})")
        self.library, self.call, self.status = library, call, status
        self.args = (f"{call} failed: {text} ({status}) [{library}]",)


def _preload_builtins(folder: Path) -> None:
    """Load the folder's libnvrtc-builtins.so.X.Y first (RTLD_GLOBAL), so that NVRTC's own dlopen of
    it by name succeeds: NVRTC 13's pip package does not find it beside itself otherwise."""
    for lib in sorted(folder.glob("libnvrtc-builtins.so.*")):
        ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)


class NvrtcLib:
    """The calls compilers.nvrtc_cubin makes, over one libnvrtc.so (CUDA 11.2+: cubin output and the
    arch list). `library` names the file in messages."""
    NVRTCError = NVRTCError

    def __init__(self, path: str, origin: str = "--nvrtc") -> None:
        self.library = str(path)
        try:
            _preload_builtins(Path(self.library).parent)
            self._lib = ctypes.CDLL(self.library)
        except OSError as e:   # missing, not a shared library, wrong machine
            raise UsageError(f"{origin} {self.library}: cannot load it as an NVRTC library ({e})") from None
        missing = [c for c in _CALLS if not hasattr(self._lib, c)]
        if missing:
            raise UsageError(f"{origin} {self.library}: not an NVRTC library with cubin output "
                             f"(no {missing[0]}; CUDA 11.1+ needed)")
        self._lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        self._lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]

    def _check(self, call: str, *args: Any) -> None:
        status = getattr(self._lib, call)(*args)
        if status != 0:
            text = (self._lib.nvrtcGetErrorString(status) or b"unknown error").decode("utf-8", "replace")
            raise NVRTCError(self.library, call, int(status), text)

    def getVersion(self) -> Tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check("nvrtcVersion", ctypes.byref(major), ctypes.byref(minor))
        return major.value, minor.value

    def getSupportedArchs(self) -> Tuple[int, ...]:
        """AttributeError from NVRTC < 11.2 (no such call): nvrtc_archs then says 'cannot tell'."""
        n = ctypes.c_int()
        self._check("nvrtcGetNumSupportedArchs", ctypes.byref(n))
        archs = (ctypes.c_int * n.value)()
        self._check("nvrtcGetSupportedArchs", archs)
        return tuple(archs)

    def createProgram(self, source: str, name: str, headers: Sequence[str], include_names: Sequence[str]) -> Any:
        prog = ctypes.c_void_p()
        self._check("nvrtcCreateProgram", ctypes.byref(prog), source.encode(), name.encode(), len(headers),
                    _strings(headers), _strings(include_names))
        return prog

    def compileProgram(self, prog: Any, options: Sequence[str]) -> None:
        self._check("nvrtcCompileProgram", prog, len(options), _strings(options))

    def getProgramLog(self, prog: Any) -> str:
        log = self._bytes(prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog")
        return log.rstrip(b"\0").decode("utf-8", "replace")

    def getCUBIN(self, prog: Any) -> bytes:
        return self._bytes(prog, "nvrtcGetCUBINSize", "nvrtcGetCUBIN")

    def destroyProgram(self, prog: Any) -> None:
        self._check("nvrtcDestroyProgram", ctypes.byref(prog))

    def _bytes(self, prog: Any, size_call: str, data_call: str) -> bytes:
        size = ctypes.c_size_t()
        self._check(size_call, prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        self._check(data_call, prog, buf)
        return buf.raw


def _strings(items: Sequence[str]) -> Any:
    return (ctypes.c_char_p * len(items))(*(s.encode() for s in items)) if items else None


# ---- where a library comes from -----------------------------------------------------------------------
def library_in(folder: str) -> Optional[str]:
    """The libnvrtc.so* in `folder` (highest version when several), None when there is none."""
    found: List[str] = [p for p in glob.glob(os.path.join(folder, "libnvrtc.so*")) if _NAME.match(os.path.basename(p))]
    return max(found, key=lambda p: [int(x) for x in re.findall(r"\d+", os.path.basename(p))] or [0]) if found else None


def resolve(path: str, origin: str) -> str:
    """A user-given library path (a file, or a folder holding libnvrtc.so*), else a one-line UsageError."""
    path = os.path.expanduser(path.strip())
    if os.path.isdir(path):
        lib = library_in(path)
        if lib is None:
            raise UsageError(f"{origin} {path}: no libnvrtc.so* in this folder")
        return lib
    if not os.path.isfile(path):
        raise UsageError(f"{origin} {path}: no such file (give a libnvrtc.so or its folder, e.g. "
                         f"site-packages/nvidia/cuda_nvrtc/lib after `{PIP_HINT}`)")
    return path


def env_library(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """$JETSON_UNET_NVRTC resolved (None when unset or blank)."""
    raw = environ.get(ENV, "")
    return resolve(raw, f"${ENV}") if raw.strip() else None


def pip_library() -> Optional[str]:
    """libnvrtc.so of the importable `nvidia.cuda_nvrtc` (nvidia-cuda-nvrtc-cu11 / -cu12), else None."""
    try:
        spec = importlib.util.find_spec(PIP_MODULE)
    except (ImportError, ValueError):   # no `nvidia` package at all
        return None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        lib = library_in(os.path.join(folder, "lib"))
        if lib is not None:
            return lib
    return None

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
import signal
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Optional, Sequence, Tuple

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
        out = run_tool([nvcc, "--version"])[1]
    except OSError as e:
        raise KernelCompileError("kernels", (), f"cannot run {nvcc} --version: {e}") from None
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return "nvcc: " + next((ln for ln in lines if "release" in ln), lines[-1] if lines else "unknown version")


def nvcc_archs(nvcc: str) -> Optional[Tuple[int, ...]]:
    """`nvcc --list-gpu-arch` as SM numbers (None when this nvcc cannot list them)."""
    try:
        code, out = run_tool([nvcc, "--list-gpu-arch"])
    except OSError:
        return None
    archs = tuple(int(a) for a in re.findall(r"compute_(\d+)", out))
    return archs if code == 0 and archs else None


def nvcc_cubin(source: str, source_name: str, options: Sequence[str], arch: int, nvcc: str) -> bytes:
    """`nvcc -cubin -arch=sm_XX` with the NVRTC options translated (nvcc_args). Its source, its cubin and
    nvcc's own temporaries ($TMPDIR) live in one temporary folder, removed however the call ends."""
    archs = nvcc_archs(nvcc)
    if archs is not None and int(arch) not in archs:
        raise ArchUnsupported(source_name, tuple(options),
                              f"{nvcc_toolchain(nvcc)} cannot target sm_{arch} (it builds {_span(archs)})")
    nv = nvcc_args([o for o in options if not o.startswith(("-arch=", "--gpu-architecture="))]
                   + [f"--gpu-architecture=sm_{int(arch)}"], source_name)
    with _sigterm_exits(), tempfile.TemporaryDirectory(prefix="jetson-unet-nvcc-") as tmp:
        src, out = os.path.join(tmp, source_name), os.path.join(tmp, "module.cubin")
        with open(src, "w") as f:
            f.write(source)
        cmd = [nvcc, "-cubin", f"-arch={nv.arch}", *nv.options, *("-I" + d for d in nv.include_dirs), "-o", out, src]
        try:
            code, log = run_tool(cmd, tmp)
        except OSError as e:
            raise KernelCompileError(source_name, tuple(cmd[1:]), f"cannot run {nvcc}: {e}") from None
        if code != 0:
            cls = ArchUnsupported if "Unsupported gpu architecture" in log else KernelCompileError
            raise cls(source_name, tuple(cmd[1:-3]), log.strip())
        with open(out, "rb") as f:
            return f.read()


# ---- compiler processes: they end with the call ---------------------------------------------------------
def run_tool(cmd: Sequence[str], tmpdir: Optional[str] = None) -> Tuple[int, str]:
    """Run a compiler to its end: (exit code, stdout and stderr). It starts a process group of its
    own, and the whole group (nvcc and its cicc, ptxas) is killed and waited for when the call ends
    otherwise: Ctrl-C, SIGTERM (turned into SystemExit while it runs, where nothing else handles it),
    any error. tmpdir: the tool's $TMPDIR (nvcc's temporaries go there)."""
    env = None if tmpdir is None else dict(os.environ, TMPDIR=tmpdir, TMP=tmpdir, TEMP=tmpdir)
    with _sigterm_exits():
        proc = None
        try:
            # a signal while Popen starts the compiler would raise before `proc` exists and leave the
            # group running (under load, 3 of 40 SIGTERMs did): deferred until `proc` is set
            with _signals_deferred():
                proc = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, env=env, start_new_session=True)
            out, _ = proc.communicate()
        except BaseException:
            if proc is not None:
                _end_group(proc)
            raise
    return proc.returncode, out.decode("utf-8", "replace")


def _end_group(proc: "subprocess.Popen[bytes]", wait_s: float = 0.5) -> None:
    """SIGKILL the process group of `proc`, reap `proc` and wait (up to wait_s) for the rest to go;
    a second Ctrl-C or SIGTERM meanwhile waits until this is done."""
    with _signals_deferred():
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (AttributeError, OSError):   # no process groups (Windows), or the group is gone
            proc.kill()
        if proc.stdout is not None:
            proc.stdout.close()
        proc.wait()
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)       # members left (or zombies not yet reaped by init)
            except (AttributeError, OSError):
                return
            time.sleep(0.01)


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM held back while the block runs, then handed to their handlers. In the main
    thread (where Python runs signal handlers) each handler that Python set is swapped for one that
    only notes the signal; at the end the handlers come back and the first signal noted goes to its
    own (KeyboardInterrupt, SystemExit, or SIGTERM's default action again). A thread mask alone is not
    enough: another thread of the process (a BLAS worker) takes the signal, and the main thread still
    runs the handler at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted = []
    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        h = signal.getsignal(sig)
        if callable(h) or h == signal.SIG_DFL:
            old[sig] = h
            signal.signal(sig, lambda signum, frame: noted.append(signum))
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        if noted:
            h = old[noted[0]]
            if callable(h):
                h(noted[0], None)
            else:   # the default action, as if the signal came now
                os.kill(os.getpid(), noted[0])


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    """SystemExit(128 + 15) at the first SIGTERM; a repeat (timeout(1) signals twice) is let go: the
    exit and its cleanup are under way."""
    if not getattr(_exit_on_sigterm, "fired", False):
        _exit_on_sigterm.fired = True   # type: ignore[attr-defined]
        raise SystemExit(128 + signum)


@contextmanager
def _sigterm_exits() -> Iterator[None]:
    """While the block runs, SIGTERM raises SystemExit(128 + 15) (exit status 143, as the signal's)
    so that the block's cleanup runs; only in the main thread, and only where SIGTERM still has its
    default action (a CLI's or an application's own handler is left alone; nested blocks: the outer)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    _exit_on_sigterm.fired = False   # type: ignore[attr-defined]
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _span(archs: Sequence[int]) -> str:
    return f"sm_{min(archs)}..sm_{max(archs)}" if archs else "nothing"

"""A libnvrtc.so through ctypes (jetson_unet.build.nvrtc_lib) and which NVRTC `--prepare` uses per arch:
--nvrtc / $JETSON_UNET_NVRTC for every arch, else CuPy's with the pip NVRTC (nvidia-cuda-nvrtc-cu11 /
-cu12) for an arch CuPy's cannot target (CUDA 13 and sm_72), said in one line; without CuPy the pip
NVRTC. Unit tests over fake bindings; then, where a CUDA 11/12 NVRTC is installed ($JETSON_UNET_NVRTC
or the pip package; CI has neither and skips), the shipped model's fp32 modules really built for
sm_72. No GPU needed."""
from __future__ import annotations

import json
import sys

import pytest

from tests.helpers.cubin_fakes import FakeNvrtc, hide_nvcc, write_fake_nvcc

from jetson_unet import cli
from jetson_unet.model.config import UNetConfig
from jetson_unet.errors import KernelCompileError, UsageError
from jetson_unet.build import aot
from jetson_unet.build import compilers
from jetson_unet.build import cache as cubins
from jetson_unet.build import nvrtc_lib
from jetson_unet.model.weights import random_params

TINY = UNetConfig(image_size=16, dim=8, dim_mults=(1, 2), time_dim=32)
PIP_LIB = "/site/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"


class W:
    def __init__(self, cfg, seed=0):
        self.config, self.params = cfg, random_params(cfg, seed)


class CupyNvrtc13(FakeNvrtc):
    """CuPy's binding over NVRTC 13: no sm_72."""
    getVersion = staticmethod(lambda: (13, 0))  # noqa: E731

    def __init__(self, **kw):
        super().__init__(archs=(75, 80, 86, 87, 89, 90, 100, 120), **kw)


class FakeLib(FakeNvrtc):
    """nvrtc_lib.NvrtcLib over a CUDA 12.9 libnvrtc.so: has `library`, targets sm_72."""
    getVersion = staticmethod(lambda: (12, 9))  # noqa: E731

    def __init__(self, path=PIP_LIB, origin="--nvrtc", **kw):
        super().__init__(archs=(70, 72, 75, 80, 86, 87, 89, 90), **kw)
        self.library, self.origin = path, origin


@pytest.fixture
def pip_nvrtc(monkeypatch):
    """The pip package importable (a FakeLib behind it); `opened` lists the libraries loaded."""
    opened = []

    def open_lib(path, origin="--nvrtc"):
        opened.append((path, origin))
        return FakeLib(path, origin)
    monkeypatch.setattr(nvrtc_lib, "pip_library", lambda: PIP_LIB)
    monkeypatch.setattr(nvrtc_lib, "NvrtcLib", open_lib)
    monkeypatch.delenv(nvrtc_lib.ENV, raising=False)
    return opened


@pytest.fixture
def no_pip_nvrtc(monkeypatch):
    monkeypatch.setattr(nvrtc_lib, "pip_library", lambda: None)
    monkeypatch.delenv(nvrtc_lib.ENV, raising=False)


# ---- which compiler for which arch -----------------------------------------------------------------------------------
def test_cupy_nvrtc_13_falls_back_to_the_pip_nvrtc_for_sm72_only(pip_nvrtc):
    comp = aot.pick_compiler("auto", nvrtc=CupyNvrtc13())
    assert (comp.kind, comp.toolchain, comp.name) == ("nvrtc", "nvrtc 13.0", "nvrtc 13.0 (CuPy)")
    assert comp.for_arch(87) is comp and pip_nvrtc == [], "the pip NVRTC is looked for only when needed"
    sm72 = comp.for_arch(72)
    assert (sm72.toolchain, sm72.name) == ("nvrtc 12.9", f"nvrtc 12.9 ({PIP_LIB})")
    assert comp.for_arch(72) is sm72 and len(pip_nvrtc) == 1, "loaded once"
    assert comp.for_arch(50) is comp, "neither can: the primary, whose build then says ArchUnsupported"


def test_prepare_72_and_87_says_which_nvrtc_in_one_line(pip_nvrtc, tmp_path):
    lines = []
    cache = cubins.CubinCache(tmp_path)
    fails = aot.prepare(W(TINY), aot.parse_targets(["72", "87"], sms=[8]), ["fp16", "fp32"], [1],
                        aot.pick_compiler("auto", nvrtc=CupyNvrtc13()), cache, lines.append)
    assert fails == 0, lines
    assert lines[0] == f"nvrtc 13.0 (CuPy) -> {cache.root}"
    assert lines[1] == f"sm_72: nvrtc 13.0 (CuPy) cannot target it; using nvrtc 12.9 ({PIP_LIB})"
    assert lines[2].startswith("sm_72: fp16/bf16 kernels need sm_80+") and lines[2].endswith("fp32 only")
    assert sum("cannot target" in ln for ln in lines) == 1
    built = {(m["arch"], m["toolchain"]) for m in
             (json.loads(p.read_text()) for p in cache.root.glob("*.json"))}
    assert built == {(72, "nvrtc 12.9"), (87, "nvrtc 13.0")}
    lines.clear()
    aot.prepare(W(TINY), aot.parse_targets(["72"], sms=[8]), ["fp32"], [1],
                aot.pick_compiler("auto", nvrtc=CupyNvrtc13()), cache, lines.append)
    assert "up to date" in lines[-1], "the rerun finds the pip NVRTC's cubin"


def test_without_a_fallback_sm72_is_skipped_with_the_pip_hint(no_pip_nvrtc, tmp_path):
    lines = []
    fails = aot.prepare(W(TINY), aot.parse_targets(["72"], sms=[8]), ["fp32"], [1],
                        aot.pick_compiler("auto", nvrtc=CupyNvrtc13()), cubins.CubinCache(tmp_path), lines.append)
    assert fails == 1
    assert lines[-1].startswith("sm_72: skipped: nvrtc 13.0 cannot target sm_72 (it builds sm_75..sm_120)")
    assert "`pip install nvidia-cuda-nvrtc-cu11`" in lines[-1] and "--nvrtc PATH" in lines[-1]


def test_without_cupy_the_pip_nvrtc_is_used_before_nvcc(pip_nvrtc, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    nvcc = str(write_fake_nvcc(tmp_path, b""))
    for which in ("auto", "nvrtc"):
        comp = aot.pick_compiler(which, nvcc=nvcc)
        assert (comp.kind, comp.toolchain, comp.fallback) == ("nvrtc", "nvrtc 12.9", None)
    assert pip_nvrtc[0][1].startswith("pip package nvidia.cuda_nvrtc")
    assert aot.pick_compiler("nvcc", nvcc=nvcc).kind == "nvcc"


def test_without_cupy_or_pip_nvrtc_the_messages_name_the_package(no_pip_nvrtc, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(UsageError, match="nvidia-cuda-nvrtc-cu11"):
        aot.pick_compiler("nvrtc")
    hide_nvcc(monkeypatch, tmp_path)
    with pytest.raises(UsageError, match="no CUDA compiler here.*nvidia-cuda-nvrtc-cu11"):
        aot.pick_compiler("auto")


def test_a_named_library_serves_every_arch(pip_nvrtc, tmp_path, monkeypatch):
    lib = tmp_path / "libnvrtc.so.12"
    lib.write_bytes(b"")
    comp = aot.pick_compiler("auto", nvrtc=CupyNvrtc13(), library=str(lib))     # --nvrtc
    assert (comp.toolchain, comp.fallback, pip_nvrtc[-1]) == ("nvrtc 12.9", None, (str(lib), "--nvrtc"))
    monkeypatch.setenv(nvrtc_lib.ENV, str(tmp_path))                             # a folder holding one
    assert aot.pick_compiler("nvrtc", nvrtc=CupyNvrtc13()).name == f"nvrtc 12.9 ({lib})"
    assert pip_nvrtc[-1] == (str(lib), "$JETSON_UNET_NVRTC")
    nvcc = str(write_fake_nvcc(tmp_path, b""))
    assert aot.pick_compiler("nvcc", nvcc=nvcc).kind == "nvcc", "--compiler nvcc ignores the variable"
    with pytest.raises(UsageError, match="drop --compiler nvcc"):
        aot.pick_compiler("nvcc", nvcc=nvcc, library=str(lib))


def test_compile_errors_carry_the_log_and_the_library():
    with pytest.raises(KernelCompileError) as ei:
        compilers.nvrtc_cubin("x", "seed-unet.cu", ("-std=c++17",), 72, FakeLib(fail=True))
    assert ei.value.log == f'seed-unet.cu(3): error: identifier "x" is undefined\n[nvrtc 12.9 ({PIP_LIB})]'
    assert aot.first_line(ei.value.log).startswith("seed-unet.cu(3): error:")
    with pytest.raises(compilers.ArchUnsupported, match=r"nvrtc 12\.9 \(/site/.*\) cannot target sm_50"):
        compilers.nvrtc_cubin("x", "seed-unet.cu", (), 50, FakeLib())


# ---- where a library comes from --------------------------------------------------------------------------------------
def test_env_variable_parsing(tmp_path, monkeypatch):
    env = nvrtc_lib.ENV
    assert nvrtc_lib.env_library({}) is None and nvrtc_lib.env_library({env: "  "}) is None
    for name in ("libnvrtc.so.11.2", "libnvrtc.so.12", "libnvrtc-builtins.so.12.9", "libnvrtc.alt.so.12"):
        (tmp_path / name).write_bytes(b"")
    lib = str(tmp_path / "libnvrtc.so.12")
    assert nvrtc_lib.env_library({env: f" {lib} "}) == lib
    assert nvrtc_lib.env_library({env: str(tmp_path)}) == lib, "a folder: its newest libnvrtc.so, no builtins"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert nvrtc_lib.env_library({env: "~/libnvrtc.so.11.2"}) == str(tmp_path / "libnvrtc.so.11.2")
    for value, needle in ((str(tmp_path / "nope.so"), "no such file"), (str(tmp_path / "sub"), "no such file")):
        with pytest.raises(UsageError, match=needle) as ei:
            nvrtc_lib.env_library({env: value})
        assert str(ei.value).startswith(f"${env} ") and "\n" not in str(ei.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no libnvrtc.so"):
        nvrtc_lib.env_library({env: str(tmp_path / "empty")})


def test_pip_package_discovery(tmp_path, monkeypatch):
    """The cu11 wheel's layout (regular packages: nvidia/__init__.py, nvidia/cuda_nvrtc/__init__.py);
    cu12's is the same path as a namespace package."""
    lib = tmp_path / "nvidia" / "cuda_nvrtc" / "lib"
    lib.mkdir(parents=True)
    for f in ("nvidia/__init__.py", "nvidia/cuda_nvrtc/__init__.py", "nvidia/cuda_nvrtc/lib/libnvrtc.so.11.2",
              "nvidia/cuda_nvrtc/lib/libnvrtc-builtins.so.11.8"):
        (tmp_path / f).write_bytes(b"")
    def nvidia_modules():
        return [m for m in sys.modules if m == "nvidia" or m.startswith("nvidia.")]
    for mod in nvidia_modules():
        monkeypatch.delitem(sys.modules, mod)    # put back at teardown
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert nvrtc_lib.pip_library() == str(lib / "libnvrtc.so.11.2")
    finally:
        for mod in nvidia_modules():             # the fake package must not outlive the test
            del sys.modules[mod]


def test_a_broken_library_is_one_line(tmp_path):
    bad = tmp_path / "libnvrtc.so.12"
    bad.write_text("not a shared library\n")
    with pytest.raises(UsageError, match=r"^--nvrtc .*libnvrtc\.so\.12: cannot load it") as ei:
        nvrtc_lib.NvrtcLib(str(bad))
    assert "\n" not in str(ei.value)
    with pytest.raises(UsageError, match="not an NVRTC library with cubin output"):
        nvrtc_lib.NvrtcLib("libm.so.6")      # loads, but is not NVRTC


def test_the_builtins_beside_the_library_load_first(tmp_path, monkeypatch):
    """NVRTC 13's pip package finds its libnvrtc-builtins.so.13.0 only if it is loaded already."""
    for name in ("libnvrtc.so.13", "libnvrtc-builtins.so.13.0", "libnvrtc-builtins.alt.so.13.0"):
        (tmp_path / name).write_text("")
    calls = []
    monkeypatch.setattr(nvrtc_lib.ctypes, "CDLL", lambda path, mode=0: calls.append((path, mode)) or object())
    with pytest.raises(UsageError, match="not an NVRTC library"):   # the fake loads, without NVRTC's calls
        nvrtc_lib.NvrtcLib(str(tmp_path / "libnvrtc.so.13"))
    assert calls == [(str(tmp_path / "libnvrtc-builtins.so.13.0"), nvrtc_lib.ctypes.RTLD_GLOBAL),
                     (str(tmp_path / "libnvrtc.so.13"), 0)]


@pytest.mark.parametrize("args, needle", [
    (["--nvrtc", "x.so"], "--nvrtc goes with --prepare"),
    (["--prepare", "--nvrtc", "/nonexistent/libnvrtc.so.12"], "--nvrtc /nonexistent/libnvrtc.so.12: no such file"),
    (["--prepare", "--compiler", "nvcc", "--nvrtc", "x.so"], "drop --compiler nvcc"),
])
def test_cli_usage_errors(args, needle, capsys, tmp_path, tiny_weights_path):
    more = ["--weights", str(tiny_weights_path), "--arch", "72", "--cache", str(tmp_path)]
    assert cli.main(args + more if "--prepare" in args else args) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


# ---- a real CUDA 11/12 NVRTC (where installed) -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_nvrtc():
    path = nvrtc_lib.env_library() or nvrtc_lib.pip_library()
    if path is None:
        pytest.skip(f"no CUDA 11/12 NVRTC here: set ${nvrtc_lib.ENV} or `{nvrtc_lib.PIP_HINT}` (or -cu12)")
    lib = nvrtc_lib.NvrtcLib(path)
    if 72 not in (compilers.nvrtc_archs(lib) or ()):
        pytest.skip(f"{compilers.nvrtc_label(lib)} cannot target sm_72")
    return lib


def test_real_nvrtc_errors(real_nvrtc):
    with pytest.raises(KernelCompileError) as ei:
        compilers.nvrtc_cubin("this is not C++;", "bad.cu", ("-std=c++17",), 72, real_nvrtc)
    assert "bad.cu(1): error" in ei.value.log and real_nvrtc.library in ei.value.log
    with pytest.raises(nvrtc_lib.NVRTCError, match=r"nvrtcCompileProgram failed: .*\[.*libnvrtc"):
        prog = real_nvrtc.createProgram("", "empty.cu", (), ())
        try:
            real_nvrtc.compileProgram(prog, ["--no-such-option"])
        finally:
            real_nvrtc.destroyProgram(prog)


@pytest.mark.slow
def test_real_fp32_modules_for_sm72(real_nvrtc, tmp_path, monkeypatch):
    """Every module the shipped config needs on Xavier (fp32; both boards' SM counts; batches 1, 4,
    16): a CUDA ELF whose e_flags name sm_72, holding every kernel; fp16/bf16 refused in one line."""
    monkeypatch.setattr(aot, "shipped_cache", lambda: cubins.CubinCache(tmp_path / "none", read_only=True))
    comp = compilers.nvrtc_compiler(real_nvrtc)
    cache, lines = cubins.CubinCache(tmp_path), []
    fails = aot.prepare(W(UNetConfig()), aot.parse_targets(["72"]), ["fp16", "fp32", "bf16"], [1, 4, 16],
                        comp, cache, lines.append)
    assert fails == 0, lines
    assert lines[1] == "sm_72: fp16/bf16 kernels need sm_80+ (tensor-core mma.sync); building fp32 only"
    built = sorted(cache.root.glob("*.cubin"))
    assert built and len(built) == sum("compiled in" in ln for ln in lines)
    for cub in built:
        data, meta = cub.read_bytes(), json.loads(cub.with_suffix(".json").read_text())
        assert (meta["arch"], meta["toolchain"]) == (72, comp.toolchain)
        assert cubins.elf_arch(data) == 72 and cubins.check_cubin(data, 72, meta["symbols"]) is None
        assert all(s.endswith("_f32") or "_f32_" in s for s in meta["symbols"]), meta["symbols"]


@pytest.mark.slow
def test_cli_nvrtc_cu12_builds_sm87_cubins_a_jetpack6_driver_reads(tmp_path, tiny_weights_path, capsys):
    """`jetson-sample --prepare --arch 87 --nvrtc <libnvrtc.so of nvidia-cuda-nvrtc-cu12>`, the cross-build
    for an Orin on JetPack 6: an sm_87 cubin in CUDA 12's ELF layout (ABI version 7; CUDA 13's NVRTC writes
    8, which a CUDA 12 driver cannot load). Skips without the cu12 wheel; 7-20 s on 2 cores."""
    lib = nvrtc_lib.pip_library()
    if lib is None or ".so.12" not in lib:
        pytest.skip("no nvidia-cuda-nvrtc-cu12 here (`pip install nvidia-cuda-nvrtc-cu12`)")
    argv = ["--prepare", "--nvrtc", lib, "--arch", "87", "--sms", "8", "--precision", "fp32", "--batch", "1",
            "--weights", str(tiny_weights_path), "--cache", str(tmp_path)]
    assert cli.main(argv) == 0, capsys.readouterr().err
    built = sorted(tmp_path.rglob("*.cubin"))
    assert len(built) == 1 and f"({lib})" in capsys.readouterr().out
    data, meta = built[0].read_bytes(), json.loads(built[0].with_suffix(".json").read_text())
    assert meta["arch"] == 87 and meta["toolchain"].startswith("nvrtc 12.")
    assert cubins.elf_arch(data) == 87 and data[8] == 7 and cubins.check_cubin(data, 87, meta["symbols"]) is None

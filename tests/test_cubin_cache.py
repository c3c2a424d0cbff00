"""CPU checks of the cubin cache: the key, the validation of an entry (a corrupt, foreign-arch or
mismatched cubin is deleted and rebuilt, never loaded), the any-toolchain lookup, the loader's order
(cache, then NVRTC), the CuPy seam over a fake CuPy, and the NVRTC / nvcc drivers over fakes. No GPU
needed; `prepare` is in test_aot_prepare.py."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "gpu"))
from cubin_fakes import (CubinBackend, FakeNvrtc, fake_cubin, fake_cupy_backend,  # noqa: E402
                         write_fake_nvcc)
from fakes import FakeBackend  # noqa: E402

from jetson_unet.paths import kernels_dir  # noqa: E402
from jetson_unet.errors import KernelCompileError  # noqa: E402
from jetson_unet.build import compilers
from jetson_unet.build import cache as cubins  # noqa: E402
from jetson_unet import logs  # noqa: E402
from jetson_unet.build.loader import compile_notice
from jetson_unet.build.loader import KernelSet
from jetson_unet.ops.keys import SimpleKey
from jetson_unet.build.sources import module_source, nvrtc_options  # noqa: E402

KEYS = [SimpleKey("dwconv", "fp16", 7), SimpleKey("final", "fp32"), SimpleKey("init", "fp16", 3)]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(KernelSet, "_cache", {})
    c = cubins.CubinCache(tmp_path / "cubins")
    with logs.captured() as c.notes:
        yield c


def kernel_set(be, cache, keys=KEYS):
    KernelSet._cache.clear()        # a new process, as far as the in-memory modules go
    return KernelSet(be, keys, cache=cache)


# ---- the key --------------------------------------------------------------------------------------------------
def test_cache_key_follows_the_kernel_sources_not_their_folder(tmp_path):
    copy = tmp_path / "kernels"
    shutil.copytree(kernels_dir(), copy)
    key = lambda src, folder, arch=87, tc="nvrtc 12.6": cubins.cache_key(  # noqa: E731
        cubins.sha256(src.encode()), nvrtc_options(arch, folder), arch, tc)
    src = module_source(KEYS, copy)
    assert src == module_source(KEYS) and key(src, copy) == key(module_source(KEYS), kernels_dir()), \
        "same text from another folder (another machine): same key"
    conv = copy / "conv.cu"
    conv.write_text(conv.read_text().replace("#include", "// a comment edited\n#include", 1))
    edited = module_source(KEYS, copy)
    assert edited != src and key(edited, copy) != key(src, copy)
    assert key(src, copy, arch=72) != key(src, copy) and key(src, copy, tc="nvcc 13.0") != key(src, copy)
    assert cubins.cache_key("s", ("-std=c++17", "-DX=1"), 87, "t") != cubins.cache_key("s", ("-std=c++17",), 87, "t")
    assert cubins.key_options(("--gpu-architecture=sm_87", "-std=c++17", "-I/a", "-I", "/b", "-arch", "sm_90")) == \
        ("-std=c++17",)


def test_cache_folder_environment():
    assert cubins.cache_dir({"JETSON_UNET_CACHE": "/x"}) == Path("/x/cubins/v1")
    assert cubins.cache_dir({"XDG_CACHE_HOME": "/y"}) == Path("/y/jetson-unet/cubins/v1")
    assert cubins.cache_dir({}).parts[-4:] == (".cache", "jetson-unet", "cubins", "v1")


@pytest.mark.parametrize("abi", [7, 8])
def test_elf_arch_reads_both_header_layouts(abi):
    assert cubins.elf_arch(fake_cubin(87, [], abi)) == 87
    assert cubins.elf_arch(fake_cubin(72, [], abi)) == 72
    data = bytearray(fake_cubin(87, []))
    data[18] = 62                                        # e_machine x86-64: an ordinary ELF
    assert cubins.elf_arch(bytes(data)) is None
    assert cubins.elf_arch(fake_cubin(87, [])[:40]) is None
    assert cubins.check_cubin(b"\0" * 100, 87) == "not an ELF file"
    assert "sm_90" in cubins.check_cubin(fake_cubin(90, []), 87)
    assert "'k2'" in cubins.check_cubin(fake_cubin(87, ["k1"]), 87, ["k1", "k2"])


# ---- the loader: cache first, NVRTC second; bad entries deleted and rebuilt ---------------------------------------
def test_first_run_compiles_and_stores_second_run_only_loads(cache):
    be = CubinBackend()
    ks = kernel_set(be, cache)
    assert len(be.builds) == 1 and be.builds[0][2] == 87 and len(be.loads) == 1
    assert cache.notes == [compile_notice(87)]
    [cub] = list(cache.root.glob("*.cubin"))
    meta = json.loads(cub.with_suffix(".json").read_text())
    assert meta["arch"] == 87 and meta["toolchain"] == "nvrtc 12.6" and meta["options"] == ["-std=c++17"]
    assert meta["cubin_sha256"] == cubins.sha256(cub.read_bytes())
    assert meta["source_sha256"] == cubins.sha256(ks.source.encode()) and meta["symbols"] == ks.symbols
    kernel_set(be, cache)
    assert len(be.builds) == 1 and be.loads == [cub, cub] and len(cache.notes) == 1


def _truncate(cub, side):
    cub.write_bytes(cub.read_bytes()[:100])


def _random_bytes(cub, side):
    data = np.random.default_rng(0).integers(0, 256, len(cub.read_bytes()), dtype=np.uint8).tobytes()
    cub.write_bytes(data)
    _resign(cub, side)                                   # even with a matching sha256: no ELF magic


def _wrong_sha(cub, side):
    meta = json.loads(side.read_text())
    meta["cubin_sha256"] = "0" * 64
    side.write_text(json.dumps(meta))


def _foreign_arch(cub, side):
    cub.write_bytes(fake_cubin(90, json.loads(side.read_text())["symbols"]))
    _resign(cub, side)                                   # the sidecar claims sm_87, the ELF says sm_90


def _sidecar_says_other_arch(cub, side):
    meta = json.loads(side.read_text())
    meta["arch"] = 90
    side.write_text(json.dumps(meta))


def _missing_symbol(cub, side):
    cub.write_bytes(fake_cubin(87, ["dwconv7_f16"]))
    _resign(cub, side)


def _resign(cub, side):
    meta = json.loads(side.read_text())
    meta["cubin_sha256"] = cubins.sha256(cub.read_bytes())
    side.write_text(json.dumps(meta))


BREAK = {"truncated": _truncate, "random bytes": _random_bytes, "wrong sha in the sidecar": _wrong_sha,
         "foreign arch": _foreign_arch, "sidecar names another arch": _sidecar_says_other_arch,
         "missing kernel": _missing_symbol,
         "no sidecar": lambda cub, side: side.unlink(),
         "sidecar not JSON": lambda cub, side: side.write_text("{not json")}


@pytest.mark.parametrize("how", list(BREAK))
def test_bad_cubin_is_detected_deleted_and_rebuilt(cache, how):
    be = CubinBackend()
    kernel_set(be, cache)
    [cub] = list(cache.root.glob("*.cubin"))
    BREAK[how](cub, cub.with_suffix(".json"))
    kernel_set(be, cache)                                # load_cubin asserts it never sees a bad file
    assert len(be.builds) == 2, "rebuilt"
    assert any(n.startswith("discarded cached kernels") for n in cache.notes), cache.notes
    assert be.loads[-1] == cub and cubins.check_cubin(cub.read_bytes(), 87, kernel_set(be, cache).symbols) is None
    assert len(be.builds) == 2, "and the rebuilt entry serves the next run"


def test_another_toolchains_cubin_is_used_and_ours_preferred(cache):
    src = module_source(KEYS)
    syms = sorted(k.symbol for k in KEYS)
    opts = nvrtc_options(87)
    other = cache.store(fake_cubin(87, syms), src, opts, 87, "nvcc: release 13.0, V13.0.88", syms)
    be = CubinBackend(toolchain="nvrtc 12.6")
    kernel_set(be, cache)
    assert be.builds == [] and be.loads == [other], "a cross-compiled cubin serves another toolchain"
    ours = cache.store(fake_cubin(87, syms), src, opts, 87, "nvrtc 12.6", syms)
    kernel_set(be, cache)
    assert be.loads[-1] == ours != other
    assert [e.cubin for e in cache.find(src, opts, 87, "nvrtc 12.6", syms)] == [ours, other]
    assert list(cache.find(src, opts, 72, "nvrtc 12.6", syms)) == [], "another arch's lookup finds nothing"


def test_a_cubin_the_driver_refuses_is_discarded_and_rebuilt(cache):
    src, syms = module_source(KEYS), sorted(k.symbol for k in KEYS)
    newer = cache.store(fake_cubin(87, syms), src, nvrtc_options(87), 87, "nvcc: release 99.0", syms)
    be = CubinBackend(refuse={newer.name})
    kernel_set(be, cache)
    assert be.loads[0] == newer and len(be.builds) == 1 and not newer.exists()
    assert any("the driver refused it (CUDA_ERROR_INVALID_IMAGE" in n for n in cache.notes)


def test_unwritable_cache_still_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(KernelSet, "_cache", {})
    blocker = tmp_path / "file"
    blocker.write_text("")
    be = CubinBackend()
    kernel_set(be, cubins.CubinCache(blocker / "sub"))
    assert len(be.builds) == 1 and len(be.loads) == 1 and not be.loads[0].exists()


def test_backends_without_cubins_compile_their_own_way(cache):
    be = FakeBackend()
    kernel_set(be, cache)
    assert len(be.compiled) == 1
    assert not cache.root.exists() or not list(cache.root.iterdir())


# ---- the CuPy seam over a fake CuPy ---------------------------------------------------------------------------------
def test_cupy_seam_builds_and_loads_cubins(tmp_path):
    nv = FakeNvrtc()
    be = fake_cupy_backend(nv)
    assert be.toolchain() == "nvrtc 12.6"
    cubin = be.compile_cubin(module_source(KEYS), "seed-unet.cu", nvrtc_options(87), 87)
    assert cubins.elf_arch(cubin) == 87 and nv.destroyed == 1
    assert [o for o in nv.calls[0] if "arch" in o] == ["--gpu-architecture=sm_87"], "the target named once"
    path = tmp_path / "m.cubin"
    path.write_bytes(cubin)
    mod = be.load_cubin(path, [k.symbol for k in KEYS])
    assert mod.get("final_conv_f32").symbol == "final_conv_f32"
    with pytest.raises(KernelCompileError, match="named symbol not found"):
        mod.get("nope")
    assert fake_cupy_backend(FakeNvrtc(archs=(75, 80))).compile_cubin("x", "s.cu", (), 90) is None, \
        "a GPU newer than this NVRTC: CuPy's own compile path (PTX) instead"


def test_nvrtc_errors_carry_the_log_and_unsupported_arch_says_so():
    with pytest.raises(compilers.ArchUnsupported, match=r"nvrtc 12.6 cannot target sm_72 \(it builds sm_75..sm_90\)"):
        compilers.nvrtc_cubin("x", "s.cu", ("-std=c++17",), 72, FakeNvrtc())
    nv = FakeNvrtc(fail=True)
    with pytest.raises(KernelCompileError) as ei:
        compilers.nvrtc_cubin("x", "s.cu", ("-std=c++17",), 87, nv)
    assert 'identifier "x" is undefined' in ei.value.log and nv.destroyed == 1


def test_nvcc_driver_over_a_fake_nvcc(tmp_path):
    nvcc = write_fake_nvcc(tmp_path, fake_cubin(87, ["k"]))
    assert compilers.nvcc_toolchain(str(nvcc)) == "nvcc: Cuda compilation tools, release 12.6, V12.6.68"
    assert compilers.nvcc_archs(str(nvcc)) == (75, 87)
    cubin = compilers.nvcc_cubin("src", "seed-unet.cu", nvrtc_options(87), 87, str(nvcc))
    assert cubin == fake_cubin(87, ["k"])
    args = (tmp_path / "args").read_text().split()
    assert args[:2] == ["-cubin", "-arch=sm_87"] and "-std=c++17" in args and f"-I{kernels_dir()}" in args
    with pytest.raises(compilers.ArchUnsupported, match="cannot target sm_72"):
        compilers.nvcc_cubin("src", "seed-unet.cu", nvrtc_options(72), 72, str(nvcc))



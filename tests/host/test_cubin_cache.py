"""CPU checks of the cubin cache: the key, the validation of an entry (a corrupt, foreign-arch or
mismatched cubin is deleted and rebuilt, never loaded), the any-toolchain lookup, the loader's order
(cache, then the backend's compiler, then the backend's own compile_source), the CuPy backend's module
paths over a fake CuPy, and the NVRTC / nvcc drivers over fakes. One cache for both backends: the
loader builds with a `Compiler` (jetson_unet.build.compilers) and the backend only loads. No GPU
needed; `prepare` is in test_aot_prepare.py."""
from __future__ import annotations

import dataclasses
import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.cubin_fakes import (CubinBackend, FakeNvrtc, cupy_nvrtc, fake_compiler, fake_cubin,
                         fake_cupy_backend, hide_nvcc, write_fake_nvcc)
from tests.helpers.fakes import FakeBackend

from jetson_unet.paths import kernels_dir
from jetson_unet.errors import KernelCompileError
from jetson_unet.build import compilers
from jetson_unet.build import cache as cubins
from jetson_unet import logs
from jetson_unet.build.loader import KernelSet, compile_notice, load_module, shard
from jetson_unet.ops.keys import SimpleKey
from jetson_unet.build.sources import module_source, nvrtc_options

KEYS = [SimpleKey("dwconv", "fp16", 7), SimpleKey("final", "fp32", 3), SimpleKey("init", "fp16", 3)]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(KernelSet, "_cache", {})
    c = cubins.CubinCache(tmp_path / "cubins")
    with logs.captured() as c.notes:
        yield c


@pytest.fixture
def builds():
    """What the fake compiler built: (arch, source name) per build."""
    return []


@pytest.fixture
def nvrtc(builds):
    """The loader's compiler in these tests: a fake NVRTC Compiler (toolchain "nvrtc 12.6")."""
    return fake_compiler(builds)


def kernel_set(be, cache, compiler=None, keys=KEYS):
    KernelSet._cache.clear()        # a new process, as far as the in-memory modules go
    return KernelSet(be, keys, cache=cache, compiler=compiler)


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


# ---- the loader: cache first, the compiler second; bad entries deleted and rebuilt --------------------------------
def test_first_run_compiles_and_stores_second_run_only_loads(cache, nvrtc, builds):
    be = CubinBackend()
    ks = kernel_set(be, cache, nvrtc)
    assert builds == [(87, "seed-unet.cu")] and len(be.loads) == 1 and be.compiled == []
    assert cache.notes == [compile_notice(87)]
    [cub] = list(cache.root.glob("*.cubin"))
    meta = json.loads(cub.with_suffix(".json").read_text())
    assert meta["arch"] == 87 and meta["toolchain"] == "nvrtc 12.6" and meta["options"] == ["-std=c++17"]
    assert meta["cubin_sha256"] == cubins.sha256(cub.read_bytes())
    assert meta["source_sha256"] == cubins.sha256(ks.source.encode()) and meta["symbols"] == ks.symbols
    kernel_set(be, cache, nvrtc)
    assert len(builds) == 1 and be.loads == [cub, cub] and len(cache.notes) == 1


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
def test_bad_cubin_is_detected_deleted_and_rebuilt(cache, nvrtc, builds, how):
    be = CubinBackend()
    kernel_set(be, cache, nvrtc)
    [cub] = list(cache.root.glob("*.cubin"))
    BREAK[how](cub, cub.with_suffix(".json"))
    kernel_set(be, cache, nvrtc)                         # load_cubin asserts it never sees a bad file
    assert len(builds) == 2, "rebuilt"
    assert any(n.startswith("discarded cached kernels") for n in cache.notes), cache.notes
    assert be.loads[-1] == cub and cubins.check_cubin(cub.read_bytes(), 87, kernel_set(be, cache, nvrtc).symbols) is None
    assert len(builds) == 2, "and the rebuilt entry serves the next run"


def test_another_toolchains_cubin_is_used_and_ours_preferred(cache, nvrtc, builds):
    src = module_source(KEYS)
    syms = sorted(k.symbol for k in KEYS)
    opts = nvrtc_options(87)
    other = cache.store(fake_cubin(87, syms), src, opts, 87, "nvcc: release 13.0, V13.0.88", syms)
    be = CubinBackend()
    kernel_set(be, cache, nvrtc)                         # nvrtc 12.6
    assert builds == [] and be.loads == [other], "a cross-compiled cubin serves another toolchain"
    ours = cache.store(fake_cubin(87, syms), src, opts, 87, "nvrtc 12.6", syms)
    kernel_set(be, cache, nvrtc)
    assert be.loads[-1] == ours != other
    assert [e.cubin for e in cache.find(src, opts, 87, "nvrtc 12.6", syms)] == [ours, other]
    assert list(cache.find(src, opts, 72, "nvrtc 12.6", syms)) == [], "another arch's lookup finds nothing"


def test_other_toolchains_come_newest_version_first(cache):
    """Among other toolchains' entries the newest toolchain version comes first, whichever was stored
    last; no toolchain given: no entry is preferred."""
    src, syms, opts = module_source(KEYS), sorted(k.symbol for k in KEYS), nvrtc_options(87)
    stored = [cache.store(fake_cubin(87, syms), src, opts, 87, tc, syms)
              for tc in ("nvrtc 13.0", "nvcc: release 12.6, V12.6.68", "nvrtc 11.8", "nvrtc 12.10")]
    want = [stored[0], stored[3], stored[1], stored[2]]
    assert [e.cubin for e in cache.find(src, opts, 87, "nvrtc 12.2", syms)] == want
    assert [e.cubin for e in cache.find(src, opts, 87, None, syms)] == want
    assert [e.cubin for e in cache.find(src, opts, 87, "nvrtc 11.8", syms)] == [stored[2]] + want[:3]
    assert cubins.toolchain_version("nvcc: release 13.0, V13.0.88") == (13, 0) and cubins.toolchain_version("x") == ()


def test_one_cache_for_both_backends(cache, builds):
    """A cubin nvcc built for the pycuda backend serves a CuPy-like backend, and the other way round:
    the toolchain is part of the key, the backend is not."""
    nvcc = fake_compiler(builds, toolchain="nvcc: release 12.6, V12.6.68", kind="nvcc")
    first = CubinBackend()
    kernel_set(first, cache, nvcc)
    [cub] = list(cache.root.glob("*.cubin"))
    second = CubinBackend()
    kernel_set(second, cache, fake_compiler(builds))     # nvrtc 12.6: none of its own, nvcc's serves
    assert len(builds) == 1 and first.loads == second.loads == [cub]


def test_a_cubin_the_driver_refuses_is_discarded_and_rebuilt(cache, nvrtc, builds):
    src, syms = module_source(KEYS), sorted(k.symbol for k in KEYS)
    newer = cache.store(fake_cubin(87, syms), src, nvrtc_options(87), 87, "nvcc: release 99.0", syms)
    be = CubinBackend(refuse={newer.name})
    kernel_set(be, cache, nvrtc)
    assert be.loads[0] == newer and len(builds) == 1 and not newer.exists()
    assert any("the driver refused it (CUDA_ERROR_INVALID_IMAGE" in n for n in cache.notes)


def test_unwritable_cache_still_loads(tmp_path, monkeypatch, nvrtc, builds):
    monkeypatch.setattr(KernelSet, "_cache", {})
    blocker = tmp_path / "file"
    blocker.write_text("")
    be = CubinBackend()
    kernel_set(be, cubins.CubinCache(blocker / "sub"), nvrtc)
    assert len(builds) == 1 and len(be.loads) == 1 and not be.loads[0].exists()


def test_backends_without_cubins_compile_their_own_way(cache, nvrtc, builds):
    be = FakeBackend()                                   # compiler None
    kernel_set(be, cache, nvrtc)
    assert len(be.compiled) == 1 and builds == [], "a compiler handed in is not used"
    assert not cache.root.exists() or not list(cache.root.iterdir())


def test_an_arch_the_compiler_cannot_target_goes_through_compile_source(cache):
    """A GPU newer than this NVRTC: no cubin can be built here, so the backend's own compile path
    (CuPy: RawModule(code=...), PTX the driver finishes) serves, after the compile notice."""
    nv = FakeNvrtc(archs=(75, 80))
    be = CubinBackend(arch=90)
    kernel_set(be, cache, compilers.nvrtc_compiler(nv))
    assert nv.calls == [] and be.loads == [] and len(be.compiled) == 1
    assert cache.notes == [compile_notice(90)]
    assert not cache.root.exists() or not list(cache.root.iterdir())


# ---- the loader's default compiler: the backend's `compiler` ---------------------------------------------------------
def test_an_nvrtc_backend_builds_with_cupys_nvrtc_binding(cache, monkeypatch):
    nv = cupy_nvrtc(monkeypatch)                         # what `cupy.cuda.nvrtc` is, as far as compilers go
    comp = compilers.runtime_compiler("nvrtc")
    assert (comp.kind, comp.toolchain) == ("nvrtc", "nvrtc 12.6")
    be = CubinBackend()
    kernel_set(be, cache)                                # no compiler handed in
    assert len(nv.calls) == 1 and "--gpu-architecture=sm_87" in nv.calls[0] and len(be.loads) == 1
    [entry] = list(cache.find(module_source(KEYS), nvrtc_options(87), 87, "nvrtc 12.6"))
    assert be.loads == [entry.cubin] and entry.toolchain == "nvrtc 12.6"


def test_without_cupys_nvrtc_the_cache_still_serves(cache, monkeypatch, nvrtc):
    def no_cupy(mod=None):
        raise ImportError("No module named 'cupy'")
    monkeypatch.setattr(compilers, "nvrtc_module", no_cupy)
    assert compilers.runtime_compiler("nvrtc") is None
    kernel_set(CubinBackend(), cache, nvrtc)             # built elsewhere (or by --prepare)
    be = CubinBackend()
    kernel_set(be, cache)
    assert len(be.loads) == 1 and be.compiled == [], "any toolchain's cubin loads without a compiler"
    cache_miss = CubinBackend()
    kernel_set(cache_miss, cache, keys=KEYS[:1])
    assert cache_miss.loads == [] and len(cache_miss.compiled) == 1, "else the backend's compile_source"


def test_an_nvrtc_binding_without_cubin_output_is_no_compiler(monkeypatch):
    class OldNvrtc(FakeNvrtc):
        def __getattribute__(self, name):
            if name == "getCUBIN":
                raise AttributeError(name)
            return super().__getattribute__(name)
    cupy_nvrtc(monkeypatch, OldNvrtc())
    assert compilers.runtime_compiler("nvrtc") is None


def test_an_nvcc_backend_builds_with_the_nvcc_found(tmp_path, monkeypatch):
    nvcc = write_fake_nvcc(tmp_path, b"")
    monkeypatch.setenv("PATH", str(tmp_path))
    comp = compilers.runtime_compiler("nvcc")
    assert (comp.kind, comp.toolchain) == ("nvcc", "nvcc: Cuda compilation tools, release 12.6, V12.6.68")
    assert comp.build is not None and nvcc.exists()
    hide_nvcc(monkeypatch, tmp_path)
    assert compilers.runtime_compiler("nvcc") is None and compilers.runtime_compiler(None) is None


# ---- the CuPy backend over a fake CuPy: it loads what the NVRTC compiler builds ---------------------------------------
def test_cupy_backend_loads_the_cubins_nvrtc_builds(tmp_path):
    nv = FakeNvrtc()
    comp = compilers.nvrtc_compiler(nv)                  # what runtime_compiler("nvrtc") makes of cupy.cuda.nvrtc
    assert (comp.kind, comp.toolchain) == ("nvrtc", "nvrtc 12.6") and comp.targets(87)
    cubin = comp.build(module_source(KEYS), "seed-unet.cu", nvrtc_options(87), 87)
    assert cubins.elf_arch(cubin) == 87 and nv.destroyed == 1
    assert [o for o in nv.calls[0] if "arch" in o] == ["--gpu-architecture=sm_87"], "the target named once"
    be = fake_cupy_backend()
    assert be.compiler == "nvrtc" and not hasattr(be, "compile_cubin") and not hasattr(be, "toolchain")
    path = tmp_path / "m.cubin"
    path.write_bytes(cubin)
    mod = be.load_cubin(path, [k.symbol for k in KEYS])
    assert mod.get("final_conv3_f32").symbol == "final_conv3_f32"
    with pytest.raises(KernelCompileError, match="named symbol not found"):
        mod.get("nope")
    cache, syms = cubins.CubinCache(tmp_path / "cache"), sorted(k.symbol for k in KEYS)
    via = load_module(be, module_source(KEYS), "seed-unet", nvrtc_options(87), syms, 87, cache, comp)
    assert len(nv.calls) == 2 and via.path == str(next(cache.root.glob("*.cubin")))


def test_cupy_backend_compiles_its_own_way_for_a_gpu_newer_than_its_nvrtc(tmp_path):
    """A GPU newer than this NVRTC: no cubin here; CuPy's own compile path (RawModule(code=...),
    PTX that the driver finishes) instead."""
    nv = FakeNvrtc(archs=(75, 80))
    assert not compilers.nvrtc_compiler(nv).targets(90)
    be, src, syms = fake_cupy_backend(), module_source(KEYS), sorted(k.symbol for k in KEYS)
    cache = cubins.CubinCache(tmp_path)
    mod = load_module(be, src, "seed-unet", nvrtc_options(90), syms, 90, cache, compilers.nvrtc_compiler(nv))
    assert mod.path is None and mod.options == nvrtc_options(90) and mod._mod.code == src
    assert nv.calls == [] and not list(tmp_path.iterdir())
    assert mod.get("final_conv3_f32").symbol == "final_conv3_f32"


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




# ---- shards: jetson-tune's candidate kernels in several modules, compiled side by side ------------------
def _meeting_compiler(builds, parties, kind="nvrtc"):
    """A fake compiler whose builds each wait until `parties` of them run at once: one after the other,
    the barrier breaks (a threading.BrokenBarrierError)."""
    meet = threading.Barrier(parties, timeout=10)
    inner = fake_compiler(builds, kind=kind)

    def build(src, name, options, arch):
        meet.wait()
        return inner.build(src, name, options, arch)
    return dataclasses.replace(inner, build=build)


def test_shards_compile_side_by_side_and_the_next_run_only_loads(cache, builds):
    be = CubinBackend()
    KernelSet._cache.clear()
    ks = KernelSet(be, KEYS, cache=cache, compiler=_meeting_compiler(builds, len(KEYS)), shards=len(KEYS))
    assert len(builds) == len(KEYS) and len(list(cache.root.glob("*.cubin"))) == len(KEYS)
    assert sorted(ks.functions) == sorted(k.symbol for k in KEYS) and cache.notes == [compile_notice(87)]
    KernelSet._cache.clear()
    KernelSet(be, KEYS, cache=cache, compiler=fake_compiler(builds), shards=len(KEYS))
    assert len(builds) == len(KEYS) and len(be.loads) == 2 * len(KEYS)


def test_shards_with_nvcc_build_one_after_the_other_in_the_main_thread(cache, builds):
    threads = []
    inner = fake_compiler(builds, kind="nvcc")

    def build(src, name, options, arch):
        threads.append(threading.current_thread() is threading.main_thread())
        return inner.build(src, name, options, arch)
    KernelSet._cache.clear()
    KernelSet(CubinBackend(), KEYS, cache=cache, compiler=dataclasses.replace(inner, build=build), shards=2)
    assert threads == [True, True]


@pytest.mark.parametrize("n, sizes", [(1, [3]), (2, [1, 2]), (3, [1, 1, 1]), (8, [1, 1, 1])])
def test_shard_splits_the_sorted_keys_in_contiguous_groups(n, sizes):
    groups = shard(list(reversed(KEYS)), n)
    assert [len(g) for g in groups] == sizes
    assert [k.symbol for g in groups for k in g] == sorted(k.symbol for k in KEYS)

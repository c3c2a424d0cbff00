"""The cubins shipped with the package (runtime/cubins/, built by `python -m tools.build_kernels`): every
module that tools.build_kernels plans is there and valid, and no other file; the module a run asks
for on each GPU of each shipped arch (SM counts of real boards and cards, batch 1 to 64) is one of
them; a run loads it and compiles nothing; a shipped entry that fails validation or that the driver
refuses is skipped, never deleted, and the kernels compile. No GPU needed."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

from tests.helpers.cubin_fakes import CubinBackend, cupy_nvrtc, fake_compiler, fake_cubin
from tests.helpers.fakes import own_module_cache  # noqa: F401  (fixture: an empty KernelSet cache per test)

from jetson_unet import logs
from jetson_unet.build import loader
from jetson_unet.build.cache import CubinCache
from jetson_unet.build.loader import load_module
from jetson_unet.build.sources import module_source, nvrtc_options
from jetson_unet.errors import UsageError
from jetson_unet.executor.executor import GpuExecutor
from jetson_unet.model.arena import view_layout
from jetson_unet.model.plan import CAT, build_plan
from jetson_unet.model.weights import load_weights
from jetson_unet.ops.common import Ctx
from jetson_unet.ops.keys import SimpleKey
from jetson_unet.ops.specs import all_tile_keys, op_key
from jetson_unet.ops.policy import KernelPolicy, run_context
from jetson_unet.ops.tuning import FILE_NAME, tile_files
from jetson_unet.paths import shipped_cubins_dir, shipped_tiles_dir
from jetson_unet.pipeline import default_weights_path
from tools import build_kernels

REBUILD = "rebuild them: `python -m tools.build_kernels --nvrtc DIR --nvrtc-for 90=DIR --nvrtc-for 90=DIR` (its docstring)"
# SM counts of the GPUs of each shipped arch (boards, cards, H100 slices), beyond tools.build_kernels.SHIP_SMS
GPU_SMS = {72: (6, 8), 75: (40, 46, 68, 72), 80: (56, 108), 86: (28, 46, 68, 82, 84), 87: (4, 6, 8, 14, 16),
           89: (24, 58, 76, 128, 142), 90: (8, 16, 66, 114, 132)}
BATCHES = (1, 3, 16, 64)


@pytest.fixture(scope="module")
def weights():
    return load_weights(default_weights_path())


@pytest.fixture(scope="module")
def planned(weights):
    return build_kernels.plan(weights)


def test_every_planned_module_is_shipped_and_nothing_else(planned, capsys):
    """The dry run lists every module as present and no stale file, the same way each time."""
    lines = []
    assert build_kernels.listing(planned, shipped_cubins_dir(), lines.append) == (0, 0), \
        f"the shipped cubins are not those of today's kernels and tiles: {REBUILD}\n" + "\n".join(lines)
    assert build_kernels.main(["--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines() == lines, "the build plan is not reproducible"


def test_each_arch_ships_its_toolchains_cubins(planned):
    """Every arch ships NVRTC 11.8's cubins but sm_90, which ships 12.2's and 13.0's
    (tools.build_kernels.SHIP_NVRTC): 11.8's and 12.2's in ELF ABI version 7, the layout CUDA 11 and
    12 drivers read, 13.0's in version 8, which only CUDA 13 drivers read."""
    cache = CubinCache(shipped_cubins_dir(), read_only=True)
    assert build_kernels.SHIP_NVRTC[90] == ("nvrtc 12.2", "nvrtc 13.0")
    for m in planned:
        for toolchain in build_kernels.SHIP_NVRTC[m.arch]:
            e = build_kernels.entry(m, cache, toolchain)
            assert e is not None, (m.label, toolchain, REBUILD)
            assert e.cubin.read_bytes()[8] == (8 if toolchain == "nvrtc 13.0" else 7), (m.label, toolchain)


def test_the_build_refuses_another_toolchain_before_building(monkeypatch, capsys):
    """An NVRTC of another version than SHIP_NVRTC's for some arch: exit 2, one line, nothing built."""
    monkeypatch.setattr(build_kernels.aot, "pick_compiler", lambda *a, **k: fake_compiler([], "nvrtc 13.0"))
    monkeypatch.setattr(build_kernels, "build", lambda *a, **k: pytest.fail("built"))
    assert build_kernels.main(["--nvrtc", "/x"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sm_72 ships cubins of nvrtc 11.8" in err and "nvrtc 13.0" in err


@pytest.mark.parametrize("item", ["90", "91=/x", "x=/y", "=/y"])
def test_nvrtc_for_names_a_shipped_arch(item):
    with pytest.raises(UsageError, match="--nvrtc-for"):
        build_kernels.libraries(None, [item])


def test_nvrtc_for_overrides_one_arch():
    libs = build_kernels.libraries("/old", ["90=/new"])
    assert libs[90] == ["/new"] and all(v == ["/old"] for a, v in libs.items() if a != 90)
    assert build_kernels.libraries(None, ["90=/a", "90=/b"])[90] == ["/a", "/b"]


def test_sm90_needs_both_of_its_toolchains(monkeypatch):
    """sm_90 builds with 12.2's and 13.0's NVRTC; one of them alone is refused, naming both. (Fake
    compilers: the library /x/nvrtc-V is "nvrtc V".)"""
    monkeypatch.setattr(build_kernels.aot, "pick_compiler", lambda *a, library=None, **k: fake_compiler(
        [], f"nvrtc {library.rsplit('-', 1)[1]}" if library else "nvrtc 11.8"))
    both = build_kernels.libraries("/x/nvrtc-11.8", ["90=/x/nvrtc-12.2", "90=/x/nvrtc-13.0"])
    build_kernels.check_toolchains(both, [72, 87, 90])
    with pytest.raises(UsageError, match=r"sm_90 ships cubins of nvrtc 12\.2 and nvrtc 13\.0.* with nvrtc 12\.2:"):
        build_kernels.check_toolchains(build_kernels.libraries(None, ["90=/x/nvrtc-12.2"]), [90])


def test_every_gpu_and_batch_asks_for_a_shipped_module(weights, planned):
    """For each SM count and precision: the keys of every batch fall inside the module's grid keys, so
    the run's module is the grid's (batch-independent), and that module is shipped for each arch."""
    plan = build_plan(weights.config)
    views = view_layout(plan)
    ops = [op for op in plan.ops if op.kind != CAT]

    @functools.lru_cache(maxsize=None)
    def grid(precision, tuned_sms):   # the grid keys do not depend on the SM count, tuning files do
        ctx = Ctx(plan, weights.params, precision, 1, tuned_sms or 1, views)
        return frozenset(all_tile_keys(ctx, tile_files(weights.config, tuned_sms, precision, (shipped_tiles_dir(),))))

    def source(precision, sms):
        tuned = tile_files(weights.config, sms, precision, (shipped_tiles_dir(),))
        keys = grid(precision, sms if tuned else 0)
        for b in BATCHES:
            own = {op_key(op, Ctx(plan, weights.params, precision, b, sms, views)) for op in ops}
            assert own <= keys, f"{precision} batch {b} on {sms} SMs: {sorted(k.symbol for k in own - keys)}"
        return module_source(keys)

    shipped = {(m.arch, m.precision, m.source) for m in planned}
    for arch, counts in GPU_SMS.items():
        for precision in build_kernels.SHIP_PRECISIONS if arch >= 80 else ("fp32",):
            for sms in counts:
                assert (arch, precision, source(precision, sms)) in shipped, (arch, precision, sms)


def test_every_batch_a_shipped_tuning_file_serves_stays_in_its_module(weights):
    """A batch without a file of its own that runs a neighbouring batch's shipped file (at that
    batch's rules: Ctx.tile_batch), or a file of another SM count of its GPU (an Orin Nano 4GB or an
    AGX Orin, the 8-SM files: at that count's rules and in its module), asks for no kernel outside
    the module it loads."""
    plan = build_plan(weights.config)
    ops = [op for op in plan.ops if op.kind != CAT]
    shipped = shipped_tiles_dir()
    names = [FILE_NAME.fullmatch(p.name) for p in shipped.glob("tiles-*-fp16-b*.json")]
    devices = {(m["device"], int(m["sms"])) for m in names} | {("orin", sms) for sms in GPU_SMS[87]}
    policy = KernelPolicy(tile_dirs=[shipped])
    served = set()
    for device, sms in sorted(devices):
        for b in (1, 2, 3, 5, 8, 12, 16, 24, 32, 48, 64, 128):
            ctx, source, tile_batch, tile_sms, tuned = run_context(weights, plan, "fp16", b, device, sms, policy)
            if source is None:
                continue
            own = {op_key(op, ctx) for op in ops}
            missing = own - set(all_tile_keys(ctx, tuned))
            assert not missing, f"{device} ({sms} SMs) batch {b}: {sorted(k.symbol for k in missing)}"
            served.add((tile_batch is not None, tile_sms is not None))
    assert served == {(False, False), (True, False), (True, True)}


H100 = "tiles-nvidia-h100-80gb-hbm3-132sm-fp16-b{}.json"
ORIN = "tiles-orin-8sm-fp16-b{}.json"


@pytest.mark.parametrize("arch, sms, device, runs", [
    # batch 1 and 16 with their own tuning files, 2 with the built-in tiles
    (90, 132, "NVIDIA H100 80GB HBM3", {1: (H100.format(1), None, None), 2: (None, None, None),
                                        16: (H100.format(16), None, None)}),
    # an Orin Nano 8GB: its batch-1 and batch-16 files, the batch-4 file standing in at 3
    (87, 8, "Orin", {1: (ORIN.format(1), None, None), 3: (ORIN.format(4), 4, None), 16: (ORIN.format(16), None, None)}),
    # an Orin Nano 4GB: the 8-SM files at twice the batch, in the 8-SM module
    (87, 4, "Orin", {1: (ORIN.format(2), 2, 8), 2: (ORIN.format(4), 4, 8), 8: (ORIN.format(16), 16, 8)}),
])
def test_a_run_loads_the_shipped_module_and_compiles_nothing(weights, tmp_path, monkeypatch, arch, sms, device, runs):
    """Three batch sizes, each the tiles it should take, and one shipped module for all of them."""
    monkeypatch.setenv("JETSON_UNET_CACHE", str(tmp_path))
    monkeypatch.setenv("JETSON_UNET_TILES", str(tmp_path / "no-user-tiles"))   # the shipped tuning files only
    nv = cupy_nvrtc(monkeypatch)
    be = CubinBackend(arch=arch)
    be._sms, be.device_name = sms, lambda: device
    took = {}
    for batch in runs:   # one module, kept in memory for every batch
        with GpuExecutor(weights, "fp16", batch=batch, backend=be) as ex:
            took[batch] = (ex.tiles_from and Path(ex.tiles_from).name, ex.tile_batch, ex.tile_sms)
    assert took == runs
    assert nv.calls == [] and be.compiled == [] and len(be.loads) == 1, REBUILD
    assert be.loads[0].parent == shipped_cubins_dir() and not list(tmp_path.rglob("*.cubin"))


KEYS = [SimpleKey("dwconv", "fp16", 7), SimpleKey("final", "fp32", 3)]
SOURCE, OPTIONS = module_source(KEYS), nvrtc_options(87)
SYMBOLS = sorted(k.symbol for k in KEYS)


def _shipped(folder, data=None):
    """A read-only folder holding one entry of SOURCE for sm_87 (its bytes replaced by `data`)."""
    path = CubinCache(folder).store(fake_cubin(87, SYMBOLS), SOURCE, OPTIONS, 87, "nvrtc 11.8", SYMBOLS)
    if data is not None:
        path.write_bytes(data)
    return CubinCache(folder, read_only=True), path


def _load(be, shipped, cache, builds):
    return load_module(be, SOURCE, "seed-unet", OPTIONS, SYMBOLS, 87, cache=cache, compiler=fake_compiler(builds),
                       shipped=shipped)


@pytest.mark.parametrize("driver", ["CUDA 13", "CUDA 12"])
def test_the_newest_shipped_toolchain_the_driver_loads_serves(tmp_path, driver):
    """A shipped module in two toolchains' cubins: the newest toolchain's first (even where this
    machine's compiler is the older one); a driver that refuses it (ELF ABI 8 under CUDA 12) gets
    the older one, and nothing compiles."""
    shipped, old = _shipped(tmp_path / "shipped")                          # nvrtc 11.8, ABI 7
    new = CubinCache(old.parent).store(fake_cubin(87, SYMBOLS, abi=8), SOURCE, OPTIONS, 87, "nvrtc 13.0", SYMBOLS)
    be = CubinBackend(refuse={new.name} if driver == "CUDA 12" else ())
    builds = []
    with logs.captured() as notes:
        load_module(be, SOURCE, "seed-unet", OPTIONS, SYMBOLS, 87, cache=CubinCache(tmp_path / "cache"),
                    compiler=fake_compiler(builds, "nvrtc 11.8"), shipped=shipped)
    assert builds == [] and loader.LOADS[-1][0] == "shipped"
    assert be.loads == ([new] if driver == "CUDA 13" else [new, old])
    assert driver == "CUDA 13" or any(n.startswith(f"skipped the shipped kernels {new.name}") for n in notes)


def test_the_shipped_entry_comes_before_the_cache(tmp_path):
    shipped, path = _shipped(tmp_path / "shipped")
    cache, builds, be = CubinCache(tmp_path / "cache"), [], CubinBackend()
    cache.store(fake_cubin(87, SYMBOLS), SOURCE, OPTIONS, 87, "nvrtc 12.6", SYMBOLS)
    _load(be, shipped, cache, builds)
    assert be.loads == [path] and builds == [] and loader.LOADS[-1][0] == "shipped"


@pytest.mark.parametrize("how", ["corrupt", "refused"])
def test_a_bad_shipped_entry_is_skipped_not_deleted(tmp_path, how):
    good = fake_cubin(87, SYMBOLS)
    shipped, path = _shipped(tmp_path / "shipped", good[:-3] if how == "corrupt" else None)
    before = sorted(p.name for p in path.parent.iterdir())
    cache, builds = CubinCache(tmp_path / "cache"), []
    be = CubinBackend(refuse={path.name} if how == "refused" else ())
    with logs.captured() as notes:
        _load(be, shipped, cache, builds)
    assert builds == [(87, "seed-unet.cu")] and be.loads[-1].parent == cache.root
    assert sorted(p.name for p in path.parent.iterdir()) == before
    assert any(n.startswith(f"skipped the shipped kernels {path.name}") for n in notes), notes
    assert loader.LOADS[-1][0] == "compiled"


def test_prepare_skips_what_is_shipped(weights, tmp_path, planned):
    from jetson_unet.build import aot
    lines, builds = [], []
    t = aot.Target(90, (132,), "sm_90")
    assert aot.prepare(weights, [t], ["fp16"], [1], fake_compiler(builds), CubinCache(tmp_path), lines.append) == 0
    assert builds == [] and lines[-1].startswith("sm_90 fp16 (132 SMs") and "shipped with the package" in lines[-1]


def test_the_shipped_folder_is_package_data():
    import jetson_unet.cubins
    assert Path(jetson_unet.cubins.__file__).parent == shipped_cubins_dir()
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '"jetson_unet.cubins" = ["*.cubin", "*.json"]' in text and '"jetson_unet.cubins"]' in text

"""The whole U-Net on the GPU against the float64 reference (batch 1 and 3, and the first samples of
a batch of 16), and CUDA-graph replay of one call; the cp.async conv against the register-staged one
at batch 16 (the 128-row tiles that batch 1 and 3 do not pick on a large GPU)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers.gpu import gemm_tiles, pipelined_symbols, replayed_eps, report
from jetson_unet.paths import models_dir, shipped_tiles_dir
from jetson_unet.model.config import UNetConfig
from jetson_unet.executor.executor import GpuExecutor
from jetson_unet.model.arena import view_layout
from jetson_unet.ops.common import Ctx
from jetson_unet.ops.policy import KernelPolicy
from jetson_unet.ops.tuning import builtin_tiles, file_name
from jetson_unet.model.plan import build_plan
from jetson_unet.model.reference import Reference
from jetson_unet.model.weights import load_weights, random_params

# Relative L2 error of eps vs float64 over a whole call (~40 layers deep): fp32 arithmetic stays far
# below 1e-4; fp16/bf16 storage of every activation (u = 4.9e-4 / 3.9e-3) accumulates to < 1e-2.
UNET_TOL = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 1e-2}


class W:
    def __init__(self, cfg: UNetConfig, seed: int) -> None:
        self.config, self.params = cfg, random_params(cfg, seed)


@pytest.fixture(scope="module")
def case():
    path = models_dir() / "seed-unet-emoji64.safetensors"
    weights = load_weights(path) if path.is_file() else W(UNetConfig(), seed=5)
    cfg = weights.config
    rng = np.random.default_rng(123)
    x = rng.standard_normal((3, cfg.channels, cfg.image_size, cfg.image_size)).astype(np.float32)
    t = np.array([0, 47, cfg.timesteps - 1])
    want = Reference(weights, np.float64).eps(x, t)
    return weights, x, t, want, ("shipped" if path.is_file() else "random")


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("batch", [1, 3])
def test_unet_matches_float64_reference(backend, case, precision, batch):
    weights, x, t, want, kind = case
    with GpuExecutor(weights, precision, batch=batch, backend=backend) as ex:
        piped = pipelined_symbols(ex)
        got = ex.eps(x[:batch], t[:batch])
        again = ex.eps(x[:batch], t[:batch])
        rep = ex.arena_report()
    assert bool(piped) == (precision != "fp32"), piped   # fp32 runs conv_gemm (FFMA)
    assert got.shape == want[:batch].shape and got.dtype == np.float32
    assert np.isfinite(got).all()
    err = float(np.linalg.norm(got - want[:batch]) / np.linalg.norm(want[:batch]))
    report(f"unet {kind} {precision} b{batch}: rel L2 {err:.2e}; "
           f"launches {ex.launches_per_call}; {rep['text']}")
    assert np.array_equal(got, again), "two calls on the same input differ: a race"
    assert err < UNET_TOL[precision]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_batch_16_matches_reference_on_its_first_samples(backend, case, precision):
    """Batch 16 picks kernels that batch 1 and 3 do not on a large GPU (the 16-wide init_conv tile,
    ops.init_tw; the 8-wide depthwise tile; the measured batch-16 tiles): its first three samples
    are the reference case's, held to the float64 reference (the other 13 are random)."""
    weights, x, t, want, kind = case
    cfg = weights.config
    rng = np.random.default_rng(17)
    x16 = np.concatenate([x, rng.standard_normal((13,) + x.shape[1:]).astype(np.float32)])
    t16 = np.concatenate([t, (np.arange(13) * 7) % cfg.timesteps])
    with GpuExecutor(weights, precision, batch=16, backend=backend) as ex:
        inits = sorted(L.fn.symbol for L in ex.launches if L.fn.symbol.startswith("init"))
        got = ex.eps(x16, t16)[:3]
    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    report(f"unet {kind} {precision} b16 (first 3 samples): rel L2 {err:.2e}; {inits}")
    assert np.isfinite(got).all() and err < UNET_TOL[precision]


def _with_random_samples(x, t, batch: int, timesteps: int):
    """x, t grown to `batch` samples: the reference case's three first, random ones after."""
    if batch <= 3:
        return x[:batch], t[:batch]
    rng = np.random.default_rng(18)
    x = np.concatenate([x, rng.standard_normal((batch - 3,) + x.shape[1:]).astype(np.float32)])
    return x, np.concatenate([t, (np.arange(batch - 3) * 11) % timesteps])


@pytest.mark.gpu
@pytest.mark.parametrize("sms,batch", [(8, 1), (4, 1), (0, 16), (0, 64)],
                         ids=["orin-8sm-b1", "orin-4sm-b1", "builtin-b16", "builtin-b64"])
def test_builtin_tiles_match_reference(backend, case, sms, batch):
    """The built-in tiles an untuned GPU runs, which the GPU tests above do not reach on a tuned one:
    those an Orin of 8 or 4 SMs picks at batch 1 (halo convs, split gates and split-K where its
    grids are deep), and this GPU's own at batch 16 and 64 (at 64 the 8x8 level's tiles are capped at
    its 64 rows; their first three samples are the reference case's)."""
    weights, x, t, want, kind = case
    cfg = weights.config
    x, t = _with_random_samples(x, t, batch, cfg.timesteps)
    plan = build_plan(cfg)
    tiles = builtin_tiles(Ctx(plan, weights.params, "fp16", batch, sms, view_layout(plan))) if sms else {}
    with GpuExecutor(weights, "fp16", batch=batch, backend=backend, policy=KernelPolicy(tiles=tiles)) as ex:
        kinds = sorted({L.fn.symbol.split("_")[0] + ("_h" if "_h" in L.fn.symbol else "") for L in ex.launches})
        got = ex.eps(x[:batch], t[:batch])[:3]
    n = min(batch, 3)
    err = float(np.linalg.norm(got - want[:n]) / np.linalg.norm(want[:n]))
    report(f"unet {kind} fp16 b{batch} built-in tiles of {sms or 'this GPU'} SMs: "
           f"rel L2 {err:.2e}; {kinds}")
    assert np.isfinite(got).all() and err < UNET_TOL["fp16"]


@pytest.mark.gpu
@pytest.mark.parametrize("path", sorted(shipped_tiles_dir().glob("tiles-*-fp16-b*.json")), ids=lambda p: p.stem)
def test_shipped_tuning_files_match_reference(backend, case, path):
    """Every shipped fp16 tuning file's tiles (those of other GPUs and SM counts too: a tile's result
    does not depend on the GPU it runs on), at the file's batch, on this whole GPU: the first three
    samples against the float64 reference."""
    weights, x, t, want, kind = case
    meta = json.loads(path.read_text())
    batch, sms = meta["batch"], meta["sms"]
    x, t = _with_random_samples(x, t, batch, weights.config.timesteps)
    with GpuExecutor(weights, "fp16", batch=batch, backend=backend,
                     policy=KernelPolicy(tiles=str(path), sms=sms)) as ex:
        assert ex.tiles_from == str(path)
        got = ex.eps(x, t)[:3]
    n = min(batch, 3)
    err = float(np.linalg.norm(got - want[:n]) / np.linalg.norm(want[:n]))
    report(f"unet {kind} fp16 b{batch} tiles of {path.name}: rel L2 {err:.2e}")
    assert np.isfinite(got).all() and err < UNET_TOL["fp16"]


@pytest.mark.gpu
@pytest.mark.parametrize("name, batch, sms", [("tiles-nvidia-h200-8sm-fp16-b4.json", 2, 8),
                                              ("tiles-nvidia-h200-8sm-fp16-b4.json", 8, 8),
                                              ("tiles-nvidia-h200-132sm-fp16-b64.json", 32, 132),
                                              ("tiles-nvidia-h200-8sm-fp16-b4.json", 2, 4)])
def test_a_neighbouring_batchs_tuning_file_matches_reference(backend, case, tmp_path, name, batch, sms):
    """A batch without a tuning file of its own runs its neighbour's as measured (every rule at the
    file's batch, ops.tuning.find_tiles), and a GPU of an SM count without files another SM count's
    (at that count's rules too: an Orin Nano 4GB at batch 2 runs the 8-SM batch-4 file): the shipped
    file, under this GPU's name, on this whole GPU, the first three samples against the float64 reference."""
    weights, x, t, want, kind = case
    meta = json.loads((shipped_tiles_dir() / name).read_text())
    meta["device"] = backend.device_name()
    (tmp_path / file_name(meta["device"], meta["sms"], "fp16", meta["batch"])).write_text(json.dumps(meta))
    x, t = _with_random_samples(x, t, batch, weights.config.timesteps)
    with GpuExecutor(weights, "fp16", batch=batch, backend=backend,
                     policy=KernelPolicy(tile_dirs=[tmp_path], sms=sms)) as ex:
        assert ex.tile_batch == meta["batch"] != batch
        assert ex.tile_sms == (None if sms == meta["sms"] else meta["sms"])
        got = ex.eps(x, t)[:3]
    n = min(batch, 3)
    err = float(np.linalg.norm(got - want[:n]) / np.linalg.norm(want[:n]))
    report(f"unet {kind} fp16 b{batch} on {sms} SMs, tiles of {name} (batch {meta['batch']}): rel L2 {err:.2e}")
    assert np.isfinite(got).all() and err < UNET_TOL["fp16"]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16"])
def test_graph_replay_equals_direct_run(backend, case, precision):
    weights, x, t, want, _ = case
    with GpuExecutor(weights, precision, batch=3, backend=backend) as ex:
        direct = ex.eps(x, t)
        replay = replayed_eps(ex, backend, direct)
    assert np.array_equal(direct, replay)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_pipelined_conv_matches_conv_gemm_at_batch_16(backend, case, precision):
    """Batch 16 picks the large tiles (128x64, 64x128) that the reference cases above may not reach;
    the float64 reference is too slow there, so the cp.async conv is held to conv_gemm (the 16-bit
    register-staged kernel, forced by tiles with no stages: its odd-shape role, on every op)."""
    weights = case[0]
    cfg = weights.config
    rng = np.random.default_rng(16)
    x = rng.standard_normal((16, cfg.channels, cfg.image_size, cfg.image_size)).astype(np.float32)
    t = (np.arange(16) * 7) % cfg.timesteps
    with GpuExecutor(weights, precision, batch=16, backend=backend) as ex:
        piped = pipelined_symbols(ex)
        got = ex.eps(x, t)
        again = ex.eps(x, t)
    with GpuExecutor(weights, precision, batch=16, backend=backend, policy=KernelPolicy(tiles=gemm_tiles(ex))) as ex:
        assert not pipelined_symbols(ex)
        want = ex.eps(x, t)
    assert piped and np.isfinite(got).all()
    assert np.array_equal(got, again), "two calls on the same input differ: a race"
    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    report(f"unet b16 {precision} cp.async vs conv_gemm: rel L2 {err:.2e}; cp.async tiles "
           f"{sorted(set(s.split('_', 2)[2] for s in piped))}")
    assert err < UNET_TOL[precision]



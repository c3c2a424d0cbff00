"""The tile variants the tuner may pick beyond the built-in kernels, on the GPU: the halo conv
(kernels/conv_halo.cu), the k-sliced cp.async conv (kernels/conv_pipe.cu, ConvKey.ks), the
cp.async conv whose ring lives in dynamic smem (jetson_unet.ops.conv_pipe.deep_ring) and its sub-pixel
up2 convs (jetson_unet.ops.conv.subpixel). Every op each
can run, with every such tile the tuner (`jetson-tune`) would time (jetson_unet.ops.tuning.candidates)
and with split-K, against the float64 reference op by op (test_gpu_ops.check_all_ops: teacher
forcing, NaN-poisoned outputs); then a whole batch-16 call with those tiles wherever they apply
against the default kernels."""
from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.gpu import report
from jetson_unet.model.config import UNetConfig
from jetson_unet.executor.executor import GpuExecutor
from jetson_unet.ops.policy import KernelPolicy
from tests.gpu.test_gpu_ops import OP_TOL, W, check_all_ops
from tests.gpu.test_gpu_unet import UNET_TOL
from tests.helpers.tile_rounds import KINDS, halo_rounds, halo_symbols


@pytest.mark.gpu
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_every_halo_or_sliced_tile_matches_reference(backend, precision, kind):
    weights = W(UNetConfig(), seed=7)
    sms = backend.sm_count()
    rounds, keys = halo_rounds(weights, precision, 2, sms, kind)
    l2_tol, max_tol = OP_TOL[precision]
    bad, worst, ran = [], (0.0, ""), 0
    for tiles in rounds:
        with GpuExecutor(weights, precision, batch=2, backend=backend, policy=KernelPolicy(tiles=tiles),
                         extra_keys=keys) as ex:
            syms = halo_symbols(ex, kind, tiles)
            assert len(syms) == len(tiles), (len(syms), len(tiles))
            for name, sym, l2, mx in check_all_ops(ex, weights, seed=21):
                if name not in tiles:
                    continue
                ran += 1
                worst = max(worst, (l2, f"{name} [{sym}]"))
                if not (l2 < l2_tol and mx < max_tol):
                    bad.append(f"{name} [{sym} split {tiles[name].splits}] l2={l2:.1e} max={mx:.1e}")
    report(f"{kind} ops b2 {precision}: {ran} op x tile runs over {len(rounds)} rounds, worst l2 {worst[0]:.2e} "
           f"at {worst[1]}; {len(bad)} bad: " + "; ".join(bad[:8]))
    assert ran and not bad, bad[:5]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_halo_or_sliced_unet_at_batch_16_matches_default_kernels(backend, weights, precision, kind):
    cfg = weights.config
    rng = np.random.default_rng(16)
    x = rng.standard_normal((16, cfg.channels, cfg.image_size, cfg.image_size)).astype(np.float32)
    t = (np.arange(16) * 7) % cfg.timesteps
    sms = backend.sm_count()
    rounds, keys = halo_rounds(weights, precision, 16, sms, kind)
    with GpuExecutor(weights, precision, batch=16, backend=backend, policy=KernelPolicy(tiles=rounds[0]),
                     extra_keys=keys) as ex:
        n_halo = len(halo_symbols(ex, kind))
        got = ex.eps(x, t)
        again = ex.eps(x, t)
    with GpuExecutor(weights, precision, batch=16, backend=backend, policy=KernelPolicy(tiles="builtin")) as ex:
        want = ex.eps(x, t)
    assert n_halo and np.isfinite(got).all()
    assert np.array_equal(got, again), "two calls on the same input differ: a race"
    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    report(f"unet b16 {precision}: {n_halo} {kind} launches vs the built-in tiles: rel L2 {err:.2e}")
    assert err < UNET_TOL[precision]

"""The GPU suite through the pycuda backend (`--backend pycuda`), and pycuda beside CuPy in one process.

The whole-U-Net and per-op tests are the CuPy suite's own functions, collected again here: this
module's `backend` fixture (pycuda) overrides tests/gpu/conftest.py's (CuPy) for them. Sampling runs
with graphs=False (pycuda has no capture API). Skipped when pycuda, its driver or nvcc is missing
(nvcc builds pycuda's cubins into the cubin cache both backends share; the backend only loads them).

KernelSet keeps loaded modules for the whole process, keyed by (backend, source, options); each
backend's modules are also kept in a dict of their own here (`kernels_of`), so that the CuPy suite's
stay reusable across this module's tests.
"""
from __future__ import annotations

import contextlib
import gc
import threading
import warnings
from typing import Any, Dict

import numpy as np
import pytest

from tests.gpu import test_gpu_ops as ops_suite
from tests.gpu import test_gpu_unet as unet_suite
from tests.helpers.gpu import report
from jetson_unet.errors import BackendUnavailable
from jetson_unet.build import compilers
from jetson_unet.executor.executor import GpuExecutor
from jetson_unet.build.loader import KernelSet
from jetson_unet.sampling.gpu import GpuSampler
from jetson_unet.model.reference import Reference
from jetson_unet.model.schedule import make_steps, sample_loop
from jetson_unet.ops.policy import KernelPolicy

_CACHES: Dict[str, Dict[Any, Any]] = {"cupy": KernelSet._cache}   # the CuPy suite's modules stay reusable
RUN_TOL_FP32 = 1e-3     # as test_gpu_sampling: x_0 vs the NumPy loop after a whole run
# pycuda (nvcc) vs CuPy (NVRTC) on the same source: the same SASS gives identical images; another
# compiler build may contract or order a few FMAs differently (fp32 ~1e-7 per op), which the
# fp16 activations round away or carry as the gpu/cpu mode difference does (test_gpu_sampling).
CROSS_TOL = 1e-4


@contextlib.contextmanager
def kernels_of(be: Any):
    saved = KernelSet._cache
    KernelSet._cache = _CACHES.setdefault(be.name, {})
    try:
        yield
    finally:
        KernelSet._cache = saved


@pytest.fixture(scope="module")
def backend() -> Any:
    try:
        from jetson_unet.backends import get_backend
        be = get_backend("pycuda")
    except (BackendUnavailable, ImportError) as e:
        pytest.skip(f"pycuda backend not usable: {e}")
    if compilers.find_nvcc() is None:
        pytest.skip("no nvcc to build the pycuda backend's cubins")
    return be


@pytest.fixture(autouse=True)
def pycuda_kernel_cache(request):
    with contextlib.ExitStack() as stack:
        if "backend" in request.fixturenames:
            stack.enter_context(kernels_of(request.getfixturevalue("backend")))
        yield


@pytest.fixture(scope="module")
def cupy_backend() -> Any:
    try:
        from jetson_unet.backends import get_backend
        return get_backend("cupy")
    except (BackendUnavailable, ImportError) as e:
        pytest.skip(f"CuPy not usable, nothing to compare with: {e}")


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# ---- the CuPy suite's tests, through pycuda --------------------------------------------------------
case = unet_suite.case
test_pycuda_unet_matches_float64_reference = unet_suite.test_unet_matches_float64_reference


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_pycuda_every_op_odd_b3(backend, precision):
    """Spot check of every kernel on odd channel counts (the full matrix runs in the CuPy suite)."""
    cfg, batch = ops_suite.ODD, 3
    weights = ops_suite.W(cfg, seed=batch)
    with GpuExecutor(weights, precision, batch=batch, backend=backend) as ex:
        errors = ops_suite.check_all_ops(ex, weights, seed=10 + batch)
    l2_tol, max_tol = ops_suite.OP_TOL[precision]
    bad = [e for e in errors if not (e[2] < l2_tol and e[3] < max_tol)]
    worst = max(errors, key=lambda e: e[2])
    report(f"pycuda ops odd b{batch} {precision}: worst l2 {worst[2]:.2e} at {worst[0]} ({worst[1]}); {len(bad)} bad")
    assert not bad, f"{len(bad)} ops off (first: {bad[:5]})"


# ---- backend primitives --------------------------------------------------------------------------------
@pytest.mark.gpu
def test_pycuda_copies_and_events(backend):
    rng = np.random.default_rng(1)
    n = 1 << 20
    src = backend.pinned((n,), np.float32)
    src[...] = rng.standard_normal(n, dtype=np.float32)
    out = backend.pinned((n,), np.float32)
    out[...] = np.nan
    a, b = backend.alloc(4 * n), backend.alloc(8 * n)
    s = backend.stream()
    e0, e1 = backend.event(), backend.event()
    e0.record(s)
    backend.h2d(a.ptr, src, s)
    backend.d2h(out, a.ptr, s)
    e1.record(s)
    e1.synchronize()
    s.synchronize()
    assert e1.done() and e0.elapsed_ms(e1) >= 0.0
    assert np.array_equal(out, src)
    free, total = backend.mem_info()
    assert 0 < free <= total and backend.sm_count() >= 1 and backend.arch() >= 50
    a.free()
    b.free()
    b.free()   # twice is fine


@pytest.mark.gpu
def test_pycuda_capture_says_use_no_graphs(backend):
    s = backend.stream()
    with pytest.raises(BackendUnavailable, match="graphs=False"):
        backend.capture_begin(s)
    assert backend.supports_graphs is False


@pytest.mark.gpu
def test_pycuda_worker_threads(backend, case):
    """Calls from threads other than the main one push and pop the context around each call (a
    thread that exited with the context pushed would abort the process), and what a worker thread
    drops is freed there, not leaked with pycuda's "out-of-thread context" warning."""
    weights, x, t, _, _ = case
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with GpuExecutor(weights, "fp16", batch=1, backend=backend) as ex:
            main = ex.eps(x[:1], t[:1])
            got: Dict[str, Any] = {}

            def work():
                try:
                    got["shared"] = ex.eps(x[:1], t[:1])
                    with GpuExecutor(weights, "fp16", batch=1, backend=backend) as own:
                        got["own"] = own.eps(x[:1], t[:1])
                    del own
                    gc.collect()
                except BaseException as e:   # surfaced below, in the main thread
                    got["error"] = e

            th = threading.Thread(target=work)
            th.start()
            th.join()
        gc.collect()
    assert "error" not in got, got.get("error")
    leaked = [str(w.message) for w in caught if "out-of-thread" in str(w.message)]
    assert not leaked, leaked
    assert np.array_equal(got["shared"], main) and np.array_equal(got["own"], main)


# ---- sampling (graphs=False), and equality with the CuPy backend ------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["cpu", "gpu"])
def test_pycuda_sampling_matches_reference_loop(backend, weights, mode):
    steps = make_steps(weights.config.schedule, "ddim", 6, eta=1.0)
    shape = (3, 3, weights.config.image_size, weights.config.image_size)
    want = sample_loop(Reference(weights, np.float32).eps, shape, steps, seeds=11)
    s = GpuSampler(weights, "fp32", 3, mode=mode, graphs=False, backend=backend)
    try:
        got = s.run(steps, seeds=11)
    finally:
        s.close()
    err = rel(got, want)
    report(f"pycuda sampling {mode} fp32 b3 ddim6 eta1 vs numpy loop: rel L2 {err:.2e}")
    assert got.shape == want.shape and np.isfinite(got).all()
    assert err < RUN_TOL_FP32


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["cpu", "gpu"])
def test_pycuda_equals_cupy_in_one_process(backend, cupy_backend, weights, mode):
    """Both backends' samplers alive at once (memory, streams, modules of each), runs interleaved."""
    steps = make_steps(weights.config.schedule, "ddim", 10, eta=1.0)
    samplers: Dict[str, GpuSampler] = {}
    out = {}
    try:
        for be in (cupy_backend, backend):
            with kernels_of(be):
                samplers[be.name] = GpuSampler(weights, "fp16", 2, mode=mode, graphs=False, backend=be)
        for again in ("", " again"):
            for name, s in samplers.items():
                out[name + again] = s.run(steps, seeds=7)
    finally:
        for s in samplers.values():
            s.close()
    err = rel(out["pycuda"], out["cupy"])
    same = bool(np.array_equal(out["pycuda"], out["cupy"]))
    report(f"pycuda vs cupy sampling {mode} fp16 b2 ddim10 eta1: rel L2 {err:.2e}, bitwise equal {same}")
    assert np.array_equal(out["pycuda"], out["pycuda again"])
    assert np.array_equal(out["cupy"], out["cupy again"])
    assert err < CROSS_TOL


@pytest.mark.gpu
def test_pycuda_halo_conv_equals_cupy(backend, cupy_backend, weights):
    """The halo conv needs more dynamic smem than the default 48 KB: pycuda's opt-in (a function
    attribute) must be set before its launches. A batch-16 call with halo tiles wherever they apply,
    through both backends."""
    from tests.helpers.tile_rounds import halo_rounds, halo_symbols
    cfg = weights.config
    rng = np.random.default_rng(16)
    x = rng.standard_normal((16, cfg.channels, cfg.image_size, cfg.image_size)).astype(np.float32)
    t = (np.arange(16) * 7) % cfg.timesteps
    tiles = halo_rounds(weights, "fp16", 16, cupy_backend.sm_count())[0][0]
    out, n_halo = {}, {}
    for be in (cupy_backend, backend):
        with kernels_of(be), GpuExecutor(weights, "fp16", batch=16, backend=be, policy=KernelPolicy(tiles=tiles)) as ex:
            n_halo[be.name] = len(halo_symbols(ex))
            out[be.name] = ex.eps(x, t)
    err = rel(out["pycuda"], out["cupy"])
    report(f"pycuda vs cupy halo conv fp16 b16 ({n_halo['pycuda']} halo launches): rel L2 {err:.2e}")
    assert n_halo["pycuda"] == n_halo["cupy"] > 0 and np.isfinite(out["pycuda"]).all()
    assert err < CROSS_TOL

"""The CPU path's memory guard (jetson_unet.sampling.host): the estimate from the model config
against what a sampling call measurably holds (tracemalloc), the refusal before any work with the
largest batch that fits (API, jetson-sample), and where the available memory is read from."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from jetson_unet import cli
from jetson_unet.errors import ArenaError
from jetson_unet.model.config import UNetConfig
from jetson_unet.model.schedule import make_steps, sample_loop, to_uint8
from jetson_unet.model.weights import Weights, load_weights
from jetson_unet.pipeline import Pipeline, default_weights_path
from jetson_unet.sampling import host
from jetson_unet.sampling.host import (PYTHON_BYTES, available_bytes, check_host_fits, fixed_bytes, host_bytes,
                                       image_bytes)

SLACK = 1.5   # the estimate may exceed what is measured by this factor at most (it must never be below)
DTYPES = {"fp32": np.float32, "fp64": np.float64}


@pytest.fixture(scope="module")
def shipped() -> Weights:
    path = default_weights_path()
    if not path.is_file():
        pytest.skip("no shipped model")
    return load_weights(path)


def traced_peak(fn) -> int:
    """Peak bytes allocated (NumPy's arrays included) while fn() runs."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("which,precision", [("tiny", "fp32"), ("tiny", "fp64"), ("odd", "fp32"), ("shipped", "fp32")])
def test_estimate_covers_a_measured_call(request, which, precision):
    """A fresh pipeline's first call (the parameter cast included) at batch 1 and 2, with real U-Net
    passes (one DDIM step: the loop's own arrays are measured below): the formula's bytes cover the
    measured peak, within SLACK of it (plus its fixed 1 MB of Python objects, which dominate a tiny
    config)."""
    import scipy.special  # noqa: F401  (imported by the first GELU: not the sampler's memory)
    weights = request.getfixturevalue({"tiny": "tiny_weights", "odd": "odd_weights", "shipped": "shipped"}[which])
    for batch in (1, 2):
        with Pipeline(weights, backend="numpy", precision=precision) as pipe:   # fresh: nothing cast yet
            measured = traced_peak(lambda: pipe.sample(batch=batch, steps=1, sampler="ddim"))
        est = host_bytes(weights, DTYPES[precision], batch)
        assert measured <= est <= SLACK * measured + PYTHON_BYTES, (batch, measured, est)


def reference_like_eps(dtype):
    """Allocates as jetson_unet.model.reference.Reference.eps does: the batch cast to its dtype, then
    image by image, the outputs concatenated (the U-Net itself: the fixed part, measured above)."""
    def eps(x, t):
        x = np.asarray(x, dtype=dtype)
        return np.concatenate([x[i:i + 1] * 0.5 for i in range(len(x))])
    return eps


@pytest.mark.parametrize("precision", ["fp32", "fp64"])
def test_per_image_bytes_cover_the_sampling_loop(precision):
    """What each image adds (the slope between batch 16 and 48, the shipped model's 64x64 images), in
    every sampler: never above the per-image figure, and the worst sampler within SLACK of it."""
    c, dtype = UNetConfig(), DTYPES[precision]
    slopes = {}
    for sampler, n, eta in [("ddpm", None, 0.0), ("ddim", 3, 1.0), ("ddim", 3, 0.0), ("dpmpp-2m", 3, 0.0)]:
        steps = make_steps(c.schedule, sampler, n, eta)[:3]
        peak = {b: traced_peak(lambda: to_uint8(sample_loop(reference_like_eps(dtype), (b, 3, 64, 64), steps, 0)))
                for b in (16, 48)}
        slopes[sampler, eta] = (peak[48] - peak[16]) / 32
    per = image_bytes(c, dtype)
    assert max(slopes.values()) <= per <= SLACK * max(slopes.values()), (per, slopes)


def test_shipped_model_figures(shipped):
    """The figures the module's docstring quotes: ~0.79 MB per 64x64 image in fp32, ~105 MB fixed
    (one image's U-Net pass and the float16 file's parameters cast to float32)."""
    assert image_bytes(shipped.config, np.float32) == 64 * 64 * 3 * 64 + 1024
    assert 100e6 < fixed_bytes(shipped, np.float32) < 110e6


@pytest.mark.parametrize("free_gb", [0.05, 0.2, 1.0, 24.0])
def test_largest_batch_is_the_largest_that_fits(shipped, free_gb):
    free = int(free_gb * 1e9)
    with pytest.raises(ArenaError) as ei:
        check_host_fits(shipped, np.float32, 100000, available=free)
    msg = str(ei.value)
    fits = int(msg.rsplit(" ", 1)[1])
    assert "\n" not in msg and msg.startswith("batch 100000 needs about ")
    assert f"{free / 1e9:.1f} GB available: the largest batch that fits is {fits}" in msg
    assert fits == 0 or host_bytes(shipped, np.float32, fits) <= free
    assert host_bytes(shipped, np.float32, fits + 1) > free
    if fits:
        check_host_fits(shipped, np.float32, fits, available=free)   # and it is let through


def test_issue_case_batch_100000(shipped, monkeypatch):
    """`jetson-sample --batch 100000` on the CPU: refused at once on a 24 GB host, not a MemoryError
    after sampling began."""
    monkeypatch.setattr(host, "available_bytes", lambda: 24 * 10 ** 9)
    with pytest.raises(ArenaError, match=r"^batch 100000 needs about 78\.\d GB of host memory on the numpy backend "
                                         r"\(float32: .*\), 24\.0 GB available: the largest batch that fits is \d+$"):
        check_host_fits(shipped, np.float32, 100000)


@pytest.fixture
def no_sampling(monkeypatch):
    """Fails a test whose refused call still reached the sampling loop."""
    def refuse(*a, **k):
        raise AssertionError("sampling started")
    monkeypatch.setattr("jetson_unet.pipeline.sample_loop", refuse)


@pytest.mark.parametrize("precision", ["fp32", "fp64"])
def test_pipeline_refuses_before_sampling(tiny_weights, monkeypatch, precision):
    dtype = DTYPES[precision]
    monkeypatch.setattr(host, "available_bytes", lambda: host_bytes(tiny_weights, dtype, 10))
    with Pipeline(tiny_weights, backend="numpy", precision=precision) as pipe:
        assert pipe.sample(batch=10, steps=2).shape == (10, 16, 16, 3)
        monkeypatch.setattr("jetson_unet.pipeline.sample_loop", None)   # the refusals below never reach it
        for call in (lambda: pipe.sample(batch=11, steps=2), lambda: pipe.sample(seeds=list(range(11)), steps=2),
                     lambda: pipe.load(11)):
            with pytest.raises(ArenaError, match=r"^batch 11 needs .*: the largest batch that fits is 10$"):
                call()


def test_cli_refuses_with_one_line(tiny_weights_path, tmp_path, monkeypatch, capsys, no_sampling):
    """jetson-sample on the NumPy backend: one line, exit 1 (as the GPU path's refusal), no file."""
    monkeypatch.setattr(host, "available_bytes", lambda: 10 ** 9)
    out = tmp_path / "grid.png"
    rc = cli.main(["--weights", str(tiny_weights_path), "--backend", "numpy", "--batch", "100000", "--steps", "2",
                   "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    assert err[0].startswith("jetson-sample: error: batch 100000 needs about ") and "largest batch that fits is" in err[0]
    assert list(tmp_path.iterdir()) == []


def test_available_bytes_reads_memavailable(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24684092 kB\nMemFree:         1000000 kB\nMemAvailable:   24262540 kB\n")
    assert available_bytes(str(meminfo)) == 24262540 * 1024


def test_available_bytes_falls_back(tmp_path, monkeypatch, tiny_weights):
    """No /proc/meminfo (macOS): the free physical pages; neither: None, and the check lets it run."""
    missing = str(tmp_path / "none")
    monkeypatch.setattr(host.os, "sysconf", lambda name: {"SC_AVPHYS_PAGES": 1000, "SC_PAGE_SIZE": 4096}[name])
    assert available_bytes(missing) == 4096000

    def no_sysconf(name):
        raise ValueError(name)
    monkeypatch.setattr(host.os, "sysconf", no_sysconf)
    assert available_bytes(missing) is None
    monkeypatch.setattr(host, "available_bytes", lambda: None)
    check_host_fits(tiny_weights, np.float32, 10 ** 9)


def test_live_memavailable_is_sane():
    free = available_bytes()
    assert free is None or 0 < free < 1 << 50

"""--sms / sms= (an SM slice): refused where it cannot run, before any work, with one line."""
from __future__ import annotations

import sys
import types

import pytest

from jetson_unet import cli
from jetson_unet.bench import runner
from jetson_unet.errors import BackendUnavailable, UsageError
from jetson_unet.pipeline import Pipeline


def test_a_slice_needs_the_cupy_backend(tiny_weights):
    for backend in ("numpy", "pycuda"):
        with pytest.raises(UsageError, match="needs the cupy backend"):
            Pipeline(tiny_weights, backend=backend, sms=8)
    with pytest.raises(UsageError, match="sms must be >= 1"):
        Pipeline(tiny_weights, backend="cupy", sms=0)
    with pytest.raises(UsageError, match="sms must be an integer"):
        Pipeline(tiny_weights, backend="cupy", sms="8")


def test_get_backend_refuses_a_pycuda_slice():
    from jetson_unet.backends import get_backend
    with pytest.raises(BackendUnavailable, match="needs the cupy backend"):
        get_backend("pycuda", 8)


def test_auto_never_falls_back_to_numpy_when_a_slice_is_asked(tiny_weights, monkeypatch):
    """The user asked for a GPU regime: a missing GPU is an error, not a CPU run."""
    import jetson_unet.backends as backends

    def unavailable(name, sms=None):
        raise BackendUnavailable("no CUDA GPU found")
    monkeypatch.setattr(backends, "get_backend", unavailable)
    with pytest.raises(BackendUnavailable, match="no CUDA GPU"):
        Pipeline(tiny_weights, backend="auto", sms=8)
    with pytest.raises(BackendUnavailable, match="no CUDA GPU"):
        runner.resolve_backend("auto", 8)
    with pytest.raises(UsageError, match="--sms needs a GPU backend"):
        runner.resolve_backend("numpy", 8)


def test_without_driver_bindings_the_slice_says_what_to_install(monkeypatch):
    from jetson_unet.backends import greenctx
    for name in ("cuda", "cuda.bindings", "cuda.bindings.driver"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(BackendUnavailable, match="pip install cuda-python"):
        greenctx.SmSlice(8)


def test_an_old_driver_is_named(monkeypatch):
    from jetson_unet.backends import greenctx
    drv = types.SimpleNamespace(cuInit=lambda flags: (0,), cuDriverGetVersion=lambda: (0, 12020),
                                cuGetErrorName=lambda err: (0, b"X"))
    monkeypatch.setattr(greenctx, "_driver", lambda: drv)
    with pytest.raises(BackendUnavailable, match=r"CUDA 12.4\+ driver .* this driver is CUDA 12.2"):
        greenctx.SmSlice(8)


def test_sample_cli_slice_on_numpy_is_one_line(tiny_weights_path, tmp_path, capsys):
    code = cli.main(["--weights", str(tiny_weights_path), "--backend", "numpy", "--sms", "8",
                     "--out", str(tmp_path / "g.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "needs the cupy backend" in err[0], err
    assert not (tmp_path / "g.png").exists()

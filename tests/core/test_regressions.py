"""Regression tests for bugs found in runtime/ while writing the CPU suite (all fixed)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from jetson_unet.model.config import Schedule, UNetConfig
from jetson_unet.errors import ConfigError, UsageError, WeightsError, WeightsFileError, WeightsFormatError
from jetson_unet.model.schedule import make_steps
from jetson_unet.model.weights import MANIFEST_KEY, content_hash, load_weights, random_params

TINY = UNetConfig(image_size=16, dim=8, dim_mults=(1, 2), time_dim=32)


def _write(path, manifest, arrays):
    with open(path, "wb") as f:
        np.savez(f, **{MANIFEST_KEY: np.frombuffer(json.dumps(manifest).encode(), np.uint8)}, **arrays)
    return path


def _manifest(arrays, **override):
    m = {"format": "seed-unet-weights", "format_version": 1, "config": TINY.to_dict(),
         "param_dtype": "float32", "content_hash": content_hash(arrays)}
    m.update(override)
    return m


def test_npy_file_gives_weights_file_error(tmp_path, rng):
    """runtime/weights.py:121 `with np.load(...) as npz`: for a plain .npy file np.load returns an
    ndarray, which is no context manager, so a raw TypeError escapes instead of WeightsFileError
    (the CLI then shows a traceback instead of its one-line message)."""
    path = tmp_path / "weights.npz"
    with open(path, "wb") as f:
        np.save(f, rng.standard_normal(7).astype(np.float32))
    with pytest.raises(WeightsFileError):
        load_weights(path)


def test_make_steps_ddim_zero_steps_is_an_error():
    """runtime/schedule.py:96 `n_steps or schedule.timesteps`: --steps 0 is taken as "not given",
    so `--sampler ddim --steps 0` silently runs all T steps instead of raising UsageError (ddim_steps
    itself rejects 0). Fix: `schedule.timesteps if n_steps is None else n_steps`."""
    with pytest.raises(UsageError):
        make_steps(Schedule(), "ddim", 0)


def test_float_timesteps_rejected():
    """runtime/config.py:23 `int(self.timesteps) != self.timesteps` lets 100.0 through (it equals
    int 100); a weights manifest with "timesteps": 100.0 then loads fine and every sampler crashes
    later with TypeError in np.linspace / range. Fix: require isinstance(timesteps, int) (not bool)."""
    with pytest.raises(ConfigError):
        Schedule(timesteps=100.0)


def test_float_timesteps_in_manifest_rejected(tmp_path):
    """The same bug seen from a file: load_weights must refuse the config, not hand it out."""
    p = random_params(TINY, seed=1)
    cfg = TINY.to_dict()
    cfg["schedule"]["timesteps"] = 100.0
    path = _write(tmp_path / "w.npz", _manifest(p, config=cfg), p)
    with pytest.raises(WeightsFormatError):
        load_weights(path)


@pytest.mark.parametrize("version", [True])
def test_format_version_must_be_the_integer_1(tmp_path, version):
    """runtime/weights.py:151 `manifest.get("format_version") != FORMAT_VERSION`: JSON `true`
    compares equal to 1 in Python, so a manifest with "format_version": true is accepted (1.0 as
    well, which is more defensible). Low severity; fix: `type(v) is not int or v != FORMAT_VERSION`."""
    p = random_params(TINY, seed=1)
    path = _write(tmp_path / "w.npz", _manifest(p, format_version=version), p)
    with pytest.raises(WeightsError):
        load_weights(path)


def test_errors_survive_pickling_as_a_worker_process_sends_them():
    """tools/bench_unet.py runs each row in a fresh process: a kernel compile error there reached
    the parent as BrokenProcessPool ("__init__() missing 2 required positional arguments"),
    because errors whose __init__ takes other arguments than the message did not unpickle."""
    import pickle

    from jetson_unet.errors import KernelCompileError, WeightsShapeError
    from jetson_unet.build.nvrtc_lib import NVRTCError

    for e in (KernelCompileError("conv.cu", ("-std=c++17",), "m.cu(776): error: ..."),
              NVRTCError("/x/libnvrtc.so", "nvrtcCompileProgram", 6, "NVRTC_ERROR_COMPILATION"),
              WeightsShapeError("w.npz", "shape (3,) != (4,)", tensor="init_conv.weight"),
              UsageError("no op named x")):
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and str(back) == str(e) and vars(back) == vars(e)

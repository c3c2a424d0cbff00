"""Shared fixtures of the CPU suite: small configs, their random weights on disk, a seeded rng,
and the one comparison helper (shape, then dtype, then values, each failure labelled).

The configs are small on purpose: the whole CPU suite runs on a 2-core CI machine in < 60 s.
"""
from __future__ import annotations

import logging
import zlib
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from jetson_unet.model.config import UNetConfig
from jetson_unet.model.weights import Weights, load_weights, random_params, save_weights

# Two levels, every feature map >= 8x8: exercises unshuffle, up2, gates and both cat kinds.
TINY = UNetConfig(image_size=16, dim=8, dim_mults=(1, 2), time_dim=32)
# Odd channel counts (6, 12, 18; 4*6 = 24 after unshuffle; 3*18 hidden) and a 12 -> 6 -> 3 pyramid.
ODD = UNetConfig(image_size=12, dim=6, dim_mults=(1, 2, 3), time_dim=20)

BASE_SEED = 20240607


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """Seeded per test (from its node id): reproducible, yet every test sees other values."""
    seed = BASE_SEED ^ zlib.crc32(request.node.nodeid.encode())
    return np.random.Generator(np.random.PCG64(seed))


@pytest.fixture
def notes():
    """The package's log messages (info and up) during the test, one string each."""
    from jetson_unet import logs
    with logs.captured(level=logging.INFO) as lines:
        yield lines


@pytest.fixture(scope="session")
def tiny_config() -> UNetConfig:
    return TINY


@pytest.fixture(scope="session")
def odd_config() -> UNetConfig:
    return ODD


def _saved(factory: pytest.TempPathFactory, cfg: UNetConfig, name: str, seed: int) -> Path:
    path = factory.mktemp("weights") / name
    save_weights(path, cfg, random_params(cfg, seed=seed), dtype="float32")
    return path


@pytest.fixture(scope="session")
def tiny_weights_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random float32 weights of TINY, written once per session with `save_weights`."""
    return _saved(tmp_path_factory, TINY, "tiny.safetensors", seed=11)


@pytest.fixture(scope="session")
def tiny_weights(tiny_weights_path: Path) -> Weights:
    return load_weights(tiny_weights_path)


@pytest.fixture(scope="session")
def odd_weights_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _saved(tmp_path_factory, ODD, "odd.npz", seed=12)


@pytest.fixture(scope="session")
def odd_weights(odd_weights_path: Path) -> Weights:
    return load_weights(odd_weights_path)


@pytest.fixture(scope="session")
def ptxas87(tmp_path_factory: pytest.TempPathFactory):
    """The session's sm_87 ptxas reports (tests/helpers/sm87.py `Ptxas`): a kernel several checks
    look at compiles once. Skips without nvcc."""
    import shutil

    from tests.helpers.sm87 import Ptxas

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc")
    return Ptxas(nvcc, tmp_path_factory.mktemp("sm87"))


def _assert_close(label: str, actual: np.ndarray, expected: np.ndarray, dtype, *,
                  atol: float, rtol: float) -> None:
    """Shape, then dtype, then values: |a - e| <= atol + rtol |e| (llm.c style), listing mismatches."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{label}: shape {actual.shape} != expected {expected.shape}"
    assert actual.dtype == np.dtype(dtype), f"{label}: dtype {actual.dtype} != expected {np.dtype(dtype)}"
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    assert np.isfinite(a).all(), f"{label}: non-finite values in the result"
    err = np.abs(a - e)
    bad = err > atol + rtol * np.abs(e)
    if bad.any():
        idx = np.argwhere(bad)[:5]
        rows = "\n".join(f"  at {tuple(int(i) for i in ix)}: got {a[tuple(ix)]!r}, want {e[tuple(ix)]!r}"
                         for ix in idx)
        raise AssertionError(f"{label}: {int(bad.sum())} of {bad.size} values differ "
                             f"(max abs err {err.max():.3g}, atol {atol:g}, rtol {rtol:g}):\n{rows}")


@pytest.fixture(scope="session")
def assert_close() -> Callable[..., None]:
    """`assert_close(label, actual, expected, dtype, atol=..., rtol=...)`."""
    return _assert_close

"""GPU tests: skipped when no GPU is usable (the backend raises BackendUnavailable)."""
from __future__ import annotations

from typing import Any

import pytest

from jetson_unet.errors import BackendUnavailable


@pytest.fixture(scope="session")
def backend() -> Any:
    try:
        from jetson_unet.backends import get_backend
        return get_backend("cupy")
    except (BackendUnavailable, ImportError) as e:
        pytest.skip(f"no usable GPU: {e}")


@pytest.fixture(scope="module")
def weights() -> Any:
    """The shipped model, or random weights of the default config where it is absent."""
    from jetson_unet.paths import models_dir
    from jetson_unet.model.config import UNetConfig
    from jetson_unet.model.weights import Weights, load_weights, random_params
    path = models_dir() / "seed-unet-emoji64.safetensors"
    if path.is_file():
        return load_weights(path)
    cfg = UNetConfig()
    return Weights("random", cfg, random_params(cfg, 4), {"param_dtype": "float32"})

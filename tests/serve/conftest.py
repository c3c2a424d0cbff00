"""A tiny model with a 10-step schedule, so that every sampler (DDPM included) runs in a blink."""
from __future__ import annotations

import pytest

from jetson_unet.model.config import Schedule, UNetConfig
from jetson_unet.model.weights import random_params, save_weights
from jetson_unet.pipeline import Pipeline

SERVE_TINY = UNetConfig(image_size=16, dim=8, dim_mults=(1, 2), time_dim=32,
                        schedule=Schedule(timesteps=10, beta_end=0.005))


@pytest.fixture(scope="session")
def serve_weights(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("serve") / "tiny10.npz"
    save_weights(path, SERVE_TINY, random_params(SERVE_TINY, seed=5))
    return str(path)


@pytest.fixture(scope="session")
def pipe(serve_weights):
    with Pipeline(serve_weights, backend="numpy") as p:
        yield p

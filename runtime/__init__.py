"""jetson_unet: a torch-free diffusion U-Net inference runtime for NVIDIA Jetson.

What an application embeds is `jetson_unet.Pipeline` (load a model once, sample many times); the
command-line tools are `jetson-sample`, `jetson-weights`, `jetson-bench` and `jetson-tune`
(`python -m jetson_unet` lists them). docs/architecture.md walks through the layers.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Pipeline", "__version__"]


def __getattr__(name: str) -> Any:
    """`jetson_unet.Pipeline`, imported on first use (the CLIs and tools import less)."""
    if name == "Pipeline":
        from jetson_unet.pipeline import Pipeline
        return Pipeline
    raise AttributeError(f"module 'jetson_unet' has no attribute {name!r}")

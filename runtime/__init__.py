"""jetson_unet: a torch-free diffusion U-Net inference runtime for NVIDIA Jetson.

What an application embeds is `jetson_unet.Pipeline` (load a model once, sample many times); the
command-line tools are `jetson-sample`, `jetson-weights`, `jetson-bench` and `jetson-tune`
(`python -m jetson_unet` lists them). docs/architecture.md walks through the layers.
"""
from __future__ import annotations

__version__ = "0.1.0"

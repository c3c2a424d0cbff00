"""Torch-free diffusion U-Net inference runtime for NVIDIA Jetson.

The topology is `runtime.plan`; the CPU oracle `runtime.reference`; the GPU executor
`runtime.gpu`; what applications embed is `runtime.pipeline.Pipeline`.
"""
from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"


def models_dir() -> Path:
    """Folder of the shipped models: the package `runtime.models` when installed, else ./weights."""
    try:
        import runtime.models as models   # mapped onto weights/ by pyproject.toml
        return Path(models.__file__).parent
    except ImportError:
        return Path(__file__).resolve().parent.parent / "weights"


def kernels_dir() -> Path:
    """Folder of the CUDA sources: the package `runtime.kernels` when installed, else ./kernels."""
    try:
        import runtime.kernels as kernels
        return Path(kernels.__file__).parent
    except ImportError:
        return Path(__file__).resolve().parent.parent / "kernels"

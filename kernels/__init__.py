"""CUDA sources of the runtime (shipped as package data: runtime.kernels)."""

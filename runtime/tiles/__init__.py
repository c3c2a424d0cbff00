"""Measured tile files shipped with the runtime (runtime/gpu/tuning.py: find_tiles looks here last)."""

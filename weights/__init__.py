"""Shipped model files (package data: runtime.models)."""

"""Fakes and helpers shared by the test groups."""

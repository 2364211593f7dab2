"""Benchmarks (not installed): `python -m benchmarks.NAME` from the repository root."""

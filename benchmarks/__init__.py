"""Benchmarks and diagnostics (not installed): run from the repo root as `python -m benchmarks.NAME`."""

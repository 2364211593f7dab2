"""Benchmarks and diagnostics (not installed): run from the repository root as
`python -m benchmarks.NAME`."""

"""The translation server behind `serve.py`: an HTTP JSON API (Starlette on uvicorn) that
batches concurrent requests onto one model thread, and a page that shows a translation's
cross-attention (`server/static`). See docs/serving.md.

Modules: `options` (request keys -> `SearchConfig`, torch-free), `batcher` (dynamic batching on
the model thread), `app` (routes, limits, errors), `cli` (the `serve.py` flags and run).
"""

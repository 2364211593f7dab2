"""The translation server behind `serve.py`: an HTTP JSON API (Starlette on uvicorn) and
LibreTranslate's, for one or several models, each batching concurrent requests onto its own
model thread, and a page that shows a translation's cross-attention (`server/static`). See
docs/serving.md.

Modules (all torch-free but `cli`): `options` (request keys -> `SearchConfig`), `batcher`
(dynamic batching on a model thread), `languages` (a checkpoint's languages, for routing),
`html` (LibreTranslate's `format: html`), `keys` (API keys and rate caps), `metrics`
(Prometheus), `openapi` (the document), `app` (routes, routing, limits, errors), `cli` (the
`serve.py` flags, loading the models, the run).
"""

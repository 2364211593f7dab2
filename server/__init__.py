"""The translation server behind `serve.py`: an HTTP JSON API (Starlette on uvicorn) and
LibreTranslate's, for one or several models, each batching concurrent requests onto its own
model thread in a process of its own, and a page that shows a translation's cross-attention
(`server/static`). See docs/serving.md.

Modules (all torch-free): `options` (`SearchConfig`'s fields as typed request options),
`requests` (each request body as one type, built per deployment), `batcher` (dynamic
batching on a model thread), `worker` (a model's batcher in a process of its own),
`languages` (a checkpoint's languages, for routing), `html` (LibreTranslate's `format:
html`), `keys` (API keys and rate caps), `metrics` (Prometheus), `service` (the served models,
limits and routing), `handling` (what both APIs' handlers share: errors, bodies, keys, the
output budget, submitting), `libretranslate` (its API), `openapi` (the document, from the types), `app` (our
API, the other routes, `create_app`), `hosting` (what `serve.py` runs: the models' processes,
loading each model there, the app on uvicorn; not torch-free in the model processes). The
`serve.py` flags are `attnmt.cli.serve`'s.
"""

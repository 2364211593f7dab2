"""The HTTP API and the page: Starlette routes over one `Batcher` per served model.

Routes: `POST /translate` (two APIs on one route, told apart by the body: ours, a JSON object
with `sentences`, and LibreTranslate's, a JSON object or a form with `q`, in
`libretranslate`), `POST /attention`, LibreTranslate's `GET /languages`, `POST /detect`,
`GET /frontend/settings`, `POST /translate_file` and `GET /download_file/{name}`, `GET /models`,
`GET /info`, `GET /health`, `GET /metrics` (Prometheus), `GET /openapi.json`, `GET /` (the
page, from `server/static`).

Every error is JSON, `{"error": "<problem>; <fix>"}`. Our API: 400 malformed body, 413 over a
size limit, 422 unknown or invalid option (an unknown model or language pair, a glossary entry
that cannot be used included), 429 queue full; LibreTranslate's API answers LibreTranslate's codes (`libretranslate`). After a
failure of the model call (500) the server keeps serving. Torch-free: the handlers are
module-level functions that read the `Service` (`service`) from `request.app.state`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from attnmt.decoding.config import SearchConfig
from attnmt.server import libretranslate
from attnmt.server.batcher import Job
from attnmt.server.handling import (
    ClientGone,
    check_key,
    check_output_budget,
    count_route,
    error,
    job_glossary,
    off_loop,
    parse_json,
    read_bytes,
    service_of,
    submit,
)
from attnmt.server.metrics import Metrics, Middleware
from attnmt.server.openapi import openapi_document
from attnmt.server.options import OptionError, as_dict, option_names, with_options
from attnmt.server.requests import checked, request_types
from attnmt.server.service import RoutingError, ServedModel, Service
from attnmt.server.splitting import split_ours

STATIC = Path(__file__).resolve().parent / "static"

Handler = Callable[[Request], Any]


def create_app(service: Service, on_startup: Callable[[], None] | None = None) -> Any:
    """The ASGI app (Starlette inside the metrics middleware); its shutdown finishes every
    queued job of every model, then stops the model processes."""
    service.metrics = Metrics(
        {m.id: (lambda b=m.batcher: b.queued) for m in service.models},
        lambda: service.in_flight,
    )
    routes = [
        Route("/translate", counted(translate), methods=["POST"]),
        Route("/attention", counted(attention), methods=["POST"]),
        Route("/languages", libretranslate.languages, methods=["GET"]),
        Route("/detect", libretranslate.detect, methods=["POST"]),
        Route("/frontend/settings", libretranslate.frontend_settings, methods=["GET"]),
        Route("/translate_file", counted(libretranslate.translate_file), methods=["POST"]),
        Route(
            "/download_file/{name}",
            libretranslate.download_file,
            methods=["GET"],
            name="download_file",
        ),
        Route("/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/info", info, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/", page, methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    handlers = {HTTPException: _http_error, Exception: _server_error}
    lifespan = partial(_lifespan, on_startup=on_startup)
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
    app.state.service = service
    service.types = request_types(service)  # made once: the service does not change
    app.state.openapi = openapi_document(service, service.types)
    paths = {r.path for r in routes if isinstance(r, Route)}
    return Middleware(app, service.metrics, paths)


@asynccontextmanager
async def _lifespan(app: Starlette, on_startup: Callable[[], None] | None) -> AsyncIterator[None]:
    if on_startup is not None:
        on_startup()
    yield
    for model in app.state.service.models:
        await asyncio.to_thread(model.batcher.close)


def counted(handler: Handler) -> Handler:
    """`handler`, counted in the service's `in_flight` from the moment its headers are in."""

    async def run(request: Request) -> JSONResponse:
        service = service_of(request)
        service.in_flight += 1  # the event loop's thread only: no lock needed
        try:
            answer = await handler(request)
        except asyncio.CancelledError:  # uvicorn's --shutdown-timeout ran out: say so
            service.cancelled += 1
            message = "the server stopped before this request was complete; retry"
            return JSONResponse({"error": message}, 503)
        except ClientGone:  # its job was dropped; nobody reads this answer
            service.gone += 1
            return JSONResponse({"error": "the client closed the connection"}, 499)
        except BaseException:
            service.answered += 1  # an error answer
            raise
        else:
            service.answered += 1
            return answer
        finally:
            service.in_flight -= 1

    return run


async def translate(request: Request) -> JSONResponse:
    """`POST /translate`: LibreTranslate's for a form or a body with `q`, else ours."""
    service = service_of(request)
    limits = service.limits
    body, form = await libretranslate.read_body(request, limits)
    check_key(body, request, service)
    if form or "q" in body:
        return await libretranslate.translate(body, form, service, request)
    model, job, texts = await off_loop(_our_job, body, service)
    cfg = job.cfg
    count_route(service, model, "attnmt")
    hyps = await submit(model.batcher, job, request) if job.sentences else []
    if texts is not None:  # one translation per text, its sentences' scores summed
        hyps = texts.best(hyps)
    answer: dict[str, Any] = {
        "translations": [nbest[0][0] for nbest in hyps],
        "scores": [nbest[0][1] for nbest in hyps],
    }
    if cfg.nbest > 1:
        answer["nbest"] = [
            [{"translation": text, "score": score} for text, score in nbest] for nbest in hyps
        ]
    answer["options"] = as_dict(cfg)
    if len(service.models) > 1:
        answer["model"] = model.id
    return JSONResponse(answer)


def _our_job(body: dict[str, Any], service: Service) -> tuple[ServedModel, Job, Any]:
    """Our request's (model, job, split texts or None), every field and limit checked (on a
    worker thread: validating, splitting, tokenizing and glossary checks)."""
    limits = service.limits
    req = checked(service.types.ours, body, service.types, limits)
    split = bool(req.split_sentences)  # split: each line a paragraph, its breaks kept
    sentences = req.sentences if split else [_one_line(s) for s in req.sentences]
    prefixes = None if req.prefixes is None else [_one_line(p) for p in req.prefixes]
    if prefixes is not None and len(prefixes) != len(sentences):
        raise error(
            422,
            f"{len(prefixes)} prefixes for {len(sentences)} sentences; send one per "
            'sentence ("" for none)',
        )
    model, langs = _our_route(req, service)
    cfg = _options(req, service, model)
    texts = split_ours(sentences, prefixes, cfg.nbest, model, langs[0], limits) if split else None
    if texts is not None:
        sentences = texts.sentences
    check_output_budget(cfg, sentences, model, limits)
    glossary = job_glossary(req.glossary, model, cfg, sentences, prefixes, langs, 422)
    return model, Job(cfg, sentences, prefixes=prefixes, langs=langs, glossary=glossary), texts


async def attention(request: Request) -> JSONResponse:
    """`POST /attention`: one sentence's translation and cross-attention (the page's)."""
    service = service_of(request)
    limits = service.limits
    body = parse_json(await read_bytes(request, limits.max_body, limits.client_timeout))
    check_key(body, request, service)
    model, job = await off_loop(_attention_job, body, service)
    return JSONResponse(await submit(model.batcher, job, request))


def _attention_job(body: dict[str, Any], service: Service) -> tuple[ServedModel, Job]:
    req = checked(service.types.attention, body, service.types, service.limits)
    sentence = _one_line(req.sentence)
    model, langs = _our_route(req, service)
    cfg = _options(req, service, model)
    check_output_budget(cfg, [sentence], model, service.limits)
    _check_attention_size(cfg, sentence, model)
    return model, Job(cfg, [sentence], attention=True, langs=langs)


# The most weights `/attention` answers with: layers x heads x output budget x source tokens
# (about 8 bytes each in its JSON).
MAX_ATTENTION_VALUES = 2**20


def _check_attention_size(cfg: SearchConfig, sentence: str, model: ServedModel) -> None:
    shape = model.info.get("model") or {}
    layers, heads = shape.get("n_decoder_layers", 6), shape.get("n_heads", 8)
    source = model.count_tokens([sentence]) + 1  # with EOS
    output = int(cfg.max_len_a * (source - 1) + cfg.max_len_b) + 1
    values = layers * heads * output * source
    if values > MAX_ATTENTION_VALUES:
        raise error(
            413,
            f"the attention of this sentence may hold {values} weights ({layers} layers x "
            f"{heads} heads x {output} output x {source} source tokens), the limit is "
            f"{MAX_ATTENTION_VALUES}; send a shorter sentence or lower 'max_len_a'/'max_len_b'",
        )


async def health(request: Request) -> JSONResponse:
    service = service_of(request)
    return JSONResponse(
        {
            "status": "ok",
            "in_flight": service.in_flight,
            "queued": sum(m.batcher.queued for m in service.models),
            "answered": service.answered,
            "batches": sum(m.batcher.batches for m in service.models),
        }
    )


async def info(request: Request) -> JSONResponse:
    service = service_of(request)
    limits = service.limits._asdict()
    first = service.models[0].info
    entries = [_model_entry(m) for m in service.models]
    return JSONResponse(
        {**first, "options": as_dict(service.defaults), **limits, "models": entries}
    )


async def models(request: Request) -> JSONResponse:
    return JSONResponse({"models": [_model_entry(m) for m in service_of(request).models]})


async def metrics(request: Request) -> Response:
    found = service_of(request).metrics
    assert found is not None  # create_app sets it
    data, content_type = found.render()
    return Response(data, headers={"Content-Type": content_type})


async def openapi(request: Request) -> JSONResponse:
    return JSONResponse(request.app.state.openapi)


async def page(request: Request) -> FileResponse:
    return FileResponse(STATIC / "index.html")


def _model_entry(model: ServedModel) -> dict[str, Any]:
    return {
        "id": model.id,
        "source_languages": model.sources,
        "target_languages": model.targets,
        "multilingual": model.multilingual,
        **model.info,
    }


def _our_route(req: Any, service: Service) -> tuple[ServedModel, tuple[str | None, str | None]]:
    """Our API's routing fields: `model`, and `src_lang`/`tgt_lang` (or LibreTranslate's
    names `source`/`target`)."""
    for ours, theirs in (("src_lang", "source"), ("tgt_lang", "target")):
        mine, other = getattr(req, ours), getattr(req, theirs)
        if None not in (mine, other) and mine != other:
            raise error(422, f"{ours!r} and {theirs!r} differ; send one of them")
    src = req.src_lang if req.src_lang is not None else req.source
    tgt = req.tgt_lang if req.tgt_lang is not None else req.target
    try:
        return service.route(req.model, src, tgt)
    except RoutingError as e:
        raise error(422, str(e)) from None


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"error": exc.detail}, exc.status_code, headers=exc.headers)


async def _server_error(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"error": f"internal error: {type(exc).__name__}: {exc}"}, 500)


def _one_line(text: str) -> str:
    """What translate.py does with an argument: line breaks become spaces."""
    return " ".join(text.splitlines())


def _options(req: Any, service: Service, model: ServedModel) -> SearchConfig:
    """The request's options (its type checked them): its fields over the model's defaults
    (`Service.defaults_for`), then `SearchConfig`'s checks across fields."""
    names = set(option_names(type(service.defaults)))
    given = {k: getattr(req, k) for k in req.model_fields_set if k in names}
    try:
        return with_options(service.defaults_for(model), given)
    except OptionError as e:
        raise error(422, str(e)) from None

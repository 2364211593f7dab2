"""The HTTP API and the page: Starlette routes over one `Batcher` per served model.

Routes: `POST /translate` (two APIs on one route, told apart by the body: ours, a JSON object
with `sentences`, and LibreTranslate's, a JSON object or a form with `q`), `POST /attention`,
`GET /languages` (LibreTranslate's), `GET /models`, `GET /info`, `GET /health`, `GET /metrics`
(Prometheus), `GET /openapi.json`, `GET /` (the page, from `server/static`).

Every error is JSON, `{"error": "<problem>; <fix>"}`. Our API: 400 malformed body, 413 over a
size limit, 422 unknown or invalid option (an unknown model or language pair included), 429
queue full; LibreTranslate's API answers LibreTranslate's codes: 400 for any request it cannot
take, 403 a missing or unknown API key, 429 over a key's cap or the queue, 500 a failed
translation. After a failure of the model call (500) the server keeps serving. Torch-free:
`Service` holds the models' batchers and the facts the routes report.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qsl

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from attnmt.decoding.config import SearchConfig
from attnmt.server.batcher import Batcher, Closed, Job, QueueFull
from attnmt.server.html import Document
from attnmt.server.keys import KeyRejected, KeyRing
from attnmt.server.languages import is_multilingual, language_name
from attnmt.server.metrics import Metrics, Middleware
from attnmt.server.openapi import openapi_document
from attnmt.server.options import OptionError, as_dict, search_config

STATIC = Path(__file__).resolve().parent / "static"
logger = logging.getLogger(__name__)

# Body keys that pick the model (ours: `model`, `src_lang`/`tgt_lang` or `source`/`target`).
ROUTING_KEYS = ("model", "src_lang", "tgt_lang", "source", "target")


class Limits(NamedTuple):
    """What one request may ask for (serve.py flags of the same names)."""

    max_sentences: int  # sentences per /translate request (LibreTranslate: lines, text nodes)
    max_chars: int  # characters per sentence
    max_beam: int  # beam_size
    max_output_tokens: int  # int(max_len_a * longest source in tokens + max_len_b)

    @property
    def max_body(self) -> int:
        """Request body bytes: room for the sentences (UTF-8: <= 4 bytes a character, JSON
        escapes up to 6) and the options."""
        return self.max_sentences * (self.max_chars * 6 + 16) + 65536


@dataclass
class ServedModel:
    """One model: its id, languages, batcher (model thread), source length function and the
    facts `GET /info` reports."""

    id: str
    sources: list[str]
    targets: list[str]
    batcher: Batcher
    count_tokens: Callable[[list[str]], int]  # longest of the sentences, in source tokens
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def multilingual(self) -> bool:
        return is_multilingual(self.sources, self.targets)

    def describe(self) -> str:
        pairs = f"{'|'.join(self.sources) or '?'}->{'|'.join(self.targets) or '?'}"
        return f"{pairs} (model {self.id!r})"


class RoutingError(Exception):
    """No served model for the request's model id or languages; the message lists them."""


@dataclass
class Service:
    """What the routes serve: the models (the first is the default), the server's default
    options, its limits and its API keys (None: no keys needed)."""

    models: list[ServedModel]
    defaults: SearchConfig
    limits: Limits
    keys: KeyRing | None = None
    in_flight: int = 0  # /translate and /attention requests received and not yet answered
    answered: int = 0  # ... answered (with a result or an error)
    cancelled: int = 0  # ... dropped unanswered (shutdown timeout, client gone)
    metrics: Metrics | None = None

    def route(
        self, model_id: str | None, src: str | None, tgt: str | None
    ) -> tuple[ServedModel, tuple[str | None, str | None]]:
        """The model for a request and the pair to hand it: by id when given (its languages
        must then fit), else the first model (in `-c` order) that has `src` among its sources
        and `tgt` among its targets, else the default model when no language is named."""
        served = "; served: " + ", ".join(m.describe() for m in self.models)
        if model_id is not None:
            model = next((m for m in self.models if m.id == model_id), None)
            if model is None:
                raise RoutingError(f"unknown model {model_id!r}{served}")
            for code, codes, side in (
                (src, model.sources, "source"),
                (tgt, model.targets, "target"),
            ):
                if code is not None and codes and code not in codes:
                    raise RoutingError(
                        f"model {model_id!r} has no {side} language {code!r}{served}"
                    )
        elif src is None and tgt is None:
            model = self.models[0]
        else:
            found = [
                m for m in self.models
                if (src is None or src in m.sources) and (tgt is None or tgt in m.targets)
            ]  # fmt: skip
            if not found:
                raise RoutingError(f"no model translates {src or '?'} -> {tgt or '?'}{served}")
            model = found[0]
        if not model.multilingual:
            return model, (None, None)
        src = src if src is not None or len(model.sources) != 1 else model.sources[0]
        tgt = tgt if tgt is not None or len(model.targets) != 1 else model.targets[0]
        if src is None or tgt is None:
            raise RoutingError(
                f"model {model.id!r} is multilingual; name both the source and the target "
                f"language{served}"
            )
        return model, (src, tgt)

    def language_list(self) -> list[dict[str, Any]]:
        """LibreTranslate's `GET /languages`: each source code, its name and its targets."""
        targets: dict[str, list[str]] = {}
        for model in self.models:
            for src in model.sources:
                have = targets.setdefault(src, [])
                have += [t for t in model.targets if t not in have and t != src]
        return [
            {"code": code, "name": language_name(code), "targets": tgts}
            for code, tgts in targets.items()
        ]


def create_app(service: Service, on_startup: Callable[[], None] | None = None) -> Any:
    """The ASGI app (Starlette inside the metrics middleware); its shutdown finishes every
    queued job of every model, then stops the model threads."""
    metrics = Metrics(
        {m.id: (lambda b=m.batcher: b.queued) for m in service.models},
        lambda: service.in_flight,
    )
    service.metrics = metrics

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if on_startup is not None:
            on_startup()
        yield
        for model in service.models:
            await asyncio.to_thread(model.batcher.close)

    def counted(handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
        """`handler`, counted in `in_flight` from the moment its headers are in."""

        async def run(request: Request) -> JSONResponse:
            service.in_flight += 1  # the event loop's thread only: no lock needed
            try:
                answer = await handler(request)
            except asyncio.CancelledError:  # uvicorn's --shutdown-timeout ran out: say so
                service.cancelled += 1
                message = "the server stopped before this request was complete; retry"
                return JSONResponse({"error": message}, 503)
            except BaseException:
                service.answered += 1  # an error answer
                raise
            else:
                service.answered += 1
                return answer
            finally:
                service.in_flight -= 1

        return run

    def check_key(body: dict[str, Any], request: Request) -> None:
        given = "api_key" in body
        key = body.pop("api_key", None)
        if given and not isinstance(key, str):
            raise _error(400, "'api_key' must be a string")
        auth = request.headers.get("authorization", "")
        if key is None and auth.lower().startswith("bearer "):
            key = auth[7:].strip()
        if service.keys is not None:
            try:
                service.keys.check(key)
            except KeyRejected as e:
                raise _error(e.status, str(e)) from None

    async def translate(request: Request) -> JSONResponse:
        body, form = await _read_body(request, service.limits.max_body)
        check_key(body, request)
        if form or "q" in body:
            return await libretranslate(body, form)
        sentences = body.pop("sentences", None)
        if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
            raise _error(
                400,
                "'sentences' must be a list of strings; send {\"sentences\": [...]} (or "
                'LibreTranslate\'s {"q": ..., "source": ..., "target": ...})',
            )
        limits = service.limits
        if len(sentences) > limits.max_sentences:
            raise _error(
                413,
                f"{len(sentences)} sentences in one request, the limit is "
                f"{limits.max_sentences} (serve.py --max-sentences); split the request",
            )
        sentences = [_one_line(s) for s in sentences]
        _check_lengths(sentences, limits.max_chars, "sentences")
        prefixes = body.pop("prefixes", None)
        if prefixes is not None:
            if not isinstance(prefixes, list) or not all(isinstance(p, str) for p in prefixes):
                raise _error(400, "'prefixes' must be a list of strings, one per sentence")
            if len(prefixes) != len(sentences):
                raise _error(
                    422,
                    f"{len(prefixes)} prefixes for {len(sentences)} sentences; send one per "
                    'sentence ("" for none)',
                )
            prefixes = [_one_line(p) for p in prefixes]
            _check_lengths(prefixes, limits.max_chars, "prefixes")
        model, langs = _our_route(body, service)
        cfg = _options(body, service)
        _check_output_budget(cfg, sentences, model, limits.max_output_tokens)
        metrics.routed.labels(model.id, "attnmt").inc()
        job = Job(cfg, sentences, prefixes=prefixes, langs=langs)
        hyps = await _submit(model.batcher, job) if sentences else []
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

    async def libretranslate(body: dict[str, Any], form: bool) -> JSONResponse:
        """LibreTranslate's `/translate`: its fields, answers and codes (the docstring)."""
        q = body.get("q")
        batch = isinstance(q, list)
        if not (isinstance(q, str) or batch and all(isinstance(t, str) for t in q)):
            if q is not None:
                raise _error(400, "Invalid request: q must be a string or a list of strings")
        if not q:
            raise _error(400, "Invalid request: missing q parameter")
        texts: list[str] = q if batch else [q]
        names = {"source": body.get("source"), "target": body.get("target")}
        for name, value in names.items():
            if not value:
                raise _error(400, f"Invalid request: missing {name} parameter")
            if not isinstance(value, str):
                raise _error(400, f"Invalid request: {name} must be a language code (a string)")
        fmt = body.get("format")
        fmt = "text" if fmt is None or fmt == "" else fmt
        if fmt not in ("text", "html"):
            raise _error(400, f"{fmt} format is not supported; use text or html")
        alternatives = _alternatives(body.get("alternatives"), form, service.limits.max_beam)
        auto = names["source"] == "auto"
        try:
            model, langs = service.route(None, None if auto else names["source"], names["target"])
        except RoutingError as e:
            raise _error(400, f"Invalid request: {e}") from None
        if auto and len(model.sources) != 1:
            raise _error(
                400,
                "Invalid request: source 'auto' needs language detection, which this server "
                "does not do; name the source language",
            )
        # Every line of a text (format text) or text node (html) is one sentence.
        docs = [Document(t) if fmt == "html" else None for t in texts]
        segments = [
            d.segments if d is not None else t.split("\n") for d, t in zip(docs, texts, strict=True)
        ]
        flat = [s.strip() for parts in segments for s in parts]
        limits = service.limits
        if len(flat) > limits.max_sentences:
            raise _error(
                400,
                f"Invalid request: {len(flat)} lines or text nodes, the limit is "
                f"{limits.max_sentences} (serve.py --max-sentences); split the request",
            )
        for text in flat:
            if len(text) > limits.max_chars:
                raise _error(
                    400,
                    f"Invalid request: a line of {len(text)} characters, the limit is "
                    f"{limits.max_chars} (serve.py --max-chars); split it",
                )
        cfg = service.defaults
        if alternatives:
            cfg = replace(
                cfg, beam_size=max(cfg.beam_size, alternatives + 1), nbest=alternatives + 1
            )
        try:
            _check_output_budget(cfg, flat, model, limits.max_output_tokens)
        except HTTPException as e:
            raise _error(400, f"Invalid request: {e.detail}") from None
        metrics.routed.labels(model.id, "libretranslate").inc()
        try:
            hyps = await _submit(model.batcher, Job(cfg, flat, langs=langs)) if flat else []
        except HTTPException:
            raise
        except Exception as e:  # noqa: BLE001 - LibreTranslate's 500 for a failed translation
            raise _error(500, f"Cannot translate text: {type(e).__name__}: {e}") from None
        results, alts, start = [], [], 0
        for doc, parts in zip(docs, segments, strict=True):
            chunk = hyps[start : start + len(parts)]
            start += len(parts)
            best = [nbest[0][0] for nbest in chunk]
            if doc is not None:
                results.append(doc.render(best))
                alts.append([])  # alternatives of a document: none (as LibreTranslate)
            else:
                results.append("\n".join(best))
                alts.append(_alternative_texts(chunk, alternatives))
        answer: dict[str, Any] = {"translatedText": results if batch else results[0]}
        if alternatives:
            answer["alternatives"] = alts if batch else alts[0]
        if auto:
            detected = {"confidence": 100.0, "language": model.sources[0]}
            answer["detectedLanguage"] = [detected] * len(texts) if batch else detected
        return JSONResponse(answer)

    async def attention(request: Request) -> JSONResponse:
        body = await _read_json(request, service.limits.max_body)
        check_key(body, request)
        sentence = body.pop("sentence", None)
        if not isinstance(sentence, str):
            raise _error(400, '\'sentence\' must be a string; send {"sentence": "..."}')
        sentence = _one_line(sentence)
        if not sentence.strip():
            raise _error(422, "'sentence' is empty; send a sentence to translate")
        _check_lengths([sentence], service.limits.max_chars, "sentence")
        model, langs = _our_route(body, service)
        cfg = _options(body, service)
        _check_output_budget(cfg, [sentence], model, service.limits.max_output_tokens)
        job = Job(cfg, [sentence], attention=True, langs=langs)
        return JSONResponse(await _submit(model.batcher, job))

    async def health(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "status": "ok",
                "in_flight": service.in_flight,
                "queued": sum(m.batcher.queued for m in service.models),
                "answered": service.answered,
                "batches": sum(m.batcher.batches for m in service.models),
            }
        )

    def model_entry(model: ServedModel) -> dict[str, Any]:
        return {
            "id": model.id,
            "source_languages": model.sources,
            "target_languages": model.targets,
            "multilingual": model.multilingual,
            **model.info,
        }

    async def info(request: Request) -> JSONResponse:
        limits = service.limits._asdict()
        first = service.models[0].info
        models = [model_entry(m) for m in service.models]
        return JSONResponse(
            {**first, "options": as_dict(service.defaults), **limits, "models": models}
        )

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"models": [model_entry(m) for m in service.models]})

    async def languages(request: Request) -> JSONResponse:
        return JSONResponse(service.language_list())

    async def metrics_page(request: Request) -> Response:
        data, content_type = metrics.render()
        return Response(data, headers={"Content-Type": content_type})

    document = openapi_document(service)

    async def openapi(request: Request) -> JSONResponse:
        return JSONResponse(document)

    async def page(request: Request) -> FileResponse:
        return FileResponse(STATIC / "index.html")

    routes = [
        Route("/translate", counted(translate), methods=["POST"]),
        Route("/attention", counted(attention), methods=["POST"]),
        Route("/languages", languages, methods=["GET"]),
        Route("/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/info", info, methods=["GET"]),
        Route("/metrics", metrics_page, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/", page, methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    handlers = {HTTPException: _http_error, Exception: _server_error}
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
    paths = {r.path for r in routes if isinstance(r, Route)}
    return Middleware(app, metrics, paths)


def _our_route(
    body: dict[str, Any], service: Service
) -> tuple[ServedModel, tuple[str | None, str | None]]:
    """Our API's routing keys, popped from `body`: `model`, and `src_lang`/`tgt_lang` (or
    LibreTranslate's names `source`/`target`)."""
    values = {key: body.pop(key, None) for key in ROUTING_KEYS}
    for key, value in values.items():
        if value is not None and not isinstance(value, str):
            raise _error(422, f"{key!r} must be a string (a model id or a language code)")
    for ours, theirs in (("src_lang", "source"), ("tgt_lang", "target")):
        if None not in (values[ours], values[theirs]) and values[ours] != values[theirs]:
            raise _error(422, f"{ours!r} and {theirs!r} differ; send one of them")
    src = values["src_lang"] if values["src_lang"] is not None else values["source"]
    tgt = values["tgt_lang"] if values["tgt_lang"] is not None else values["target"]
    try:
        return service.route(values["model"], src, tgt)
    except RoutingError as e:
        raise _error(422, str(e)) from None


def _alternatives(value: Any, form: bool, max_beam: int) -> int:
    if value is None or form and value == "":
        return 0
    if form and isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _error(400, "Invalid request: alternatives must be a whole number >= 0")
    if value + 1 > max_beam:
        raise _error(
            400,
            f"Invalid request: too many alternatives ({value}), the limit is {max_beam - 1} "
            "(serve.py --max-beam minus one)",
        )
    return value


def _alternative_texts(chunk: list[list[tuple[str, float]]], alternatives: int) -> list[str]:
    """The k-th alternative of a text: its lines' k-th best translations, joined as the text's
    lines are; as many as every line has."""
    if not chunk:
        return []
    count = min(len(nbest) for nbest in chunk) - 1
    return [
        "\n".join(nbest[k][0] for nbest in chunk) for k in range(1, 1 + min(count, alternatives))
    ]


def _error(status: int, message: str) -> HTTPException:
    return HTTPException(status, message)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"error": exc.detail}, exc.status_code, headers=exc.headers)


async def _server_error(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"error": f"internal error: {type(exc).__name__}: {exc}"}, 500)


async def _read_bytes(request: Request, max_body: int) -> bytes:
    """The body; 413 past `max_body` bytes (checked while reading)."""
    too_big = _error(413, f"request body over {max_body} bytes; send fewer or shorter sentences")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


async def _read_body(request: Request, max_body: int) -> tuple[dict[str, Any], bool]:
    """(the body's fields, whether it was a form). A JSON object, or a form
    (`application/x-www-form-urlencoded` or `multipart/form-data`, as LibreTranslate's
    clients send) whose repeated `q` fields make a list. A form whose body is a JSON object
    (what `curl -d '{...}'` sends) is read as JSON."""
    data = await _read_bytes(request, max_body)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in ("application/x-www-form-urlencoded", "multipart/form-data") or (
        kind == "application/x-www-form-urlencoded" and data.lstrip()[:1] == b"{"
    ):
        return _parse_json(data), False
    pairs: list[tuple[str, Any]]
    if kind == "multipart/form-data":

        async def replay() -> dict[str, Any]:
            return {"type": "http.request", "body": data, "more_body": False}

        try:
            async with Request(request.scope, replay).form() as parsed:
                pairs = [(k, v) for k, v in parsed.multi_items() if isinstance(v, str)]
        except HTTPException as e:
            raise _error(400, f"Invalid request: the form cannot be read ({e.detail})") from None
        except Exception as e:  # noqa: BLE001 - python-multipart's own errors
            raise _error(400, f"Invalid request: the form cannot be read ({e})") from None
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise _error(400, "Invalid request: the form is not UTF-8") from None
        pairs = parse_qsl(text, keep_blank_values=True)
    body: dict[str, Any] = {}
    for key, value in pairs:
        if key == "q" and "q" in body:
            body["q"] = [*body["q"], value] if isinstance(body["q"], list) else [body["q"], value]
        else:
            body.setdefault(key, value)
    return body, True


async def _read_json(request: Request, max_body: int) -> dict[str, Any]:
    """The body as a JSON object; 413 past `max_body` bytes (checked while reading)."""
    return _parse_json(await _read_bytes(request, max_body))


def _parse_json(data: bytes) -> dict[str, Any]:
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _error(400, f"the body is not valid JSON ({e}); send a JSON object") from None
    except RecursionError:
        raise _error(400, "the body is nested too deeply; send a flat JSON object") from None
    if not isinstance(body, dict):
        raise _error(400, 'the body must be a JSON object, e.g. {"sentences": [...]}')
    return body


def _one_line(text: str) -> str:
    """What translate.py does with an argument: line breaks become spaces."""
    return " ".join(text.splitlines())


def _check_lengths(sentences: list[str], max_chars: int, name: str) -> None:
    for i, sentence in enumerate(sentences):
        if len(sentence) > max_chars:
            where = f"{name}[{i}]" if name in ("sentences", "prefixes") else name
            raise _error(
                413,
                f"{where} has {len(sentence)} characters, the limit is {max_chars} "
                "(serve.py --max-chars); split it",
            )


def _options(body: dict[str, Any], service: Service) -> SearchConfig:
    try:
        cfg = search_config(body, service.defaults)
    except OptionError as e:
        raise _error(422, str(e)) from None
    if cfg.beam_size > service.limits.max_beam:
        raise _error(
            422,
            f"option 'beam_size' is {cfg.beam_size}, the limit is {service.limits.max_beam} "
            "(serve.py --max-beam); ask for a smaller beam",
        )
    return cfg


def _check_output_budget(
    cfg: SearchConfig, sentences: list[str], model: ServedModel, limit: int
) -> None:
    if not sentences:
        return
    allowed = cfg.max_len_a * model.count_tokens(sentences) + cfg.max_len_b  # may overflow
    if not allowed <= limit:  # to inf: compare before int()
        raise _error(
            422,
            f"options 'max_len_a'/'max_len_b' allow {allowed:.0f} output tokens, the limit is "
            f"{limit} (serve.py --max-output-tokens); lower them",
        )


async def _submit(batcher: Batcher, job: Job) -> Any:
    try:
        future = batcher.submit(job)
    except QueueFull as e:
        raise _error(429, f"server busy: {e} (serve.py --max-queue); retry later") from None
    except Closed:
        raise _error(503, "the server is shutting down; retry on another server") from None
    return await asyncio.wrap_future(future)

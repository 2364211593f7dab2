"""The HTTP API and the page: Starlette routes over a `Batcher`.

Routes: `POST /translate` (`sentences`, optional `prefixes`, `SearchConfig` fields), `POST /attention`, `GET /health`, `GET /info`, `GET /` (the page,
from `server/static`). Every error is JSON, `{"error": "<problem>; <fix>"}`, with a 4xx status
for a request the client can fix (400 malformed body, 413 over a size limit, 422 unknown or
invalid option, 429 queue full) and 500 for a failure of the model call, after which the server
keeps serving. Torch-free: `Service` holds the batcher and the facts the routes report.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from decoding.config import SearchConfig
from server.batcher import Batcher, Closed, Job, QueueFull
from server.options import OptionError, as_dict, search_config

STATIC = Path(__file__).resolve().parent / "static"
logger = logging.getLogger(__name__)


class Limits(NamedTuple):
    """What one request may ask for (serve.py flags of the same names)."""

    max_sentences: int  # sentences per /translate request
    max_chars: int  # characters per sentence
    max_beam: int  # beam_size
    max_output_tokens: int  # int(max_len_a * longest source in tokens + max_len_b)

    @property
    def max_body(self) -> int:
        """Request body bytes: room for the sentences (UTF-8: <= 4 bytes a character, JSON
        escapes up to 6) and the options."""
        return self.max_sentences * (self.max_chars * 6 + 16) + 65536


@dataclass
class Service:
    """What the routes serve: the batcher, the server's default options, its limits, the
    model's facts (`GET /info`) and the source tokenizer's length function."""

    batcher: Batcher
    defaults: SearchConfig
    limits: Limits
    count_tokens: Callable[[list[str]], int]  # longest of the sentences, in source tokens
    info: dict[str, Any] = field(default_factory=dict)
    in_flight: int = 0  # /translate and /attention requests received and not yet answered
    answered: int = 0  # ... answered (with a result or an error)
    cancelled: int = 0  # ... dropped unanswered (shutdown timeout, client gone)


def create_app(service: Service, on_startup: Callable[[], None] | None = None) -> Starlette:
    """The ASGI app; its shutdown finishes every queued job, then stops the model thread."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if on_startup is not None:
            on_startup()
        yield
        await asyncio.to_thread(service.batcher.close)

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

    async def translate(request: Request) -> JSONResponse:
        body = await _read_json(request, service.limits.max_body)
        sentences = body.pop("sentences", None)
        if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
            raise _error(400, "'sentences' must be a list of strings; send {\"sentences\": [...]}")
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
        cfg = _options(body, service)
        _check_output_budget(cfg, sentences, service)
        job = Job(cfg, sentences, prefixes=prefixes)
        hyps = await _submit(service.batcher, job) if sentences else []
        answer: dict[str, Any] = {
            "translations": [nbest[0][0] for nbest in hyps],
            "scores": [nbest[0][1] for nbest in hyps],
        }
        if cfg.nbest > 1:
            answer["nbest"] = [
                [{"translation": text, "score": score} for text, score in nbest] for nbest in hyps
            ]
        answer["options"] = as_dict(cfg)
        return JSONResponse(answer)

    async def attention(request: Request) -> JSONResponse:
        body = await _read_json(request, service.limits.max_body)
        sentence = body.pop("sentence", None)
        if not isinstance(sentence, str):
            raise _error(400, '\'sentence\' must be a string; send {"sentence": "..."}')
        sentence = _one_line(sentence)
        if not sentence.strip():
            raise _error(422, "'sentence' is empty; send a sentence to translate")
        _check_lengths([sentence], service.limits.max_chars, "sentence")
        cfg = _options(body, service)
        _check_output_budget(cfg, [sentence], service)
        return JSONResponse(await _submit(service.batcher, Job(cfg, [sentence], attention=True)))

    async def health(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "status": "ok",
                "in_flight": service.in_flight,
                "queued": service.batcher.queued,
                "answered": service.answered,
                "batches": service.batcher.batches,
            }
        )

    async def info(request: Request) -> JSONResponse:
        limits = service.limits._asdict()
        return JSONResponse({**service.info, "options": as_dict(service.defaults), **limits})

    async def page(request: Request) -> FileResponse:
        return FileResponse(STATIC / "index.html")

    routes = [
        Route("/translate", counted(translate), methods=["POST"]),
        Route("/attention", counted(attention), methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/info", info, methods=["GET"]),
        Route("/", page, methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    handlers = {HTTPException: _http_error, Exception: _server_error}
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)


def _error(status: int, message: str) -> HTTPException:
    return HTTPException(status, message)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"error": exc.detail}, exc.status_code, headers=exc.headers)


async def _server_error(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"error": f"internal error: {type(exc).__name__}: {exc}"}, 500)


async def _read_json(request: Request, max_body: int) -> dict[str, Any]:
    """The body as a JSON object; 413 past `max_body` bytes (checked while reading)."""
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
    try:
        body = json.loads(b"".join(chunks))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _error(400, f"the body is not valid JSON ({e}); send a JSON object") from None
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


def _check_output_budget(cfg: SearchConfig, sentences: list[str], service: Service) -> None:
    if not sentences:
        return
    budget = int(cfg.max_len_a * service.count_tokens(sentences) + cfg.max_len_b)
    if budget > service.limits.max_output_tokens:
        raise _error(
            422,
            f"options 'max_len_a'/'max_len_b' allow {budget} output tokens, the limit is "
            f"{service.limits.max_output_tokens} (serve.py --max-output-tokens); lower them",
        )


async def _submit(batcher: Batcher, job: Job) -> Any:
    try:
        future = batcher.submit(job)
    except QueueFull as e:
        raise _error(429, f"server busy: {e} (serve.py --max-queue); retry later") from None
    except Closed:
        raise _error(503, "the server is shutting down; retry on another server") from None
    return await asyncio.wrap_future(future)

"""What the handlers of both APIs (`app`: ours, `libretranslate`: LibreTranslate's) share:
the error, the service a request is served by, reading a body, the API key, the output
budget, and handing a job to a model's batcher. Every error is an `HTTPException` whose
detail `app` answers as `{"error": detail}`. Torch-free.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request

from attnmt.decoding.config import SearchConfig
from attnmt.server.batcher import Batcher, Closed, Job, QueueFull
from attnmt.server.keys import KeyRejected
from attnmt.server.service import ServedModel, Service


def error(status: int, message: str) -> HTTPException:
    return HTTPException(status, message)


def service_of(request: Request) -> Service:
    """The service of the app that received `request` (`create_app` stores it there)."""
    return request.app.state.service


def count_route(service: Service, model: ServedModel, api: str) -> None:
    """One more request of `api` ("attnmt" or "libretranslate") routed to `model`."""
    assert service.metrics is not None  # create_app sets it before serving
    service.metrics.routed.labels(model.id, api).inc()


async def read_bytes(request: Request, max_body: int) -> bytes:
    """The body; 413 past `max_body` bytes (checked while reading)."""
    too_big = error(413, f"request body over {max_body} bytes; send fewer or shorter sentences")
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


def parse_json(data: bytes) -> dict[str, Any]:
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(400, f"the body is not valid JSON ({e}); send a JSON object") from None
    except RecursionError:
        raise error(400, "the body is nested too deeply; send a flat JSON object") from None
    if not isinstance(body, dict):
        raise error(400, 'the body must be a JSON object, e.g. {"sentences": [...]}')
    return body


def check_key(body: dict[str, Any], request: Request, service: Service) -> None:
    """The request's API key (popped from the body: `api_key`, else an `Authorization: Bearer`
    header) against the service's keys, when it has any: 403 or 429 from `KeyRing.check`."""
    given = "api_key" in body
    key = body.pop("api_key", None)
    if given and not isinstance(key, str):
        raise error(400, "'api_key' must be a string")
    auth = request.headers.get("authorization", "")
    if key is None and auth.lower().startswith("bearer "):
        key = auth[7:].strip()
    if service.keys is not None:
        try:
            service.keys.check(key)
        except KeyRejected as e:
            raise error(e.status, str(e)) from None


def check_output_budget(
    cfg: SearchConfig, sentences: list[str], model: ServedModel, limit: int
) -> None:
    if not sentences:
        return
    allowed = cfg.max_len_a * model.count_tokens(sentences) + cfg.max_len_b  # may overflow
    if not allowed <= limit:  # to inf: compare before int()
        raise error(
            422,
            f"options 'max_len_a'/'max_len_b' allow {allowed:.0f} output tokens, the limit is "
            f"{limit} (serve.py --max-output-tokens); lower them",
        )


async def submit(batcher: Batcher, job: Job) -> Any:
    try:
        future = batcher.submit(job)
    except QueueFull as e:
        raise error(429, f"server busy: {e} (serve.py --max-queue); retry later") from None
    except Closed:
        raise error(503, "the server is shutting down; retry on another server") from None
    return await asyncio.wrap_future(future)

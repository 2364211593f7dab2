"""What the handlers of both APIs (`app`: ours, `libretranslate`: LibreTranslate's) share:
the error, the service a request is served by, reading a body, the API key, the output
budget, the glossary, and handing a job to a model's batcher. Every error is an `HTTPException` whose
detail `app` answers as `{"error": detail}`. Torch-free.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request

from attnmt.decoding.config import SearchConfig
from attnmt.decoding.glossary import Glossary, GlossaryError
from attnmt.server.batcher import Batcher, Closed, Job, Langs, QueueFull
from attnmt.server.keys import KeyRejected
from attnmt.server.service import Limits, ServedModel, Service


def error(status: int, message: str) -> HTTPException:
    return HTTPException(status, message)


def service_of(request: Request) -> Service:
    """The service of the app that received `request` (`create_app` stores it there)."""
    return request.app.state.service


def count_route(service: Service, model: ServedModel, api: str) -> None:
    """One more request of `api` ("attnmt" or "libretranslate") routed to `model`."""
    assert service.metrics is not None  # create_app sets it before serving
    service.metrics.routed.labels(model.id, api).inc()


async def read_bytes(request: Request, max_body: int, timeout: float = 30.0) -> bytes:
    """The body; 413 past `max_body` bytes (checked while reading), 408 when it has not all
    arrived `timeout` seconds after its headers (a slow sender holds no request open),
    `ClientGone` when the client closed the connection first."""
    too_big = error(413, f"request body over {max_body} bytes; send fewer or shorter sentences")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body:
        raise too_big
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_body:
                    raise too_big
                chunks.append(chunk)
    except ClientDisconnect:  # gone before its body was in: nobody reads an answer
        raise ClientGone from None
    except TimeoutError:
        raise error(
            408,
            f"the request body did not arrive within {timeout:g} s (serve.py "
            "--client-timeout); send it at once",
        ) from None
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
    # JSON may escape a lone UTF-16 surrogate (\ud800); no tokenizer or splitter takes one.
    if _SURROGATE_ESCAPE.search(data) and not _unicode(json.dumps(body, ensure_ascii=False)):
        raise error(400, "the body holds a lone surrogate (\\ud800-\\udfff); send valid Unicode")
    return body


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


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
    cfg: SearchConfig, sentences: list[str], model: ServedModel, limits: Limits
) -> None:
    """The request's output budget per sentence within --max-output-tokens, and its work
    (`work`) within --max-work, before any search starts: 422 naming the fields."""
    if not sentences:
        return
    if model.token_counts is not None:
        counts = model.token_counts(sentences)
    else:  # only the longest known: every sentence counted as long
        counts = [model.count_tokens(sentences)] * len(sentences)
    longest = max(counts)
    allowed = cfg.max_len_a * longest + cfg.max_len_b  # may overflow
    if not allowed <= limits.max_output_tokens:  # to inf: compare before int()
        raise error(
            422,
            f"options 'max_len_a'/'max_len_b' allow {allowed:.0f} output tokens, the limit is "
            f"{limits.max_output_tokens} (serve.py --max-output-tokens); lower them",
        )
    budgets = [int(cfg.max_len_a * n + cfg.max_len_b) for n in counts]
    work, field = candidates(cfg) * sum(budgets), "nbest" if cfg.sampling else "beam_size"
    if work > limits.max_work:
        raise error(
            422,
            f"this request may compute {work} output tokens ('{field}' {candidates(cfg)} x "
            f"the 'max_len_a'/'max_len_b' budgets of its {len(sentences)} 'sentences', "
            f"{sum(budgets)} tokens), the limit is {limits.max_work} (serve.py --max-work); "
            f"lower '{field}' or 'max_len_b', or send fewer sentences",
        )


def candidates(cfg: SearchConfig) -> int:
    """The hypotheses searched per sentence: the beam, or with sampling the samples."""
    return cfg.nbest if cfg.sampling else max(cfg.beam_size, cfg.nbest)


def job_glossary(
    value: Any,
    model: ServedModel,
    cfg: SearchConfig,
    sentences: list[str],
    prefixes: list[str] | None,
    langs: Langs,
    status: int,
    prefix: str = "",
) -> Glossary | None:
    """The glossary a request's job runs with: the request's `glossary` (`value`: None, or
    `{"source term": "target term"}`, checked by `requests.Terms`) over the model's
    default (serve.py --glossary), the request's entries winning per source term; None where
    none of `sentences` holds one of its terms (the job may then join a stream).

    Errors: 400 for a lone surrogate; `status` (with `prefix`, the API's
    message start) for an entry `Glossary` rejects (an empty term, one source term given two
    targets), a term over its sentence's output budget, or terms with sampling.
    """
    glossary = model.glossary
    if value is not None:
        if any(not _unicode(k) or not _unicode(v) for k, v in value.items()):
            raise error(400, f"{prefix}'glossary' holds a lone surrogate; send valid Unicode")
        try:
            own = Glossary.from_mapping(value)
        except GlossaryError as e:
            raise error(status, f"{prefix}{e}") from None
        glossary = own if glossary is None else glossary.updated(own)
    if glossary is None or not any(glossary.find(s) for s in sentences):
        return None
    if cfg.sampling:
        raise error(
            status,
            f"{prefix}glossary terms constrain beam or greedy search; drop 'sampling' or the terms",
        )
    if model.check_terms is not None:
        try:
            model.check_terms(cfg, sentences, prefixes, glossary, langs)
        except GlossaryError as e:
            raise error(status, f"{prefix}{e}") from None
    return glossary


# A request's glossary: entries, and characters per term, bounded (`requests.Terms`) before
# any term is searched for, so that a request's glossary work stays small whatever it holds.
MAX_TERMS = 1024
MAX_TERM_CHARS = 128


def form_field(value: Any) -> Any:
    """A form's `glossary`, the object as JSON text, decoded ("" counts as absent); what
    cannot be decoded is left as it is, for `job_glossary` to reject."""
    if not isinstance(value, str):
        return value
    if not value.strip():
        return None
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return value


def _unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def submit(batcher: Batcher, job: Job, request: Request | None = None) -> Any:
    """The job's result from `batcher`. With `request`, a client that goes away first cancels
    the job (dropped before or between its search steps) and raises `ClientGone`."""
    try:
        future = batcher.submit(job)
    except QueueFull as e:
        raise error(429, f"server busy: {e} (serve.py --max-queue); retry later") from None
    except Closed:
        raise error(503, "the server is shutting down; retry on another server") from None
    answer = asyncio.wrap_future(future)
    if request is None:
        return await answer
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not answer.done():
        job.gone.set()  # a started job of this process's batcher: stopped between steps
        answer.cancel()  # cancels `future`: the model process drops or stops the job
        raise ClientGone
    return answer.result()


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone (the body has been read: the next message of the
    connection is its end)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def off_loop(function: Any, *args: Any) -> Any:
    """`function(*args)` on a worker thread, at most `PREPARERS` at once: parsing, splitting,
    tokenizing and glossary checks, so that no request's input holds the event loop."""
    async with _preparers():
        return await asyncio.to_thread(function, *args)


PREPARERS = 4  # requests prepared at once; the others wait their turn
_limiters: dict[Any, asyncio.Semaphore] = {}


def _preparers() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()  # a semaphore belongs to one event loop
    if loop not in _limiters:
        _limiters.clear()
        _limiters[loop] = asyncio.Semaphore(PREPARERS)
    return _limiters[loop]

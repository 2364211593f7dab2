"""LibreTranslate's API, as its clients call it: `POST /translate` with `q` (a text or a list
of texts), `source` (a code, or `auto` for a model with one source language), `target`,
`format` (`text`: each line; `html`: each text node, markup kept), `alternatives` and our
`split_sentences` (default true: each line or text node is split into sentences, as
LibreTranslate does), as a JSON object or a form (`application/x-www-form-urlencoded` or
`multipart/form-data`, whose repeated `q` fields make a list); `GET /languages`.

It answers LibreTranslate's codes, in the one error shape `{"error": ...}`: 400 for any
request it cannot take, 403 a missing or unknown API key, 429 over a key's cap or the queue,
500 a failed translation. Options other than `alternatives` are the server's defaults.
Torch-free.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple
from urllib.parse import parse_qsl

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from attnmt.server.batcher import Job
from attnmt.server.handling import (
    check_output_budget,
    count_route,
    error,
    parse_json,
    read_bytes,
    service_of,
    submit,
)
from attnmt.server.languages import language_name
from attnmt.server.service import RoutingError, ServedModel, Service
from attnmt.server.splitting import Texts, check_limits, source_language, split_option

FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")


class Fields(NamedTuple):
    """A request's fields, checked."""

    texts: list[str]  # `q`, as a list
    batch: bool  # whether `q` was a list (the answer's fields are lists then)
    source: str  # a language code or "auto"
    target: str
    fmt: str  # "text" or "html"
    alternatives: int  # translations besides the best, per text


async def read_body(request: Request, max_body: int) -> tuple[dict[str, Any], bool]:
    """(the body's fields, whether it was a form). A JSON object, or a form
    (`application/x-www-form-urlencoded` or `multipart/form-data`, as LibreTranslate's
    clients send) whose repeated `q` fields make a list. A form whose body is a JSON object
    (what `curl -d '{...}'` sends) is read as JSON."""
    data = await read_bytes(request, max_body)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in FORMS or (kind == FORMS[0] and data.lstrip()[:1] == b"{"):
        return parse_json(data), False
    pairs: list[tuple[str, Any]]
    if kind == "multipart/form-data":

        async def replay() -> dict[str, Any]:
            return {"type": "http.request", "body": data, "more_body": False}

        try:
            async with Request(request.scope, replay).form() as parsed:
                pairs = [(k, v) for k, v in parsed.multi_items() if isinstance(v, str)]
        except HTTPException as e:
            raise error(400, f"Invalid request: the form cannot be read ({e.detail})") from None
        except Exception as e:  # noqa: BLE001 - python-multipart's own errors
            raise error(400, f"Invalid request: the form cannot be read ({e})") from None
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise error(400, "Invalid request: the form is not UTF-8") from None
        pairs = parse_qsl(text, keep_blank_values=True)
    body: dict[str, Any] = {}
    for key, value in pairs:
        if key == "q" and "q" in body:
            body["q"] = [*body["q"], value] if isinstance(body["q"], list) else [body["q"], value]
        else:
            body.setdefault(key, value)
    return body, True


async def translate(body: dict[str, Any], form: bool, service: Service) -> JSONResponse:
    """LibreTranslate's `/translate` (the body read, its API key checked): its fields,
    answers and codes (the module docstring)."""
    fields = _fields(body, form, service.limits.max_beam)
    split = split_option(body, True, 400, "Invalid request: ")
    model, langs = _route(fields, service)
    # Each line of a text (format text) or text node (html), split into sentences unless the
    # request says split_sentences: false, is translated; `texts` puts the answer together.
    source = source_language(model.sources, fields.source)
    texts = Texts(fields.texts, source, split, fields.fmt)
    check_limits(texts, service.limits, 400, "Invalid request: ")
    flat = texts.sentences
    cfg = service.defaults
    if fields.alternatives:
        n = fields.alternatives + 1
        cfg = replace(cfg, beam_size=max(cfg.beam_size, n), nbest=n)
    try:
        check_output_budget(cfg, flat, model, service.limits.max_output_tokens)
    except HTTPException as e:
        raise error(400, f"Invalid request: {e.detail}") from None
    count_route(service, model, "libretranslate")
    try:
        hyps = await submit(model.batcher, Job(cfg, flat, langs=langs)) if flat else []
    except HTTPException:
        raise
    except Exception as e:  # noqa: BLE001 - LibreTranslate's 500 for a failed translation
        raise error(500, f"Cannot translate text: {type(e).__name__}: {e}") from None
    return JSONResponse(_answer(fields, model, texts, hyps))


async def languages(request: Request) -> JSONResponse:
    """`GET /languages`."""
    return JSONResponse(language_list(service_of(request).models))


def language_list(models: list[ServedModel]) -> list[dict[str, Any]]:
    """LibreTranslate's `GET /languages`: each source code, its name and its targets."""
    targets: dict[str, list[str]] = {}
    for model in models:
        for src in model.sources:
            have = targets.setdefault(src, [])
            have += [t for t in model.targets if t not in have and t != src]
    return [
        {"code": code, "name": language_name(code), "targets": tgts}
        for code, tgts in targets.items()
    ]


def _fields(body: dict[str, Any], form: bool, max_beam: int) -> Fields:
    q = body.get("q")
    batch = isinstance(q, list)
    if not (isinstance(q, str) or batch and all(isinstance(t, str) for t in q)):
        if q is not None:
            raise error(400, "Invalid request: q must be a string or a list of strings")
    if not q:
        raise error(400, "Invalid request: missing q parameter")
    names = {"source": body.get("source"), "target": body.get("target")}
    for name, value in names.items():
        if not value:
            raise error(400, f"Invalid request: missing {name} parameter")
        if not isinstance(value, str):
            raise error(400, f"Invalid request: {name} must be a language code (a string)")
    fmt = body.get("format")
    fmt = "text" if fmt is None or fmt == "" else fmt
    if fmt not in ("text", "html"):
        raise error(400, f"{fmt} format is not supported; use text or html")
    alternatives = _alternatives(body.get("alternatives"), form, max_beam)
    texts: list[str] = q if batch else [q]
    return Fields(texts, batch, names["source"], names["target"], fmt, alternatives)


def _alternatives(value: Any, form: bool, max_beam: int) -> int:
    if value is None or form and value == "":
        return 0
    if form and isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise error(400, "Invalid request: alternatives must be a whole number >= 0")
    if value + 1 > max_beam:
        raise error(
            400,
            f"Invalid request: too many alternatives ({value}), the limit is {max_beam - 1} "
            "(serve.py --max-beam minus one)",
        )
    return value


def _route(fields: Fields, service: Service) -> tuple[ServedModel, tuple[str | None, str | None]]:
    """The model and pair for the request; `auto` is the source of a model with one."""
    auto = fields.source == "auto"
    try:
        model, langs = service.route(None, None if auto else fields.source, fields.target)
    except RoutingError as e:
        raise error(400, f"Invalid request: {e}") from None
    if auto and len(model.sources) != 1:
        raise error(
            400,
            "Invalid request: source 'auto' needs language detection, which this server "
            "does not do; name the source language",
        )
    return model, langs


def _answer(
    fields: Fields,
    model: ServedModel,
    texts: Texts,
    hyps: list[list[tuple[str, float]]],
) -> dict[str, Any]:
    """LibreTranslate's answer: each text's translation (its sentences' best put back
    together), its alternatives when asked for, the source `auto` stood for."""
    results, alts = [], []
    for i, chunk in enumerate(texts.chunks(hyps)):
        results.append(texts.render_one(i, [nbest[0][0] for nbest in chunk]))
        if fields.fmt == "html":
            alts.append([])  # alternatives of a document: none (as LibreTranslate)
        else:
            alts.append(_alternative_texts(texts, i, chunk, fields.alternatives))
    batch = fields.batch
    answer: dict[str, Any] = {"translatedText": results if batch else results[0]}
    if fields.alternatives:
        answer["alternatives"] = alts if batch else alts[0]
    if fields.source == "auto":
        detected = {"confidence": 100.0, "language": model.sources[0]}
        answer["detectedLanguage"] = [detected] * len(fields.texts) if batch else detected
    return answer


def _alternative_texts(
    texts: Texts, i: int, chunk: list[list[tuple[str, float]]], alternatives: int
) -> list[str]:
    """The k-th alternative of text i: its sentences' k-th best translations, put together as
    its best is; as many as every sentence has."""
    if not chunk:
        return []
    count = min(len(nbest) for nbest in chunk) - 1
    return [
        texts.render_one(i, [nbest[k][0] for nbest in chunk])
        for k in range(1, 1 + min(count, alternatives))
    ]

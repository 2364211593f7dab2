"""LibreTranslate's API, as its clients call it: `POST /translate` with `q` (a text or a list
of texts), `source` (any form of a language code, `data.languages`, or `auto`: detected
among the served languages), `target`,
`format` (`text`: each line; `html`: each text node, markup kept), `alternatives` and our
`split_sentences` (default true: each line or text node is split into sentences, as
LibreTranslate does) and `glossary` (`{"source term": "target term"}`, in a form as JSON text;
`handling.job_glossary`), as a JSON object or a form (`application/x-www-form-urlencoded` or
`multipart/form-data`, whose repeated `q` fields make a list); `GET /languages`;
`POST /detect`; `GET /frontend/settings`; `POST /translate_file` (a .txt, .html or .docx
file, `server.documents`) and `GET /download_file/{name}`, where its translation waits.
A text whose source is its target language (named, or detected) comes back as it is, as in
LibreTranslate, unless a model translates that pair.

It answers LibreTranslate's codes, in the one error shape `{"error": ...}`: 400 for any
request it cannot take, 403 a missing or unknown API key, 429 over a key's cap or the queue,
500 a failed translation. Options other than `alternatives` are the server's defaults.
Torch-free.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, NamedTuple
from urllib.parse import parse_qsl

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from attnmt.data.languages import detect as detect_languages
from attnmt.data.languages import language_name, same_language
from attnmt.server.batcher import Job
from attnmt.server.documents import (
    FORMATS,
    MAX_FILE_BYTES,
    MAX_UPLOADS,
    FileError,
    Parsed,
    parse_file,
    safe_name,
)
from attnmt.server.handling import (
    ClientGone,
    check_key,
    check_output_budget,
    count_route,
    error,
    form_field,
    job_glossary,
    off_loop,
    parse_json,
    read_bytes,
    service_of,
    submit,
)
from attnmt.server.html import Document
from attnmt.server.requests import LT, checked, glossary_terms
from attnmt.server.service import Limits, RoutingError, ServedModel, Service
from attnmt.server.splitting import Texts, check_limits, source_language

FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")
FRONTEND_TIMEOUT_MS = 500  # LibreTranslate's default: the page waits this long after typing


class Fields(NamedTuple):
    """A request's fields, checked."""

    texts: list[str]  # `q`, as a list
    batch: bool  # whether `q` was a list (the answer's fields are lists then)
    source: str  # a language code or "auto"
    target: str
    fmt: str  # "text" or "html"
    alternatives: int  # translations besides the best, per text


async def read_body(request: Request, limits: Limits) -> tuple[dict[str, Any], bool]:
    """(the body's fields, whether it was a form). A JSON object, or a form
    (`application/x-www-form-urlencoded` or `multipart/form-data`, as LibreTranslate's
    clients send) whose repeated `q` fields make a list, at most --max-sentences of them
    besides 16 others. A form whose body is a JSON object (what `curl -d '{...}'` sends) is
    read as JSON. Parsed on a worker thread."""
    data = await read_bytes(request, limits.max_body, limits.client_timeout)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in FORMS or (kind == FORMS[0] and data.lstrip()[:1] == b"{"):
        return _routed_json(await off_loop(parse_json, data)), False
    max_fields = limits.max_sentences + 16
    pairs: list[tuple[str, Any]]
    if kind == "multipart/form-data":
        # Files (up to Starlette's default 1000) are allowed and ignored.
        pairs, _ = await off_loop(_multipart, request.headers.raw, data, max_fields, 1000)
    else:
        pairs = await off_loop(_url_form, data, max_fields)
    body: dict[str, Any] = {}
    for key, value in pairs:
        if key == "q" and "q" in body:
            body["q"] = [*body["q"], value] if isinstance(body["q"], list) else [body["q"], value]
        else:
            body.setdefault(key, value)
    return body, True


def _multipart(
    headers: list[tuple[bytes, bytes]], data: bytes, max_fields: int, max_files: int
) -> tuple[list[tuple[str, str]], tuple[str, bytes] | None]:
    """A multipart form's text fields and its first `file` (name, bytes), parsed by Starlette
    on an event loop of this (worker) thread, so that a large form holds no one else's
    request. At most `max_fields` fields and `max_files` files, else a 400."""
    return asyncio.run(_parse_multipart(headers, data, max_fields, max_files))


async def _parse_multipart(
    headers: list[tuple[bytes, bytes]], data: bytes, max_fields: int, max_files: int
) -> tuple[list[tuple[str, str]], tuple[str, bytes] | None]:
    async def replay() -> dict[str, Any]:
        return {"type": "http.request", "body": data, "more_body": False}

    pairs: list[tuple[str, str]] = []
    upload: tuple[str, bytes] | None = None
    form = Request({"type": "http", "headers": headers}, replay).form
    try:
        async with form(max_files=max_files, max_fields=max_fields) as parsed:
            for key, value in parsed.multi_items():
                if isinstance(value, str):
                    pairs.append((key, value))
                elif key == "file" and upload is None:
                    upload = (value.filename or "", await value.read())
    except HTTPException as e:
        raise error(400, f"Invalid request: the form cannot be read ({e.detail})") from None
    except Exception as e:  # noqa: BLE001 - python-multipart's own errors
        raise error(400, f"Invalid request: the form cannot be read ({e})") from None
    return pairs, upload


def _routed_json(body: dict[str, Any]) -> dict[str, Any]:
    """A JSON body without our `sentences` that names LibreTranslate's `source` or `target` is
    LibreTranslate's even without `q` (given `"q": None`, which `/translate` routes here), so
    that it gets LibreTranslate's answer, "missing q parameter", not ours."""
    if "q" not in body and "sentences" not in body and ("source" in body or "target" in body):
        body["q"] = None
    return body


def _url_form(data: bytes, max_fields: int) -> list[tuple[str, str]]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise error(400, "Invalid request: the form is not UTF-8") from None
    try:
        return parse_qsl(text, keep_blank_values=True, max_num_fields=max_fields)
    except ValueError:
        raise error(
            400,
            f"Invalid request: the form has over {max_fields} fields (serve.py --max-sentences "
            "q fields and 16 others); send fewer",
        ) from None


async def translate(
    body: dict[str, Any], form: bool, service: Service, request: Request | None = None
) -> JSONResponse:
    """LibreTranslate's `/translate` (the body read, its API key checked): its fields,
    answers and codes (the module docstring). The text is checked against the limits
    before it is parsed, and parsed and split on a worker thread."""
    fields, req = _fields(body, form, service)
    _check_size(fields.texts, service)
    split = True if req.split_sentences is None else req.split_sentences
    detected = await _detected(fields.texts, fields.fmt, fields.source, service)
    source = fields.source if detected is None else detected["language"]
    routed = _route(source, fields.target, service)
    if routed is None:  # already in the target language: as it came (LibreTranslate's too)
        texts = Texts(fields.texts, source, False, fields.fmt)
        hyps = [[(s, 0.0)] for s in texts.sentences]
        return JSONResponse(_answer(fields, texts, hyps, detected))
    model, langs = routed
    # Each line of a text (format text) or text node (html), split into sentences unless the
    # request says split_sentences: false, is translated; `texts` puts the answer together.
    cfg = service.defaults_for(model)
    if fields.alternatives:
        n = fields.alternatives + 1
        cfg = replace(cfg, beam_size=max(cfg.beam_size, n), nbest=n)
    terms = glossary_terms(form_field(req.glossary), 400, LT) if form else req.glossary
    lang = source_language(model.sources, source)
    texts, job = await off_loop(_text_job, fields, lang, split, cfg, langs, model, service, terms)
    hyps = await _translated(service, model, job, request)
    return JSONResponse(_answer(fields, texts, hyps, detected))


def _text_job(
    fields: Fields,
    lang: str | None,
    split: bool,
    cfg: Any,
    langs: Any,
    model: ServedModel,
    service: Service,
    terms: Any,
) -> tuple[Texts, Job]:
    """(the texts split into sentences, the job), checked: on a worker thread."""
    texts = Texts(fields.texts, lang, split, fields.fmt)
    check_limits(texts, service.limits, 400, "Invalid request: ")
    return texts, _checked_job(service, model, Job(cfg, texts.sentences, langs=langs), terms)


def _check_size(texts: list[str], service: Service) -> None:
    """Texts within --max-sentences of them and --max-sentences times --max-chars characters
    together (what one request may carry), checked before they are parsed or split."""
    limits = service.limits
    most = limits.max_sentences * limits.max_chars
    size = sum(len(t) for t in texts)
    if len(texts) > limits.max_sentences or size > most:
        raise error(
            400,
            f"Invalid request: {len(texts)} texts of {size} characters, the limit is "
            f"{limits.max_sentences} texts of {most} characters (serve.py --max-sentences, "
            "--max-chars); send less text at a time",
        )


def _checked_job(service: Service, model: ServedModel, job: Job, terms: Any) -> Job:
    """`job` within the output budget and work limit, with the request's glossary (`terms`)
    over the model's, in LibreTranslate's codes: 400 over a limit or for a glossary that
    cannot be used."""
    try:
        check_output_budget(job.cfg, job.sentences, model, service.limits)
    except HTTPException as e:
        raise error(400, f"Invalid request: {e.detail}") from None
    invalid = "Invalid request: "
    job.glossary = job_glossary(terms, model, job.cfg, job.sentences, None, job.langs, 400, invalid)
    return job


async def _translated(
    service: Service, model: ServedModel, job: Job, request: Request | None
) -> list[Any]:
    """The checked job's n-best lists from `model` in LibreTranslate's error codes: 500 a
    failed translation (429/503 as `submit` says)."""
    count_route(service, model, "libretranslate")
    try:
        return await submit(model.batcher, job, request) if job.sentences else []
    except (HTTPException, ClientGone):
        raise
    except Exception as e:  # noqa: BLE001 - LibreTranslate's 500 for a failed translation
        raise error(500, f"Cannot translate text: {type(e).__name__}: {e}") from None


async def languages(request: Request) -> JSONResponse:
    """`GET /languages`."""
    return JSONResponse(language_list(service_of(request)))


def language_list(service: Service) -> list[dict[str, Any]]:
    """LibreTranslate's `GET /languages`: every language a served model reads or writes, by
    its ISO 639-1 code where one exists, its English name, and the codes it translates into
    ([] for a language models only write)."""
    return [
        {"code": code, "name": language_name(code), "targets": targets}
        for code, (_, targets) in service.languages().items()
    ]


async def detect(request: Request) -> JSONResponse:
    """LibreTranslate's `POST /detect`: `q` (a text, or a list: detected together) ->
    `[{"confidence": 0..100, "language": code}, ...]`, best first, among the served
    languages; with none detected, the first with confidence 0 (as LibreTranslate)."""
    service = service_of(request)
    limits = service.limits
    body, _ = await read_body(request, limits)
    check_key(body, request, service)
    q = checked(service.types.detect, body, service.types, limits).q
    q = "\n".join(q) if isinstance(q, list) else q
    if not q.strip():
        raise error(400, "Invalid request: missing q parameter")
    if len(q) > limits.max_sentences * limits.max_chars:
        raise error(
            400,
            f"Invalid request: {len(q)} characters, the limit is "
            f"{limits.max_sentences * limits.max_chars} (serve.py --max-sentences times "
            "--max-chars); send less text",
        )
    codes = list(service.languages())
    if not codes:
        raise error(400, "Invalid request: the served models name no languages to detect")
    found = await asyncio.to_thread(detect_languages, q, codes)
    shown = [{"confidence": c, "language": code} for code, c in found if c > 0]
    return JSONResponse(shown or [{"confidence": 0.0, "language": codes[0]}])


async def frontend_settings(request: Request) -> JSONResponse:
    """LibreTranslate's `GET /frontend/settings`, which its page and apps read first."""
    service = service_of(request)
    langs = service.languages()
    # The page's first target: the first language's first target, else the second language.
    codes = list(langs)
    targets = [t for _, (_, ts) in langs.items() for t in ts]
    target = targets[0] if targets else codes[min(1, len(codes) - 1)] if codes else ""
    return JSONResponse(
        {
            "charLimit": service.limits.max_chars,
            "frontendTimeout": FRONTEND_TIMEOUT_MS,
            "apiKeys": service.keys is not None,
            "keyRequired": service.keys is not None,
            "suggestions": False,
            "filesTranslation": True,
            "supportedFilesFormat": list(FORMATS),
            "limits": service.limits._asdict(),  # ours: what one request may ask for
            "language": {
                "source": {"code": "auto", "name": "Auto Detect"},
                "target": {"code": target, "name": language_name(target)},
            },
        }
    )


async def translate_file(request: Request) -> JSONResponse:
    """LibreTranslate's `POST /translate_file`: a multipart form with `file`, `source` (or
    `auto`), `target` (and our `glossary`, as JSON text); answers `{"translatedFileUrl": ...}`,
    where `GET /download_file` serves the translation (`server.documents`). Each paragraph (a
    .txt line, an HTML text node, a .docx paragraph) is split into sentences; --max-chars
    bounds a paragraph, and --max-sentences times --max-chars the file's text. At most
    `MAX_UPLOADS` files are read and translated at once; beyond, 429."""
    service = service_of(request)
    if service.uploads >= MAX_UPLOADS:
        raise error(429, f"Slowdown: {MAX_UPLOADS} files are being translated; retry later")
    service.uploads += 1  # the event loop's thread only: no lock needed
    try:
        return await _translate_file(request, service)
    finally:
        service.uploads -= 1


async def _translate_file(request: Request, service: Service) -> JSONResponse:
    form, filename, data = await _read_file_form(request, service.limits.client_timeout)
    check_key(form, request, service)
    limits = service.limits
    req = checked(service.types.upload, {**_filled(form), "file": data}, service.types, limits)
    source, target = req.source, req.target
    try:
        stored_as = safe_name(filename)
        parsed = await off_loop(parse_file, filename, data, limits.max_sentences * limits.max_chars)
    except FileError as e:
        raise error(400, f"Invalid request: {e}") from None
    del data
    detected = await _detected(parsed.texts, parsed.fmt, source, service)
    source = source if detected is None else detected["language"]
    routed = _route(source, target, service)
    translated = parsed.texts  # already in the target language: as it came
    if routed is not None:
        model, langs = routed
        lang = source_language(model.sources, source)
        terms = glossary_terms(form_field(req.glossary), 400, LT)
        texts, job = await off_loop(_file_job, parsed, lang, langs, model, service, terms)
        hyps = await _translated(service, model, job, request)
        translated = texts.render([nbest[0][0] for nbest in hyps])
    try:
        written = await off_loop(parsed.write, translated)
    except Exception as e:  # noqa: BLE001 - a document python-docx reads but cannot write
        raise error(500, f"Cannot write the translated file: {type(e).__name__}: {e}") from None
    name = service.files.put(stored_as, written)
    return JSONResponse({"translatedFileUrl": str(request.url_for("download_file", name=name))})


def _file_job(
    parsed: Parsed, lang: str | None, langs: Any, model: ServedModel, service: Service, terms: Any
) -> tuple[Texts, Job]:
    """(a file's texts split into sentences, its job), checked: on a worker thread."""
    texts = Texts(parsed.texts, lang, True, parsed.fmt)
    _check_file(texts, service)
    job = Job(service.defaults_for(model), texts.sentences, langs=langs)
    return texts, _checked_job(service, model, job, terms)


async def download_file(request: Request) -> Response:
    """`GET /download_file/{name}`: a translated file (the newest ones are kept, in memory)."""
    stored = service_of(request).files.get(request.path_params["name"])
    if stored is None:
        raise error(
            404,
            "no such translated file (the server keeps the newest ones only, until it "
            "stops); translate the file again",
        )
    disposition = f'attachment; filename="{stored.filename}"'
    return Response(
        stored.data, media_type=stored.media_type, headers={"Content-Disposition": disposition}
    )


async def _read_file_form(request: Request, timeout: float) -> tuple[dict[str, Any], str, bytes]:
    """`/translate_file`'s multipart form: (its text fields, the file's name, its bytes)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "multipart/form-data":
        raise error(
            400,
            "Invalid request: send the file as multipart/form-data (fields file, source, target)",
        )
    data = await read_bytes(request, MAX_FILE_BYTES, timeout)
    pairs, upload = await off_loop(_multipart, request.headers.raw, data, 16, 1)
    fields: dict[str, Any] = {}
    for key, value in pairs:
        fields.setdefault(key, value)
    if upload is None:
        raise error(400, "Invalid request: missing file parameter")
    if not upload[0]:
        raise error(400, "Invalid request: the file has no name; send it with its file name")
    return fields, upload[0], upload[1]


def _check_file(texts: Texts, service: Service) -> None:
    """A file's paragraphs within --max-chars each, its text within --max-sentences times
    --max-chars (what one /translate request may carry)."""
    limits = service.limits
    if texts.longest > limits.max_chars:
        raise error(
            400,
            f"Invalid request: a paragraph of {texts.longest} characters, the limit is "
            f"{limits.max_chars} (serve.py --max-chars); split it",
        )
    size, most = sum(len(s) for s in texts.sentences), limits.max_sentences * limits.max_chars
    if size > most:
        raise error(
            400,
            f"Invalid request: the file has {size} characters of text, the limit is {most} "
            "(serve.py --max-sentences times --max-chars); send a shorter file",
        )


def _fields(body: dict[str, Any], form: bool, service: Service) -> tuple[Fields, Any]:
    """The request's fields, checked by its type (a form's empty fields count as absent)."""
    types = service.types
    kind = types.lt_form if form else types.lt_json
    req = checked(kind, _filled(body) if form else body, types, service.limits)
    batch = isinstance(req.q, list)
    texts: list[str] = req.q if batch else [req.q]
    fmt, alternatives = req.format or "text", req.alternatives or 0
    return Fields(texts, batch, req.source, req.target, fmt, alternatives), req


def _filled(form: dict[str, Any]) -> dict[str, Any]:
    """A form's fields but the empty ones (LibreTranslate's clients send "" for unset)."""
    return {k: v for k, v in form.items() if v != ""}


def _route(
    source: str, target: str, service: Service
) -> tuple[ServedModel, tuple[str | None, str | None]] | None:
    """The model and pair for a request; None when no model translates the pair and the
    source is the target, a served language (the text needs no translation)."""
    try:
        return service.route(None, source, target)
    except RoutingError as e:
        every = [code for _, (code, _) in service.languages().items()]
        if same_language(source, target) and any(same_language(source, c) for c in every):
            return None
        raise error(400, f"Invalid request: {e}") from None


async def _detected(
    texts: list[str], fmt: str, source: str, service: Service
) -> dict[str, Any] | None:
    """For `source: auto`, LibreTranslate's `detectedLanguage` of the texts (detected
    together, among the served languages); None for a named source."""
    if source != "auto":
        return None
    codes = list(service.languages())
    found = await off_loop(_detect_texts, texts, fmt, codes) if codes else []
    if found:
        return {"confidence": found[0][1], "language": found[0][0]}
    sources = {code for m in service.models for code in m.sources}
    if len(sources) == 1:  # nothing to choose from: the one language the models read
        return {"confidence": 0.0, "language": codes[0]}
    raise error(
        400,
        "Invalid request: source 'auto': the language identifier knows none of the served "
        f"languages ({', '.join(codes) or 'none named'}); name the source language",
    )


def _detect_texts(texts: list[str], fmt: str, codes: list[str]) -> list[tuple[str, float]]:
    sample = "\n".join(" ".join(Document(t).segments) if fmt == "html" else t for t in texts)
    return detect_languages(sample, codes)


def _answer(
    fields: Fields,
    texts: Texts,
    hyps: list[list[tuple[str, float]]],
    detected: dict[str, Any] | None,
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
    if detected is not None:
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
    found = [
        texts.render_one(i, [nbest[k][0] for nbest in chunk])
        for k in range(1, 1 + min(count, alternatives))
    ]
    # as LibreTranslate: each alternative once, none equal to the best or empty
    seen = {texts.render_one(i, [nbest[0][0] for nbest in chunk]), ""}
    return [t for t in found if not (t in seen or seen.add(t))]

"""The OpenAPI 3.0 document of the server (`GET /openapi.json`), built from what it serves:
the request options are `SearchConfig`'s fields (types and lower bounds from the field
definitions, `beam_size` bounded by `--max-beam`), the sizes come from the server's limits,
and every error is the one `{"error": ...}` object. Checked against the running server by
Schemathesis (tests/test_serve_api.py). Torch-free.
"""

from __future__ import annotations

import types
from dataclasses import fields
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from attnmt.server.documents import FORMATS
from attnmt.server.handling import MAX_TERM_CHARS, MAX_TERMS
from attnmt.server.options import INT_RANGE, option_names
from attnmt.server.service import Limits, ServedModel, Service

# A request's glossary: source term -> target term (empty terms are 422/400: not said here).
GLOSSARY = {
    "type": "object",
    "additionalProperties": {"type": "string", "maxLength": MAX_TERM_CHARS},
    "maxProperties": MAX_TERMS,
    "nullable": True,
    "description": 'terms the translations must use, {"source term": "target term"}; '
    "over the model's default glossary (serve.py --glossary), entry by entry; at most "
    f"{MAX_TERMS} entries, each term at most {MAX_TERM_CHARS} characters",
}
# ... in a form: that object as JSON text
GLOSSARY_TEXT = {"type": "string", "description": "the glossary, a JSON object as text"}

ERROR = {
    "type": "object",
    "properties": {"error": {"type": "string", "description": "the problem and its fix"}},
    "required": ["error"],
}


def option_schemas(
    defaults: Any, max_beam: int, max_work: int | None = None
) -> dict[str, dict[str, Any]]:
    """One JSON schema per request option (the fields of `type(defaults)`); `nbest` at most
    `max_work` (the work limit, `x-limits`, bounds it further)."""
    hints = get_type_hints(type(defaults))
    meta = {f.name: f.metadata for f in fields(type(defaults))}
    schemas = {}
    for name in option_names(type(defaults)):
        schema = _schema(hints[name])
        minimum = meta[name].get("min")
        if minimum is not None:
            schema["minimum"] = minimum
        if name == "beam_size":
            schema["maximum"] = max_beam
        if name == "nbest" and max_work is not None:  # sampled: at least 1 token each
            schema["maximum"] = max_work
        if name in ("topp", "temperature"):  # SearchConfig's own checks: (0, 1] and > 0
            schema.update(minimum=0, exclusiveMinimum=True)
            if name == "topp":
                schema["maximum"] = 1
        help_text = meta[name].get("help")
        if help_text:
            schema["description"] = help_text
        schema["default"] = getattr(defaults, name)
        schemas[name] = schema
    return schemas


def _schema(kind: Any) -> dict[str, Any]:
    origin = get_origin(kind)
    if origin is Literal:
        return {"type": "string", "enum": list(get_args(kind))}
    if origin in (Union, types.UnionType):
        members = [m for m in get_args(kind) if m is not type(None)]
        schema = (
            _schema(members[0]) if len(members) == 1 else {"anyOf": [_schema(m) for m in members]}
        )
        return {**schema, "nullable": True}
    if kind is bool:
        return {"type": "boolean"}
    if kind is int:
        return {"type": "integer", "minimum": INT_RANGE[0], "maximum": INT_RANGE[1]}
    if kind is float:
        return {"type": "number"}
    return {"type": "string"}


def openapi_document(service: Service) -> dict[str, Any]:
    """The document of a server serving `service` (its models, defaults and limits)."""
    limits = service.limits
    options = option_schemas(service.defaults, limits.max_beam, limits.max_work)
    ours, attention_request = _our_requests(service.models, limits, options)
    lt_json, lt_form = _libretranslate_requests(service.models, limits)
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "attnmt serve.py",
            "version": "1",
            "description": "Translation with attnmt models: our API and LibreTranslate's on "
            "POST /translate (see docs/serving.md).",
            # the limits no field's schema can state (x-: OpenAPI's extension keys)
            "x-limits": {
                **limits._asdict(),
                "work": "candidates per sentence (beam_size, or nbest when sampling) times the "
                "sentences' output budgets int(max_len_a * source tokens + max_len_b), summed, "
                "at most max_work (serve.py --max-work); beyond, 422 (LibreTranslate's: 400)",
                "client_timeout": "seconds to send a request's headers, then its body: beyond, "
                "the connection is closed (headers) or answered 408 (body)",
            },
        },
        "paths": {
            **_post_paths(ours, lt_json, lt_form, attention_request),
            **_get_paths(),
            **_libretranslate_paths(),
        },
    }


def _codes(values: list[str], what: str) -> dict[str, Any]:
    """A routing key: one of `values` (any string when there are none); null counts as not
    given."""
    schema: dict[str, Any] = {"type": "string", "nullable": True, "description": what}
    return {**schema, "enum": [*values, None]} if values else schema


def _our_requests(
    models: list[ServedModel], limits: Limits, options: dict[str, dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Our `/translate` and `/attention` request bodies."""
    text = {"type": "string", "maxLength": limits.max_chars}
    sources = sorted({c for m in models for c in m.sources})
    targets = sorted({c for m in models for c in m.targets})
    routing = {
        "model": _codes([m.id for m in models], "a model id (GET /models)"),
        "src_lang": _codes(sources, "a source language of a served model"),
        "tgt_lang": _codes(targets, "a target language of a served model"),
        "source": _codes(sources, "same as src_lang (one of the two)"),
        "target": _codes(targets, "same as tgt_lang (one of the two)"),
        "api_key": {"type": "string", "description": "needed when the server has --api-keys"},
    }
    # The pairs served: a request's languages (and model id) must be those of one model.
    our_pairs = [
        {
            "properties": {
                "model": {"enum": [m.id, None]},
                **{k: {"enum": [*m.sources, None]} for k in ("src_lang", "source") if m.sources},
                **{k: {"enum": [*m.targets, None]} for k in ("tgt_lang", "target") if m.targets},
            }
        }
        for m in models
    ]
    ours = {
        "type": "object",
        "title": "attnmt request",
        "required": ["sentences"],
        "additionalProperties": False,
        "anyOf": our_pairs,
        "properties": {
            "sentences": {"type": "array", "items": text, "maxItems": limits.max_sentences},
            "prefixes": {
                "type": "array",
                "items": text,
                "maxItems": limits.max_sentences,
                "nullable": True,
                "description": "a forced target prefix per sentence ('' for none)",
            },
            "split_sentences": {
                "type": "boolean",
                "nullable": True,  # null: the default
                "default": False,
                "description": "each of sentences is a text that may hold several sentences: "
                "split, translated and rejoined (not with prefixes or nbest > 1)",
            },
            "glossary": GLOSSARY,
            **routing,
            **options,
        },
    }
    attention_request = {
        "type": "object",
        "required": ["sentence"],
        "additionalProperties": False,
        "anyOf": our_pairs,
        "properties": {"sentence": {**text, "pattern": "\\S"}, **routing, **options},
    }
    return ours, attention_request


def _libretranslate_requests(
    models: list[ServedModel], limits: Limits
) -> tuple[dict[str, Any], dict[str, Any]]:
    """LibreTranslate's `/translate` request bodies: JSON, and a form."""
    lt_pairs = [
        {
            "properties": {
                "source": {"enum": m.sources + (["auto"] if len(m.sources) == 1 else [])},
                "target": {"enum": m.targets},
            }
        }
        for m in models
        if m.sources and m.targets
    ]
    lt_fields = {
        "source": {"type": "string", "minLength": 1, "description": "source language or auto"},
        "target": {"type": "string", "minLength": 1},
        "format": {
            "type": "string",
            "enum": ["text", "html", "", None],
            "nullable": True,
            "default": "text",
        },
        "alternatives": {
            "type": "integer",
            "minimum": 0,
            "maximum": limits.max_beam - 1,
            "nullable": True,
        },
        "api_key": {"type": "string"},
        "split_sentences": {
            "type": "boolean",
            "nullable": True,  # null: the default
            "default": True,
            "description": "split each line or text node into sentences before translating",
        },
    }
    libretranslate = {
        "type": "object",
        "title": "LibreTranslate request",
        "required": ["q", "source", "target"],
        "anyOf": lt_pairs,
        "properties": {
            "q": {
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    {"type": "array", "items": {"type": "string"}, "minItems": 1},
                ],
                "description": "the text (its lines, or its text nodes for html, are sentences)",
            },
            **lt_fields,
            "glossary": GLOSSARY,
        },
    }
    lt_form = {
        "type": "object",
        "required": ["q", "source", "target"],
        "anyOf": lt_pairs,
        "properties": {
            "q": {"type": "string", "minLength": 1},
            **lt_fields,
            "glossary": GLOSSARY_TEXT,
        },
    }
    return libretranslate, lt_form


STRINGS = {"type": "array", "items": {"type": "string"}}
FILE_TYPES = sorted({media.split(";")[0] for media in FORMATS.values()})


def _translate_answer() -> dict[str, Any]:
    """`/translate`'s answer: ours or LibreTranslate's."""
    ours_answer = {
        "type": "object",
        "required": ["translations", "scores", "options"],
        "properties": {
            "translations": STRINGS,
            "scores": {"type": "array", "items": {"type": "number"}},
            "nbest": {
                "type": "array",
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "translation": {"type": "string"},
                            "score": {"type": "number"},
                        },
                    },
                },
            },
            "options": {"type": "object"},
            "model": {"type": "string"},
        },
    }
    detected = {
        "type": "object",
        "properties": {"confidence": {"type": "number"}, "language": {"type": "string"}},
    }
    lt_answer = {
        "type": "object",
        "required": ["translatedText"],
        "properties": {
            "translatedText": {"anyOf": [{"type": "string"}, STRINGS]},
            "alternatives": {"anyOf": [STRINGS, {"type": "array", "items": STRINGS}]},
            "detectedLanguage": {"anyOf": [detected, {"type": "array", "items": detected}]},
        },
    }
    return {"anyOf": [ours_answer, lt_answer]}


ATTENTION_ANSWER = {
    "type": "object",
    "required": ["translation", "src_pieces", "tgt_pieces", "layers", "heads", "attention"],
    "properties": {
        "translation": {"type": "string"},
        "src_pieces": STRINGS,
        "tgt_pieces": STRINGS,
        "layers": {"type": "integer"},
        "heads": {"type": "integer"},
        "attention": {"type": "array", "description": "(layers, heads, target, source)"},
    },
}


def _json_body(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    why = {
        400: "a malformed body; LibreTranslate: any request it cannot take",
        403: "a missing or unknown API key (with --api-keys)",
        413: "over --max-sentences, --max-chars or the body size",
        422: "an unknown or invalid option, model, language pair or glossary entry",
        429: "a key over its rate, or --max-queue requests waiting",
        500: "the model call failed (the server goes on)",
        503: "the server is shutting down",
    }
    return {str(c): _json_body(ERROR, why[c]) for c in codes}


def _get(summary: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"get": {"summary": summary, "responses": {"200": _json_body(schema, "OK")}}}


def _post_paths(
    ours: dict[str, Any],
    libretranslate: dict[str, Any],
    lt_form: dict[str, Any],
    attention_request: dict[str, Any],
) -> dict[str, Any]:
    """`POST /translate` and `POST /attention`."""
    return {
        "/translate": {
            "post": {
                "summary": "Translate: {sentences} (attnmt) or {q, source, target} "
                "(LibreTranslate, JSON or form)",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": {"oneOf": [ours, libretranslate]}},
                        "application/x-www-form-urlencoded": {"schema": lt_form},
                    },
                },
                "responses": {
                    "200": _json_body(_translate_answer(), "translations"),
                    **_errors(400, 403, 413, 422, 429, 500, 503),
                },
            }
        },
        "/attention": {
            "post": {
                "summary": "A translation and its cross-attention",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": attention_request}},
                },
                "responses": {
                    "200": _json_body(ATTENTION_ANSWER, "the attention"),
                    **_errors(400, 403, 413, 422, 429, 500, 503),
                },
            }
        },
    }


def _libretranslate_schemas() -> dict[str, dict[str, Any]]:
    """The bodies of LibreTranslate's other calls: detect (request, answer), upload,
    settings, file_url."""
    key = {"type": "string", "description": "needed when the server has --api-keys"}
    detect = {
        "type": "object",
        "required": ["q"],
        "properties": {
            "q": {
                "oneOf": [
                    {"type": "string", "pattern": "\\S"},
                    {"type": "array", "items": {"type": "string"}, "minItems": 1},
                ],
                "description": "the text (a list: detected together)",
            },
            "api_key": key,
        },
    }
    detections = {
        "type": "array",
        "items": {
            "type": "object",
            "required": ["confidence", "language"],
            "properties": {
                "confidence": {"type": "number", "minimum": 0, "maximum": 100},
                "language": {"type": "string"},
            },
        },
    }
    upload = {
        "type": "object",
        "required": ["file", "source", "target"],
        "properties": {
            "file": {"type": "string", "format": "binary", "description": ".txt, .html or .docx"},
            "source": {"type": "string", "description": "source language or auto"},
            "target": {"type": "string"},
            "api_key": key,
            "glossary": GLOSSARY_TEXT,
        },
    }
    named = {"code": {"type": "string"}, "name": {"type": "string"}}
    settings = {
        "type": "object",
        "required": ["charLimit", "supportedFilesFormat", "language"],
        "properties": {
            "charLimit": {"type": "integer", "description": "characters per line or paragraph"},
            "frontendTimeout": {"type": "integer"},
            "apiKeys": {"type": "boolean"},
            "keyRequired": {"type": "boolean"},
            "suggestions": {"type": "boolean"},
            "filesTranslation": {"type": "boolean"},
            "supportedFilesFormat": STRINGS,
            "language": {
                "type": "object",
                "properties": {
                    side: {"type": "object", "properties": named} for side in ("source", "target")
                },
            },
        },
    }
    file_url = {
        "type": "object",
        "required": ["translatedFileUrl"],
        "properties": {"translatedFileUrl": {"type": "string"}},
    }
    return {
        "detect": detect,
        "detections": detections,
        "upload": upload,
        "settings": settings,
        "file_url": file_url,
    }


def _libretranslate_paths() -> dict[str, Any]:
    """LibreTranslate's other calls: `/detect`, `/frontend/settings`, `/translate_file`,
    `/download_file/{name}`."""
    schemas = _libretranslate_schemas()
    detect, detections = schemas["detect"], schemas["detections"]
    upload, settings, file_url = schemas["upload"], schemas["settings"], schemas["file_url"]
    return {
        "/detect": {
            "post": {
                "summary": "LibreTranslate's language detection, among the served languages",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": detect},
                        "application/x-www-form-urlencoded": {"schema": detect},
                    },
                },
                "responses": {
                    "200": _json_body(detections, "the languages, best first"),
                    **_errors(400, 403, 413, 429),
                },
            }
        },
        "/frontend/settings": _get("LibreTranslate's settings for its page and apps", settings),
        "/translate_file": {
            "post": {
                "summary": "LibreTranslate's file translation (.txt, .html, .docx)",
                "requestBody": {
                    "required": True,
                    "content": {"multipart/form-data": {"schema": upload}},
                },
                "responses": {
                    "200": _json_body(file_url, "where the translated file waits"),
                    **_errors(400, 403, 413, 429, 500, 503),
                },
            }
        },
        "/download_file/{name}": {
            "get": {
                "summary": "A translated file (the newest are kept, in memory)",
                "parameters": [
                    {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {
                    "200": {
                        "description": "the file",
                        "content": {
                            media: {"schema": {"type": "string", "format": "binary"}}
                            for media in FILE_TYPES
                        },
                    },
                    "404": _json_body(ERROR, "no such file (any more)"),
                },
            }
        },
    }


def _get_paths() -> dict[str, Any]:
    """The `GET` routes: the lists, the facts, the metrics, this document and the page."""
    language = {
        "type": "object",
        "required": ["code", "name", "targets"],
        "properties": {"code": {"type": "string"}, "name": {"type": "string"}, "targets": STRINGS},
    }
    model = {
        "type": "object",
        "required": ["id", "source_languages", "target_languages"],
        "properties": {
            "id": {"type": "string"},
            "source_languages": STRINGS,
            "target_languages": STRINGS,
            "multilingual": {"type": "boolean"},
        },
    }
    return {
        "/languages": _get(
            "LibreTranslate's language list: every served language (ISO 639-1 where one "
            "exists) and the ones it translates into",
            {"type": "array", "items": language},
        ),
        "/models": _get(
            "The served models",
            {
                "type": "object",
                "required": ["models"],
                "properties": {"models": {"type": "array", "items": model}},
            },
        ),  # fmt: skip
        "/info": _get("The default model's facts, the options and limits", {"type": "object"}),
        "/health": _get(
            "Liveness and counters",
            {
                "type": "object",
                "required": ["status"],
                "properties": {
                    "status": {"type": "string"},
                    "in_flight": {"type": "integer"},
                    "queued": {"type": "integer"},
                    "answered": {"type": "integer"},
                    "batches": {"type": "integer"},
                },
            },
        ),  # fmt: skip
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {
                    "200": {
                        "description": "text format 0.0.4",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/openapi.json": _get("This document", {"type": "object"}),
        "/": {
            "get": {
                "summary": "The page",
                "responses": {
                    "200": {
                        "description": "HTML",
                        "content": {"text/html": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
    }

"""The OpenAPI 3.0 document of the server (`GET /openapi.json`), built from what it serves:
the request options are `SearchConfig`'s fields (types and lower bounds from the field
definitions, `beam_size` bounded by `--max-beam`), the sizes come from the server's limits,
and every error is the one `{"error": ...}` object. Checked against the running server by
Schemathesis (tests/test_serve_api.py). Torch-free.
"""

from __future__ import annotations

from typing import Any

from attnmt.server.documents import FORMATS
from attnmt.server.requests import Types
from attnmt.server.service import Service

ERROR = {
    "type": "object",
    "properties": {"error": {"type": "string", "description": "the problem and its fix"}},
    "required": ["error"],
}


def _schema(kind: Any) -> dict[str, Any]:
    """A request type's JSON Schema (2020-12, OpenAPI 3.1's dialect), defaults included."""
    return kind.model_json_schema()


def openapi_document(service: Service, types: Types) -> dict[str, Any]:
    """The document of a server serving `service` (its models, defaults and limits), whose
    requests are `types` (`requests.request_types`)."""
    limits = service.limits
    ours, attention_request = _schema(types.ours), _schema(types.attention)
    lt_json, lt_form = _schema(types.lt_json), _schema(types.lt_form)
    return {
        "openapi": "3.1.0",
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
            **_libretranslate_paths(_schema(types.detect), _schema(types.upload)),
        },
    }


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
    """The answers of LibreTranslate's other calls: detections, settings, file_url."""
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
    return {"detections": detections, "settings": settings, "file_url": file_url}


def _libretranslate_paths(detect: dict[str, Any], upload: dict[str, Any]) -> dict[str, Any]:
    """LibreTranslate's other calls: `/detect`, `/frontend/settings`, `/translate_file`,
    `/download_file/{name}`, with the request bodies `detect` and `upload`."""
    schemas = _libretranslate_schemas()
    detections, settings, file_url = schemas["detections"], schemas["settings"], schemas["file_url"]
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

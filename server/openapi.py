"""The OpenAPI 3.1 document of the server (`GET /openapi.json`): the request bodies are the
request types (`requests`: the options, limits and served languages in them), the answers the
types below, each stated as pydantic gives its JSON Schema (2020-12, OpenAPI 3.1's dialect);
what no schema can state is in `info.x-limits`. Every error is the one `{"error": ...}`
object. Checked against the running server by Schemathesis (tests/test_serve_api.py).
Torch-free.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, TypeAdapter

from attnmt.server.documents import FORMATS
from attnmt.server.requests import Types
from attnmt.server.service import Service


class Error(BaseModel):
    error: str = Field(description="the problem and its fix")


class Scored(BaseModel):
    translation: str
    score: float


class Answer(BaseModel):
    """Our `/translate` answer."""

    translations: list[str]
    scores: list[float]
    nbest: list[list[Scored]] = Field([], description="with nbest > 1: per sentence, best first")
    options: dict[str, Any]
    model: str = Field("", description="with several models: the one that translated")


class Detected(BaseModel):
    confidence: float = Field(ge=0, le=100)
    language: str


class LibreTranslateAnswer(BaseModel):
    translatedText: str | list[str]  # noqa: N815 - LibreTranslate's names
    alternatives: list[str] | list[list[str]] = []
    detectedLanguage: Detected | list[Detected] | None = None  # noqa: N815


class AttentionAnswer(BaseModel):
    translation: str
    src_pieces: list[str]
    tgt_pieces: list[str]
    layers: int
    heads: int
    attention: list[Any] = Field(description="(layers, heads, target, source)")


class Named(BaseModel):
    code: str
    name: str


class Sides(BaseModel):
    source: Named
    target: Named


class Settings(BaseModel):
    """LibreTranslate's `/frontend/settings`."""

    charLimit: int = Field(description="characters per line or paragraph")  # noqa: N815
    frontendTimeout: int  # noqa: N815
    apiKeys: bool  # noqa: N815
    keyRequired: bool  # noqa: N815
    suggestions: bool
    filesTranslation: bool  # noqa: N815
    supportedFilesFormat: list[str]  # noqa: N815
    language: Sides


class FileUrl(BaseModel):
    translatedFileUrl: str  # noqa: N815


class Language(BaseModel):
    code: str
    name: str
    targets: list[str]


class ModelEntry(BaseModel):
    id: str
    source_languages: list[str]
    target_languages: list[str]
    multilingual: bool = False


class Models(BaseModel):
    models: list[ModelEntry]


class Health(BaseModel):
    status: str
    in_flight: int
    queued: int
    answered: int
    batches: int


WHY = {
    400: "a malformed body; LibreTranslate: any request it cannot take",
    403: "a missing or unknown API key (with --api-keys)",
    404: "no such file (any more)",
    413: "over --max-sentences, --max-chars or the body size",
    422: "an unknown or invalid option, model, language pair or glossary entry",
    429: "a key over its rate, or --max-queue requests waiting",
    500: "the model call failed (the server goes on)",
    503: "the server is shutting down",
}
POSTED = (400, 403, 413, 422, 429, 500, 503)
FILE_TYPES = sorted({media.split(";")[0] for media in FORMATS.values()})
REF = "#/components/schemas/{model}"


class Document:
    """The document under construction: its paths, and the named schemas they refer to."""

    def __init__(self) -> None:
        self.paths: dict[str, Any] = {}
        self.schemas: dict[str, Any] = {}

    def schema(self, kind: Any) -> dict[str, Any]:
        """`kind`'s JSON Schema, the models it holds moved to the document's components."""
        found = TypeAdapter(kind).json_schema(ref_template=REF)
        self.schemas.update(found.pop("$defs", {}))
        return found

    def add(
        self,
        route: str,
        summary: str,
        answer: Any,
        body: dict[str, Any] | None = None,
        errors: tuple[int, ...] = (),
        media: str = "application/json",
    ) -> None:
        """One route: `POST` with a request `body` (media type -> schema), else `GET`."""
        schema = answer if isinstance(answer, dict) else self.schema(answer)
        responses = {"200": {"description": "OK", "content": {media: {"schema": schema}}}}
        for code in errors:
            error = {"application/json": {"schema": self.schema(Error)}}
            responses[str(code)] = {"description": WHY[code], "content": error}
        operation: dict[str, Any] = {"summary": summary, "responses": responses}
        if body is not None:
            content = {kind: {"schema": schema} for kind, schema in body.items()}
            operation["requestBody"] = {"required": True, "content": content}
        self.paths[route] = {"post" if body is not None else "get": operation}


def openapi_document(service: Service, types: Types) -> dict[str, Any]:
    """The document of a server serving `service` (its models, defaults and limits), whose
    requests are `types` (`requests.request_types`)."""
    doc = Document()
    s = doc.schema
    lt_form, detect = s(types.lt_form), s(types.detect)
    one_of = {"oneOf": [s(types.ours), s(types.lt_json)]}
    translate = {"application/json": one_of, "application/x-www-form-urlencoded": lt_form}
    doc.add("/translate", "Translate: {sentences} (attnmt) or {q, source, target} (LibreTranslate,"
            " JSON or form)", Answer | LibreTranslateAnswer, translate, POSTED)  # fmt: skip
    attention = {"application/json": s(types.attention)}
    doc.add("/attention", "A translation and its cross-attention", AttentionAnswer, attention, POSTED)  # fmt: skip
    doc.add("/detect", "LibreTranslate's language detection, among the served languages",
            list[Detected], {"application/json": detect, "application/x-www-form-urlencoded": detect},
            (400, 403, 413, 429))  # fmt: skip
    doc.add("/translate_file", "LibreTranslate's file translation (.txt, .html, .docx)", FileUrl,
            {"multipart/form-data": s(types.upload)}, (400, 403, 413, 429, 500, 503))  # fmt: skip
    doc.add("/frontend/settings", "LibreTranslate's settings for its page and apps", Settings)
    doc.add("/languages", "LibreTranslate's language list: every served language (ISO 639-1 "
            "where one exists) and the ones it translates into", list[Language])  # fmt: skip
    doc.add("/models", "The served models", Models)
    doc.add("/info", "The default model's facts, the options and limits", {"type": "object"})
    doc.add("/health", "Liveness and counters", Health)
    doc.add("/metrics", "Prometheus metrics (text format 0.0.4)", {"type": "string"}, media="text/plain")  # fmt: skip
    doc.add("/openapi.json", "This document", {"type": "object"})
    doc.add("/", "The page", {"type": "string"}, media="text/html")
    binary = {"type": "string", "format": "binary"}
    doc.add("/download_file/{name}", "A translated file (the newest are kept, in memory)", binary,
            errors=(404,), media=FILE_TYPES[0])  # fmt: skip
    download = doc.paths["/download_file/{name}"]["get"]
    download["responses"]["200"]["content"] = {media: {"schema": binary} for media in FILE_TYPES}
    download["parameters"] = [
        {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
    ]
    return {
        "openapi": "3.1.0",
        "info": _info(service),
        "paths": doc.paths,
        "components": {"schemas": doc.schemas},
    }


def _info(service: Service) -> dict[str, Any]:
    return {
        "title": "attnmt serve.py",
        "version": "1",
        "description": "Translation with attnmt models: our API and LibreTranslate's on "
        "POST /translate (see docs/serving.md).",
        # the limits no field's schema can state (x-: OpenAPI's extension keys)
        "x-limits": {
            **service.limits._asdict(),
            "work": "candidates per sentence (beam_size, or nbest when sampling) times the "
            "sentences' output budgets int(max_len_a * source tokens + max_len_b), summed, "
            "at most max_work (serve.py --max-work); beyond, 422 (LibreTranslate's: 400)",
            "client_timeout": "seconds to send a request's headers, then its body: beyond, "
            "the connection is closed (headers) or answered 408 (body)",
        },
    }

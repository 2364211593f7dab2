"""The request bodies as types: one pydantic model per body (ours: `/translate`, `/attention`;
LibreTranslate's: `/translate` as JSON and as a form, `/detect`, `/translate_file`'s form),
built once per deployment with its limits and served languages. The handlers validate a body
with its type (`checked`) and `openapi` states the same types as JSON Schema, so a rule is
written once. A failed check is one `{"error": ...}` naming the field, in its API's codes.

pydantic v2 rather than msgspec: each error carries the field's location and the constraint
that failed (what the one-line message names), and `create_model` builds a deployment's types
from its limits; msgspec's `Meta` constraints would do the validation as well, less the error
details. Torch-free.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model

from attnmt.server.handling import MAX_TERM_CHARS, MAX_TERMS, error
from attnmt.server.options import option_fields, option_problem
from attnmt.server.service import Limits, Service

LT = "Invalid request: "  # LibreTranslate's message start
GLOSSARY_SHAPE = '{"source term": "target term", ...}'
Term = Annotated[str, Field(max_length=MAX_TERM_CHARS)]
Terms = Annotated[
    dict[Term, Term],
    Field(
        max_length=MAX_TERMS,
        description='terms the translations must use, {"source term": "target term"}; over '
        "the model's default glossary (serve.py --glossary), entry by entry",
    ),
]
TERMS = TypeAdapter(Terms | None)
OURS = ConfigDict(extra="forbid", strict=True)  # ours: an unknown field is an error (422)
THEIRS = ConfigDict(extra="ignore", strict=True)  # LibreTranslate's: other fields ignored
FORM = ConfigDict(extra="ignore", strict=False)  # a form's values are text


class Types(NamedTuple):
    """A deployment's request types."""

    ours: type[BaseModel]
    attention: type[BaseModel]
    lt_json: type[BaseModel]
    lt_form: type[BaseModel]
    detect: type[BaseModel]
    upload: type[BaseModel]
    caps: dict[str, tuple[int, str]]


def request_types(service: Service) -> Types:
    """The request types of a server serving `service` (its models, defaults and limits)."""
    limits, models = service.limits, service.models
    caps = {"beam_size": (limits.max_beam, "--max-beam"), "nbest": (limits.max_work, "--max-work")}
    options = option_fields(service.defaults, caps)
    text = Annotated[str, Field(max_length=limits.max_chars)]
    texts = Annotated[list[text], Field(max_length=limits.max_sentences)]
    sources = sorted({c for m in models for c in m.sources})
    targets = sorted({c for m in models for c in m.targets})
    routing = {
        "model": _code([m.id for m in models], "a model id (GET /models)"),
        "src_lang": _code(sources, "a source language of a served model"),
        "tgt_lang": _code(targets, "a target language of a served model"),
        "source": _code(sources, "same as src_lang (one of the two)"),
        "target": _code(targets, "same as tgt_lang (one of the two)"),
        "api_key": (str | None, Field(None, description="with --api-keys: the key")),
    }
    pairs = [
        {
            "properties": {
                "model": {"enum": [m.id, None]},
                **{k: {"enum": [*m.sources, None]} for k in ("src_lang", "source") if m.sources},
                **{k: {"enum": [*m.targets, None]} for k in ("tgt_lang", "target") if m.targets},
            }
        }
        for m in models
    ]  # a request's languages (and model id) must be those of one model
    ours_config = ConfigDict(**OURS, json_schema_extra={"anyOf": pairs})
    split = "each of sentences is a text of sentences: split, translated and rejoined"
    ours = create_model(
        "AttnmtRequest",
        __config__=ours_config,
        sentences=(texts, ...),
        prefixes=(texts | None, Field(None, description="a forced target prefix per sentence")),
        split_sentences=(bool | None, Field(False, description=split)),
        glossary=(Terms | None, None),
        **routing,
        **options,
    )
    sentence = Annotated[str, Field(max_length=limits.max_chars, pattern=r"\S")]
    attention = create_model(
        "AttentionRequest", __config__=ours_config, sentence=(sentence, ...), **routing, **options
    )
    lt_json, lt_form = _libretranslate_types(service)
    q = (
        Annotated[str, Field(min_length=1, pattern=r"\S")]
        | Annotated[list[str], Field(min_length=1)]
    )
    detect = create_model(
        "DetectRequest", __config__=THEIRS, q=(q, ...), api_key=(str | None, None)
    )
    language = Annotated[str, Field(min_length=1)]
    upload = create_model(
        "UploadRequest",
        __config__=FORM,
        file=(
            bytes,
            Field(json_schema_extra={"format": "binary"}, description=".txt, .html, .docx"),
        ),
        source=(language, Field(description="source language or auto")),
        target=(language, ...),
        api_key=(str | None, None),
        glossary=(str | None, Field(None, description="the glossary, a JSON object as text")),
    )
    return Types(ours, attention, lt_json, lt_form, detect, upload, caps)


def _code(values: list[str], what: str) -> Any:
    """A routing key: any form of a code (`data.languages.resolve`) is accepted; the schema
    lists the served ones (null: not given)."""
    extra = {"enum": [*values, None]} if values else None
    return (str | None, Field(None, description=what, json_schema_extra=extra))


def _libretranslate_types(service: Service) -> tuple[type[BaseModel], type[BaseModel]]:
    """LibreTranslate's `/translate` bodies: JSON, and a form."""
    limits = service.limits
    pairs = [
        {
            "properties": {
                "source": {"enum": m.sources + (["auto"] if len(m.sources) == 1 else [])},
                "target": {"enum": m.targets},
            }
        }
        for m in service.models
        if m.sources and m.targets
    ]
    language = Annotated[str, Field(min_length=1)]
    fields: dict[str, Any] = {
        "source": (language, Field(description="source language or auto")),
        "target": (language, ...),
        "format": (Literal["text", "html", ""] | None, "text"),
        "alternatives": (int | None, Field(None, ge=0, le=limits.max_beam - 1)),
        "api_key": (str | None, None),
        "split_sentences": (bool | None, Field(True, description="split lines into sentences")),
    }
    text = Annotated[str, Field(min_length=1)]
    q = text | Annotated[list[str], Field(min_length=1)]
    json_config = ConfigDict(**THEIRS, json_schema_extra={"anyOf": pairs})
    lt_json = create_model(
        "LibreTranslateRequest",
        __config__=json_config,
        q=(q, Field(description="the text (its lines, or its text nodes for html, are sentences)")),
        **fields,
        glossary=(Terms | None, None),
    )
    form_config = ConfigDict(**FORM, json_schema_extra={"anyOf": pairs})
    glossary_text = (str | None, Field(None, description="the glossary, a JSON object as text"))
    lt_form = create_model(
        "LibreTranslateForm", __config__=form_config, q=(q, ...), **fields, glossary=glossary_text
    )
    return lt_json, lt_form


def checked(kind: type[BaseModel], body: dict[str, Any], types: Types, limits: Limits) -> Any:
    """`body` as a `kind`, else the error (its API's code and message) of its first problem."""
    try:
        return kind.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
    if kind.model_config.get("extra") == "forbid":
        status, message = _our_problem(first, types, limits)
        raise error(status, message) from None
    raise error(400, _their_problem(first, types, limits)) from None


def glossary_terms(value: Any, status: int, prefix: str = "") -> dict[str, str] | None:
    """A request's `glossary` as `Terms` (a form's decoded first), else the error."""
    try:
        return TERMS.validate_python(value, strict=True)
    except ValidationError as e:
        err = e.errors()[0]
    raise error(*_glossary_problem(err, status, prefix)) from None


def _glossary_problem(err: Any, status: int, prefix: str) -> tuple[int, str]:
    value, kind = err.get("input"), err["type"]
    if kind == "too_long" and isinstance(value, dict):
        return status, f"{prefix}'glossary' has {len(value)} entries, the limit is {MAX_TERMS}"
    if kind == "string_too_long":
        return status, (
            f"{prefix}the glossary term {value[:20]!r}... has {len(value)} characters, the "
            f"limit is {MAX_TERM_CHARS}; shorten it"
        )
    return 400, f"{prefix}'glossary' must be a JSON object of strings, {GLOSSARY_SHAPE}"


def _our_problem(err: Any, types: Types, limits: Limits) -> tuple[int, str]:
    """Our API's (status, message) for one error of a body."""
    loc, kind, value = err["loc"], err["type"], err.get("input")
    key = loc[0]
    if key in ("sentences", "prefixes") and len(loc) > 1 and kind == "string_too_long":
        return 413, (
            f"{key}[{loc[1]}] has {len(value)} characters, the limit is {limits.max_chars} "
            "(serve.py --max-chars); split it"
        )
    if key in ("sentences", "prefixes") and kind == "too_long":
        return 413, (
            f"{len(value)} {key} in one request, the limit is {limits.max_sentences} "
            "(serve.py --max-sentences); split the request"
        )
    if key == "sentences":
        return 400, (
            "'sentences' must be a list of strings; send {\"sentences\": [...]} (or "
            'LibreTranslate\'s {"q": ..., "source": ..., "target": ...})'
        )
    if key == "prefixes":
        return 400, "'prefixes' must be a list of strings, one per sentence"
    if key == "sentence":
        return _sentence_problem(kind, value, limits)
    if key == "glossary":
        return _glossary_problem({**err, "loc": loc[1:]}, 422, "")
    if key == "split_sentences":
        return 422, f"'split_sentences' must be true or false, got {value!r}"
    if key == "api_key":
        return 400, "'api_key' must be a string"
    if key in ("model", "src_lang", "tgt_lang", "source", "target"):
        return 422, f"{key!r} must be a string (a model id or a language code)"
    return 422, option_problem(err, caps=types.caps)


def _sentence_problem(kind: str, value: Any, limits: Limits) -> tuple[int, str]:
    if kind == "string_pattern_mismatch":
        return 422, "'sentence' is empty; send a sentence to translate"
    if kind == "string_too_long":
        return 413, (
            f"sentence has {len(value)} characters, the limit is {limits.max_chars} "
            "(serve.py --max-chars); split it"
        )
    return 400, '\'sentence\' must be a string; send {"sentence": "..."}'


def _their_problem(err: Any, types: Types, limits: Limits) -> str:
    """LibreTranslate's message (status 400) for one error of a body."""
    loc, kind, value = err["loc"], err["type"], err.get("input")
    key = loc[0]
    empty = kind in ("missing", "too_short", "string_too_short", "string_pattern_mismatch")
    if key in ("q", "source", "target", "file") and (empty or value in ("", [], None)):
        return f"{LT}missing {key} parameter"
    if key == "q":
        return f"{LT}q must be a string or a list of strings"
    if key in ("source", "target"):
        return f"{LT}{key} must be a language code (a string)"
    if key == "format":
        return f"{value} format is not supported; use text or html"
    if key == "alternatives" and kind == "less_than_equal":
        return (
            f"{LT}too many alternatives ({value}), the limit is {limits.max_beam - 1} "
            "(serve.py --max-beam minus one)"
        )
    if key == "alternatives":
        return f"{LT}alternatives must be a whole number >= 0"
    if key == "glossary":
        return _glossary_problem({**err, "loc": loc[1:]}, 400, LT)[1]
    if key == "split_sentences":
        return f"{LT}'split_sentences' must be true or false, got {value!r}"
    return f"{LT}'{key}': {err['msg']}"

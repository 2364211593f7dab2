"""Request options as typed fields, from `decoding.config.SearchConfig`.

Every field of `SearchConfig` (or a subclass) is a request option under its own name: its
annotation is the option's type and its metadata's bounds (`min`, `above`, `max`) are the
option's constraints, so a field added there is an option here without a change. The
deployment's limits (`--max-beam` on `beam_size`, `--max-work` on `nbest`) are added when the
request types are built (`requests`). `batch_size` belongs to the server. Torch-free.
"""

from __future__ import annotations

import functools
import types
from dataclasses import fields, replace
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from pydantic import ConfigDict, Field, ValidationError, create_model

from attnmt.common.errors import UserError
from attnmt.decoding.config import SearchConfig, bounds_text

# Integers an option may be: 64-bit signed (a seed goes to torch).
INT_RANGE = (-(2**63), 2**63 - 1)

# Fields a request may not set: field -> why (the server's flag that sets it).
SERVER_OWNED = {"batch_size": "the server batches requests itself (serve.py --batch-size)"}

# Deployment limits on options: field -> (its bound, the serve.py flag)
Caps = dict[str, tuple[int, str]]


class OptionError(UserError):
    """A request option that is unknown or invalid; the message names it."""


def option_names(config_type: type = SearchConfig) -> list[str]:
    """The option names a request may use, in the field order of `config_type`."""
    return [f.name for f in fields(config_type) if f.name not in SERVER_OWNED]


def option_fields(defaults: SearchConfig, caps: Caps | None = None) -> dict[str, Any]:
    """The options of `type(defaults)` as pydantic field definitions (type, `Field`): its
    defaults, help texts and bounds, integers within `INT_RANGE`, `caps` as maxima."""
    hints = _hints(type(defaults))
    found = {}
    for f in fields(type(defaults)):
        if f.name in SERVER_OWNED:
            continue
        kind, meta = hints[f.name], f.metadata
        bounds = {"ge": meta.get("min"), "gt": meta.get("above"), "le": meta.get("max")}
        if int in (kind, *get_args(kind)):
            bounds = {"ge": INT_RANGE[0], "le": INT_RANGE[1]} | _set(bounds)
        if caps and f.name in caps:
            bounds["le"] = caps[f.name][0]
        extra = {"allow_inf_nan": False} if float in (kind, *get_args(kind)) else {}
        help_text = meta.get("help") or None
        default = getattr(defaults, f.name)
        found[f.name] = (kind, Field(default, description=help_text, **_set(bounds), **extra))
    return found


@functools.cache
def _hints(config_type: type) -> dict[str, Any]:
    """`get_type_hints` of a config type, once (it evaluates every annotation string)."""
    return get_type_hints(config_type)


def _set(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


@functools.cache
def _options_type(config_type: type) -> Any:
    defaults = config_type()
    config = ConfigDict(extra="forbid", strict=True)
    return create_model(
        f"{config_type.__name__}Options", __config__=config, **option_fields(defaults)
    )


def apply_options(options: dict[str, Any], defaults: SearchConfig) -> SearchConfig:
    """`defaults` with `options` (request key -> JSON value) applied and validated: the type
    of `option_fields`, then `SearchConfig`'s own checks across fields.

    Raises:
        OptionError: a key that is not an option, a value of the wrong type, or a value that
            `SearchConfig` rejects (e.g. nbest > beam_size); the message names the key.
    """
    try:
        given = _options_type(type(defaults)).model_validate(options)
    except ValidationError as e:
        raise OptionError(option_problem(e.errors()[0], type(defaults))) from None
    return with_options(defaults, {k: getattr(given, k) for k in given.model_fields_set})


def with_options(defaults: SearchConfig, values: dict[str, Any]) -> SearchConfig:
    """`defaults` with checked option values; OptionError for what `SearchConfig` rejects."""
    try:
        return replace(defaults, **values)
    except (TypeError, ValueError) as e:
        raise OptionError(f"invalid options: {e}") from None


def option_problem(err: Any, config_type: type = SearchConfig, caps: Caps | None = None) -> str:
    """The message for one pydantic error of an option (`err`, from `errors()`)."""
    key, kind, value = err["loc"][0], err["type"], err.get("input")
    if kind == "extra_forbidden":
        if key in SERVER_OWNED:
            return f"option {key!r} cannot be set per request: {SERVER_OWNED[key]}"
        return f"unknown option {key!r}; options are: {', '.join(option_names(config_type))}"
    ctx = err.get("ctx") or {}
    if caps and key in caps and ctx.get("le") == caps[key][0]:
        return (
            f"option {key!r} is {value}, the limit is {caps[key][0]} (serve.py "
            f"{caps[key][1]}); lower {key!r}"
        )
    meta = {f.name: f.metadata for f in fields(config_type)}.get(key, {})
    if {"ge", "gt", "le"} & set(ctx) and meta.get(bounds_key(ctx)) is not None:
        return f"invalid options: {key} must be {bounds_text(meta)}, got {value}"
    return f"option {key!r} must be {_describe(_hints(config_type)[key])}, got {value!r}"


def bounds_key(ctx: dict[str, Any]) -> str:
    """The metadata key of the bound a constraint error's context names."""
    return {"ge": "min", "gt": "above", "le": "max"}[
        next(k for k in ("ge", "gt", "le") if k in ctx)
    ]


def as_dict(cfg: SearchConfig) -> dict[str, Any]:
    """The request options `cfg` amounts to (what a response reports back)."""
    return {name: getattr(cfg, name) for name in option_names(type(cfg))}


def _describe(kind: Any) -> str:
    origin = get_origin(kind)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(kind))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(member) for member in get_args(kind))
    names = {int: "an integer", float: "a finite number", bool: "true or false", str: "a string"}
    return "null" if kind is type(None) else names.get(kind, getattr(kind, "__name__", str(kind)))

"""Request options -> `SearchConfig`, generically from its fields.

Every field of `decoding.config.SearchConfig` is a request option under its own name, checked
against the field's type annotation (int, float, bool, str, a `Literal`, or an optional one)
and then by `SearchConfig`'s own validation, so a field added there is accepted here without a
change. `batch_size` belongs to the server (its `--batch-size` bounds a dynamic batch), so a
request may not set it. Torch-free.
"""

from __future__ import annotations

import functools
import math
import types
from dataclasses import fields, replace
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from attnmt.common.errors import UserError
from attnmt.decoding.config import SearchConfig

# Integers an option may be: 64-bit signed (a seed goes to torch).
INT_RANGE = (-(2**63), 2**63 - 1)

# Fields a request may not set: field -> why (the server's flag that sets it).
SERVER_OWNED = {"batch_size": "the server batches requests itself (serve.py --batch-size)"}


class OptionError(UserError):
    """A request option that is unknown or invalid; the message names it."""


def option_names(config_type: type = SearchConfig) -> list[str]:
    """The option names a request may use, in the field order of `config_type`."""
    return [f.name for f in fields(config_type) if f.name not in SERVER_OWNED]


def search_config(options: dict[str, Any], defaults: SearchConfig) -> SearchConfig:
    """`defaults` with `options` (request key -> JSON value) applied and validated; the
    options are the fields of `type(defaults)` (`SearchConfig`, or a subclass).

    Raises:
        OptionError: a key that is not an option, a value of the wrong type, or a value that
            `SearchConfig` rejects (e.g. nbest > beam_size); the message names the key.
    """
    hints, known = _fields(type(defaults))
    values = {}
    for key, value in options.items():
        if key in SERVER_OWNED:
            raise OptionError(f"option {key!r} cannot be set per request: {SERVER_OWNED[key]}")
        if key not in known:
            raise OptionError(f"unknown option {key!r}; options are: {', '.join(known)}")
        values[key] = _checked(key, value, hints[key])
    try:
        return replace(defaults, **values)
    except (TypeError, ValueError) as e:
        raise OptionError(f"invalid options: {e}") from None


@functools.cache
def _fields(config_type: type) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The field annotations of `config_type` and its option names, resolved once per type
    (`get_type_hints` evaluates every annotation string: too slow for each request)."""
    return get_type_hints(config_type), tuple(option_names(config_type))


def as_dict(cfg: SearchConfig) -> dict[str, Any]:
    """The request options `cfg` amounts to (what a response reports back)."""
    return {name: getattr(cfg, name) for name in option_names(type(cfg))}


def _checked(key: str, value: Any, kind: Any) -> Any:
    """`value` converted to the annotation `kind` (an int is a valid float), else OptionError."""
    ok, converted = _convert(value, kind)
    if not ok:
        raise OptionError(f"option {key!r} must be {_describe(kind)}, got {value!r}")
    return converted


def _convert(value: Any, kind: Any) -> tuple[bool, Any]:
    origin = get_origin(kind)
    if origin is Literal:
        return value in get_args(kind) and not isinstance(value, bool), value
    if origin in (Union, types.UnionType):
        for member in get_args(kind):
            ok, converted = _convert(value, member)
            if ok:
                return True, converted
        return False, value
    if kind is type(None):
        return value is None, value
    if kind is bool:
        return isinstance(value, bool), value
    if kind is int:
        integer = isinstance(value, int) and not isinstance(value, bool)
        return integer and INT_RANGE[0] <= value <= INT_RANGE[1], value
    if kind is float:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        return number and math.isfinite(value), float(value) if number else value
    if kind is str:
        return isinstance(value, str), value
    return True, value  # another type: SearchConfig's own validation decides


def _describe(kind: Any) -> str:
    origin = get_origin(kind)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(kind))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(member) for member in get_args(kind))
    names = {int: "an integer", float: "a finite number", bool: "true or false", str: "a string"}
    return "null" if kind is type(None) else names.get(kind, getattr(kind, "__name__", str(kind)))

"""What the server serves: the models (each with its batcher), the default options, the limits,
the API keys and the request counters, and the routing of a request to a model. The routes
(`app`, `libretranslate`) and the OpenAPI document (`openapi`) read it; it imports neither.
Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from attnmt.data.languages import (
    LanguageError,
    is_multilingual,
    listed_codes,
    match_pair,
    resolve,
)
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.glossary import Glossary
from attnmt.server.batcher import JobQueue
from attnmt.server.documents import FileStore
from attnmt.server.keys import KeyRing
from attnmt.server.metrics import Metrics


class Limits(NamedTuple):
    """What one request may ask for (serve.py flags of the same names)."""

    max_sentences: int  # sentences per /translate request (LibreTranslate: lines, text nodes)
    max_chars: int  # characters per sentence
    max_beam: int  # beam_size
    max_output_tokens: int  # int(max_len_a * longest source in tokens + max_len_b)
    # candidates (beam_size, or nbest samples) x the output budgets of the request's
    # sentences, summed: the most output tokens its search may compute
    max_work: int = 32768
    client_timeout: float = 30.0  # seconds to send a request's headers, and its body

    @property
    def max_body(self) -> int:
        """Request body bytes: room for the sentences (UTF-8: <= 4 bytes a character, JSON
        escapes up to 6) and the options."""
        return self.max_sentences * (self.max_chars * 6 + 16) + 65536


@dataclass
class ServedModel:
    """One model: its id, languages, batcher (its process), source length function and the
    facts `GET /info` reports."""

    id: str
    sources: list[str]
    targets: list[str]
    batcher: JobQueue  # `Batcher`, or `worker.ModelProcess` (serve.py's)
    count_tokens: Callable[[list[str]], int]  # longest of the sentences, in source tokens
    info: dict[str, Any] = field(default_factory=dict)
    # What a request that names no search option gets: the model's run decoding (as
    # translate.py -c does) with serve.py's flags applied; None: the server's defaults.
    defaults: SearchConfig | None = None
    # The deployer's glossary (serve.py --glossary): a request's own entries override it.
    glossary: Glossary | None = None
    # check_terms(cfg, sentences, prefixes, glossary, langs): raises the `GlossaryError` that
    # translating would (a term over its sentence's output budget); None: no check.
    check_terms: Callable[..., None] | None = None
    # each sentence's length in source tokens (the work limit); None: all as the longest
    token_counts: Callable[[list[str]], list[int]] | None = None

    @property
    def multilingual(self) -> bool:
        return is_multilingual(self.sources, self.targets)

    def describe(self) -> str:
        pairs = f"{'|'.join(self.sources) or '?'}->{'|'.join(self.targets) or '?'}"
        return f"{pairs} (model {self.id!r})"


class RoutingError(Exception):
    """No served model for the request's model id or languages; the message lists them."""


@dataclass
class Service:
    """What the routes serve: the models (the first is the default), the server's default
    options, its limits and its API keys (None: no keys needed). `create_app` stores it on
    the Starlette app (`app.state.service`), where every handler reads it."""

    models: list[ServedModel]
    defaults: SearchConfig
    limits: Limits
    keys: KeyRing | None = None
    in_flight: int = 0  # /translate and /attention requests received and not yet answered
    answered: int = 0  # ... answered (with a result or an error)
    cancelled: int = 0  # ... dropped unanswered when the shutdown timeout ran out
    gone: int = 0  # ... dropped because the client closed its connection first
    uploads: int = 0  # /translate_file requests being read or translated
    metrics: Metrics | None = None  # set by `create_app`
    files: FileStore = field(default_factory=FileStore)  # translated files to download
    types: Any = None  # the request types (`requests.Types`), set by `create_app`
    _languages: dict[str, tuple[str, list[str]]] | None = field(default=None, repr=False)

    def defaults_for(self, model: ServedModel) -> SearchConfig:
        """The options a request to `model` starts from, before its own fields apply."""
        return model.defaults or self.defaults

    def route(
        self, model_id: str | None, src: str | None, tgt: str | None
    ) -> tuple[ServedModel, tuple[str | None, str | None]]:
        """The model for a request and the pair to hand it, in the model's own codes (`src`
        and `tgt` may be any form of a code, `data.languages.resolve`): by id when given (its
        languages must then fit), else the first model (in `-c` order) that has `src` among
        its sources and `tgt` among its targets, else the default model when no language is
        named."""
        served = "; served: " + ", ".join(m.describe() for m in self.models)
        if model_id is not None:
            model = next((m for m in self.models if m.id == model_id), None)
            if model is None:
                raise RoutingError(f"unknown model {model_id!r}{served}")
            try:  # translate.py's rule for --src-lang/--tgt-lang too
                match_pair(src, tgt, model.sources, model.targets)
            except LanguageError as e:
                raise RoutingError(f"model {model_id!r}: {e}{served}") from None
        elif src is None and tgt is None:
            model = self.models[0]
        else:
            found = [
                m for m in self.models
                if (src is None or resolve(src, m.sources) is not None)
                and (tgt is None or resolve(tgt, m.targets) is not None)
            ]  # fmt: skip
            if not found:
                raise RoutingError(
                    f"no model translates {src or '?'} -> {tgt or '?'}{self._unknown(src, tgt)}"
                    f"{served}"
                )
            model = found[0]
        if not model.multilingual:
            return model, (None, None)
        src = model.sources[0] if src is None and len(model.sources) == 1 else src
        tgt = model.targets[0] if tgt is None and len(model.targets) == 1 else tgt
        if src is None or tgt is None:
            raise RoutingError(
                f"model {model.id!r} is multilingual; name both the source and the target "
                f"language{served}"
            )
        return model, (resolve(src, model.sources) or src, resolve(tgt, model.targets) or tgt)

    def languages(self) -> dict[str, tuple[str, list[str]]]:
        """Every language a served model reads or writes, by its listed code (ISO 639-1 where
        one exists, `data.languages.listed_codes`): listed code -> (a model's own code for it,
        the listed codes it translates into), sources first, in `-c` order."""
        if self._languages is not None:  # the models do not change: made once
            return self._languages
        codes = [c for m in self.models for c in [*m.sources, *m.targets]]
        listed = listed_codes(list(dict.fromkeys(codes)))
        found: dict[str, tuple[str, list[str]]] = {}
        for model in self.models:
            for src in model.sources:
                _, targets = found.setdefault(listed[src], (src, []))
                targets += [
                    listed[t] for t in model.targets
                    if listed[t] not in targets and listed[t] != listed[src]
                ]  # fmt: skip
        for model in self.models:
            for tgt in model.targets:
                found.setdefault(listed[tgt], (tgt, []))
        self._languages = found
        return found

    def _unknown(self, *codes: str | None) -> str:
        """The message's note on codes no served model has (with the served languages), or
        ""."""
        every = [c for m in self.models for c in [*m.sources, *m.targets]]
        unknown = [c for c in codes if c is not None and resolve(c, every) is None]
        if not unknown:
            return ""
        names = " and ".join(repr(c) for c in dict.fromkeys(unknown))
        return f" ({names}: no served model has it; languages: {', '.join(self.languages())})"

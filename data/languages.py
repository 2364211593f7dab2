"""Language codes in every form a user writes them, matched against the codes a model has.

A model names its languages in its own codes: a model trained here by its run's
`data.src_lang`/`data.tgt_lang` (`en`), an imported OPUS-MT model by ISO 639-3 (`deu`, from
`>>deu<<`), NLLB by language and script (`eng_Latn`). A user may name the same language as
ISO 639-1 (`de`), ISO 639-3 (`deu`), BCP-47 (`de-DE`, `zh-Hant`), NLLB's form or OPUS-MT's
`>>deu<<`. `resolve` finds the model's own code for any of them (langcodes parses them;
a macrolanguage's main member counts as the macrolanguage: `arb`, `cmn` are `ar`, `zh`), and
`listed_codes` gives the code a list shows (LibreTranslate's: ISO 639-1 where one exists, a
script only where two codes of one language need it). `detect` identifies the language of a
text among given codes (py3langid, imported on first use: it is in the serve extra).
Torch-free.
"""

from __future__ import annotations

import copy
import threading
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import langcodes  # imported where used: training reaches this module (imported
    # tokenizers resolve codes) and needs neither the package nor its ~0.1 s import

# A request for the left one finds the right one when a model has no code of the left's
# language (ISO 639-1 `no`, Norwegian, is written Bokmål `nb`/`nob` by NLLB and Marian).
FALLBACKS = {"no": "nb"}


@lru_cache(maxsize=4096)
def parse(code: str) -> langcodes.Language | None:
    """`code` as a langcodes Language, in its standard form (`deu`, `eng_Latn`, `>>deu<<`,
    `de-DE`, `DE` all have the language `de`); None when it is no known language code."""
    import langcodes

    text = code.strip()
    if text.startswith(">>") and text.endswith("<<"):
        text = text[2:-2]
    try:
        tag = langcodes.standardize_tag(text.replace("_", "-"), macro=True)
        lang = langcodes.Language.get(tag)
    except (ValueError, LookupError):  # LanguageTagError is a ValueError
        return None
    return lang if lang.language and lang.is_valid() else None


def _script(lang: langcodes.Language) -> str | None:
    """The script a code names or, when it names none, the language's usual one."""
    return lang.script or lang.maximize().script


def resolve(code: str, codes: list[str]) -> str | None:
    """The one of `codes` (a model's own) that `code` names, or None. An exact code wins; else
    the same language, in the script `code` names (or its usual script: `zh` is `zho_Hans`,
    `zh-TW` is `zho_Hant`), in its region when it names one (`pt-BR`) and some code has one."""
    if code in codes:
        return code
    wanted = parse(code)
    if wanted is None:
        return next((c for c in codes if c.lower() == code.strip().lower()), None)
    found = [(c, lang) for c in codes if (lang := parse(c)) and lang.language == wanted.language]
    if not found and wanted.language in FALLBACKS:
        return resolve(FALLBACKS[wanted.language], codes)
    if wanted.script is not None:  # a script asked for by name must be the one
        found = [(c, lang) for c, lang in found if _script(lang) == wanted.script]
    if not found:
        return None
    script = _script(wanted)

    def rank(item: tuple[str, langcodes.Language]) -> tuple[bool, bool]:
        lang = item[1]
        return (_script(lang) != script, lang.territory != wanted.territory)

    return min(found, key=rank)[0]


def same_language(a: str, b: str) -> bool:
    """Whether two codes name one language (in one script): `en`, `eng` and `eng_Latn`."""
    return resolve(a, [b]) is not None and resolve(b, [a]) is not None


def listed_codes(codes: list[str]) -> dict[str, str]:
    """Model code -> the code a list shows: ISO 639-1 where one exists (ISO 639-3 where not),
    with the script where two of `codes` are one language in two scripts (`zh-Hans`,
    `zh-Hant`), the region where they differ only there; a code langcodes does not know is
    shown as it is."""
    parsed = {c: parse(c) for c in codes}
    by_language: dict[str, set[tuple[str | None, str | None]]] = {}
    for lang in parsed.values():
        if lang is not None:
            by_language.setdefault(lang.language, set()).add((_script(lang), lang.territory))
    shown = {}
    for code, lang in parsed.items():
        if lang is None:
            shown[code] = code
            continue
        kinds = by_language[lang.language]
        scripts = {script for script, _ in kinds}
        parts = {"language": lang.language}
        if len(scripts) > 1:
            parts["script"] = _script(lang)
        if len(kinds) > len(scripts):
            parts["territory"] = lang.territory
        shown[code] = _language_tag(parts)
    return shown


def _language_tag(parts: dict[str, str | None]) -> str:
    import langcodes

    return langcodes.Language.make(**parts).to_tag()


def language_name(code: str) -> str:
    """The English name of a code (`de`, `deu`, `eng_Latn`, `zh-Hant`); the code itself when
    it is no known language."""
    lang = parse(code)
    return lang.display_name("en") if lang is not None else code


def describe_codes(codes: list[str], limit: int = 40) -> str:
    """`codes` for a one-line message: each with its listed code when that differs
    (`deu (de), fra (fr)`), at most `limit` of them."""
    listed = listed_codes(codes)
    shown = [c if listed[c] == c else f"{c} ({listed[c]})" for c in codes[:limit]]
    more = f", ... ({len(codes)} in all)" if len(codes) > limit else ""
    return ", ".join(shown) + more


# --- the languages of a checkpoint -------------------------------------------------------------


def model_languages(ckpt: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(source codes, target codes) of a checkpoint dict, in the model's own codes: an
    imported model's top-level `languages` (`{"source": [...], "target": [...]}`), else its
    training config's `data.src_lang`/`data.tgt_lang`; ([], []) when it names none (such a
    model is reached by its id, or as the default model)."""
    declared = ckpt.get("languages")
    if isinstance(declared, dict) and (declared.get("source") or declared.get("target")):
        return [str(c) for c in declared.get("source") or []], [
            str(c) for c in declared.get("target") or []
        ]
    data = (ckpt.get("config") or {}).get("data") or {}
    src, tgt = data.get("src_lang"), data.get("tgt_lang")
    return ([str(src)] if src else []), ([str(tgt)] if tgt else [])


class LanguageError(ValueError):
    """A code that names none of a model's languages of its side (`side`: "source" or
    "target"); the message names the model's pair."""

    def __init__(self, message: str, side: str) -> None:
        super().__init__(message)
        self.side = side


def describe_pair(sources: list[str], targets: list[str], limit: int = 8) -> str:
    """A model's pair for a one-line message: `en -> de`, `eng_Latn (en), ... -> ...`."""
    return f"{describe_codes(sources, limit) or '?'} -> {describe_codes(targets, limit) or '?'}"


def match_pair(
    src: str | None, tgt: str | None, sources: list[str], targets: list[str]
) -> tuple[str | None, str | None]:
    """The model's own codes for the pair a user names (None where none is named): the one
    rule of translate.py's --src-lang/--tgt-lang and the server's source/target. A code in
    any form of one of the model's languages of its side names it (`resolve`: `en`, `eng`,
    `en-US`, `eng_Latn` for a model of `en`), whether or not the model has language tokens: a
    model trained here knows its pair from its run's `data.src_lang`/`data.tgt_lang`. A side
    whose model names no language takes a code as it is (there is nothing to check it by).

    Raises:
        LanguageError: a code naming none of its side's languages; the message names the
            model's pair.
    """
    found = []
    for code, codes, side in ((src, sources, "source"), (tgt, targets, "target")):
        own = code if code is None or not codes else resolve(code, codes)
        if own is None and code is not None:
            named = language_name(code)
            what = f"{code!r}" + (f" ({named})" if named != code else "")
            raise LanguageError(
                f"this model has no {side} language {what}; it translates "
                f"{describe_pair(sources, targets)}",
                side,
            )
        found.append(own)
    return found[0], found[1]


def is_multilingual(sources: list[str], targets: list[str]) -> bool:
    """Whether the model must be told the pair to translate (`Translator` methods'
    `src_lang=`/`tgt_lang=`): it has more than one source or target language."""
    return len(sources) > 1 or len(targets) > 1


# --- language identification ------------------------------------------------------------------

_IDENTIFIERS: dict[tuple[str, ...], Any] = {}  # py3langid labels -> an identifier of those only
_LOCK = threading.Lock()


def _identifier(labels: tuple[str, ...]) -> Any:
    """A py3langid identifier restricted to `labels` (made once per set: loading the model
    takes a second)."""
    with _LOCK:
        if () not in _IDENTIFIERS:  # () stands for every language py3langid knows
            from py3langid.langid import MODEL_FILE, LanguageIdentifier

            _IDENTIFIERS[()] = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        if labels not in _IDENTIFIERS:
            restricted = copy.copy(_IDENTIFIERS[()])  # set_languages rebinds, never mutates
            restricted.set_languages(list(labels))
            _IDENTIFIERS[labels] = restricted
        return _IDENTIFIERS[labels]


def identifiable(codes: list[str]) -> dict[str, str]:
    """Code -> the py3langid label that stands for it, for the codes py3langid knows (the
    first code of a language takes its label)."""
    labels = set(_identifier(()).labels) - {"zxx"}  # zxx: "no linguistic content"
    found: dict[str, str] = {}
    for code in codes:
        lang = parse(code)
        if lang is None:
            continue
        label = "no" if lang.language == "nb" else lang.language
        if label in labels and label not in found.values():
            found[code] = label
    return found


def detect(text: str, codes: list[str]) -> list[tuple[str, float]]:
    """(code, confidence 0..100) for the codes py3langid knows among `codes`, best first
    (LibreTranslate's `/detect`); [] when it knows none of them."""
    labels = identifiable(codes)
    if not labels:
        return []
    code_of = {label: code for code, label in labels.items()}
    if len(labels) == 1:
        return [(next(iter(labels)), 100.0)]
    ranked = _identifier(tuple(sorted(code_of))).rank(text)
    return [(code_of[label], round(100.0 * p, 2)) for label, p in ranked]

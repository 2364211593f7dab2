"""Source terms annotated inline with their target terms, so that a model learns to copy a
given target term to where its source term is (Dinu et al. 2019, "Training Neural Machine
Translation To Apply Terminology Constraints").

At training time (`data.term_annotation`), where a training pair holds a term of the
dictionary on both sides (the source term as whole words, any case, in the source; the target
term as written, whole words, in the reference), the source gets the target term inline:

    append:   a <t> bike <r> Fahrrad </t> is red      (the source term, then its target term)
    replace:  a <r> Fahrrad </t> is red               (the target term instead)

The markers are SentencePiece user-defined symbols (one id each, anywhere in a text), added to
the model only when annotation is on, so the tokenizer of an annotated model says how it was
trained (`annotation_mode`) and translation annotates a glossary's terms the same way
(`decoding.glossary.annotated_sources`). The dictionary is a `source<TAB>target` file (the
glossary format, `data.glossary`) or is learnt from the training pairs (`learn_dictionary`).

Torch- and `datasets`-free: translation imports it.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields

from attnmt.common.errors import UserError
from attnmt.data.errors import DataError
from attnmt.data.glossary import Glossary, GlossaryError, Term, uses_term

START, TARGET, END = "<t>", "<r>", "</t>"
MODES = ("none", "append", "replace")
# The user-defined symbols each mode adds to the SentencePiece model.
MARKERS = {"none": [], "append": [START, TARGET, END], "replace": [TARGET, END]}
KEY = "data.term_annotation"
# A dictionary word: letters only (no digits, no punctuation), compared casefolded.
_WORD = re.compile(r"[^\W\d_]+")
LEARNT = "the learnt dictionary"  # the origin of a learnt term


@dataclass(frozen=True)
class TermAnnotation:
    """`data.term_annotation` (one key per field).

    Attributes:
        mode: `none` (off), `append` or `replace` (the module docstring shows both).
        terms: A `source term<TAB>target term` file; None: a dictionary learnt from the
            training pairs (the keys below).
        rate: The probability that a matching occurrence is annotated (Dinu et al.: 1); below
            1 the model also keeps translating sources without annotation.
        seed: Draws the occurrences a `rate` below 1 annotates, from the pair's row and the
            occurrence's place alone, so every run and resume annotates the same ones.
        min_count: A learnt pair's words each occur in, and co-occur in, at least this many
            training pairs.
        min_dice: A learnt pair's Dice coefficient over the training pairs,
            2 * both / (source + target), is at least this.
        stop_words: The most frequent words of each side, this many, are never learnt.
        sample: Learn from the first this many training pairs (0: all).
    """

    mode: str = "none"
    terms: str | None = None
    rate: float = 1.0
    seed: int = 1
    min_count: int = 5
    min_dice: float = 0.5
    stop_words: int = 50
    sample: int = 200_000

    @property
    def markers(self) -> list[str]:
        return list(MARKERS[self.mode])


def annotation_config(values: dict | None) -> TermAnnotation:
    """`data.term_annotation` checked.

    Raises:
        DataError: an unknown key, an unknown mode, a rate outside [0, 1], or a learning
            setting out of range; the message names the key and the fix.
    """
    values = dict(values or {})
    known = [f.name for f in fields(TermAnnotation)]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise DataError(
            f"unknown key(s) {', '.join(f'{KEY}.{k}' for k in unknown)}; valid keys: "
            f"{', '.join(known)}"
        )
    cfg = TermAnnotation(**values)
    if cfg.mode not in MODES:
        raise DataError(f"{KEY}.mode={cfg.mode} is not one of {'|'.join(MODES)}")
    if cfg.terms is not None and not isinstance(cfg.terms, str):
        raise DataError(f"{KEY}.terms={cfg.terms} must be the path of a TSV file, or null")
    number = (int, float)
    if not isinstance(cfg.rate, number) or not 0.0 <= cfg.rate <= 1.0:
        raise DataError(
            f"{KEY}.rate={cfg.rate} must be in [0, 1] (the share of matching term occurrences "
            "annotated, e.g. 1 or 0.5)"
        )
    if not isinstance(cfg.min_dice, number) or not 0.0 < cfg.min_dice <= 1.0:
        raise DataError(f"{KEY}.min_dice={cfg.min_dice} must be in (0, 1], e.g. 0.5")
    for key in ("seed", "min_count", "stop_words", "sample"):
        value = getattr(cfg, key)
        if not isinstance(value, int) or value < (1 if key == "min_count" else 0):
            least = 1 if key == "min_count" else 0
            raise DataError(f"{KEY}.{key}={value} must be a whole number >= {least}")
    return cfg


def read_dictionary(cfg: TermAnnotation) -> Glossary | None:
    """The `terms` file of `cfg` as a glossary; None when the dictionary is to be learnt.

    Raises:
        DataError: the file is missing or unreadable, or a line is not `source<TAB>target`.
    """
    if cfg.terms is None:
        return None
    try:
        return Glossary.from_file(cfg.terms, f"{KEY}.terms")
    except GlossaryError as e:
        raise DataError(f"{KEY}.terms: {e}") from None
    except UserError as e:  # missing, unreadable or not UTF-8: the message names the key
        raise DataError(str(e)) from None


def annotation_mode(tags: Iterable[str]) -> str:
    """How a model whose tokenizer has these user-defined symbols was trained: `append`,
    `replace` or `none`."""
    tags = set(tags)
    for mode in ("append", "replace"):
        if set(MARKERS[mode]) <= tags:
            return mode
    return "none"


def annotate(
    sentence: str,
    spans: list[tuple[int, int, Term]],
    mode: str,
    keep: Callable[[int], bool] | None = None,
) -> str:
    """`sentence` with the term at each span (`Glossary.spans`) annotated the `mode` way;
    `keep(k)` says whether the k-th span is (None: every one)."""
    out, last = [], 0
    for k, (start, end, term) in enumerate(spans):
        if keep is not None and not keep(k):
            continue
        if mode == "append":
            inline = f"{START} {sentence[start:end]} {TARGET} {term.target} {END}"
        else:
            inline = f"{TARGET} {term.target} {END}"
        out += [sentence[last:start], inline]
        last = end
    return "".join([*out, sentence[last:]])


def annotate_pair(src: str, tgt: str, glossary: Glossary, cfg: TermAnnotation, row: int) -> str:
    """The training source `src` annotated: each occurrence of a source term whose target
    term the reference `tgt` uses (as written, whole words), with probability `cfg.rate`
    drawn from (`cfg.seed`, `row`, the occurrence's place)."""
    spans = [span for span in glossary.spans(src) if uses_term(tgt, span[2].target)]
    if not spans:
        return src
    if cfg.rate >= 1.0:
        return annotate(src, spans, cfg.mode)
    return annotate(src, spans, cfg.mode, lambda k: _uniform(cfg.seed, row, k) < cfg.rate)


def _uniform(seed: int, row: int, k: int) -> float:
    """A number in [0, 1) fixed by its arguments (the same in every process and run)."""
    digest = hashlib.blake2b(f"{seed}:{row}:{k}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True)
class DictionaryPair:
    source: str  # casefolded
    target: str  # its most frequent written form in the references
    count: int  # training pairs that hold both
    dice: float


def learn_dictionary(pairs: Iterable[tuple[str, str]], cfg: TermAnnotation) -> list[DictionaryPair]:
    """Word pairs that are each other's best translation by Dice coefficient over `pairs`
    (source, reference), best first: casefolded whole words of letters, each in at least
    `cfg.min_count` pairs and not among the `cfg.stop_words` most frequent of its side, that
    co-occur in `cfg.min_count` pairs or more with a Dice coefficient of `cfg.min_dice` or
    more, each word in one pair at most."""
    sides: list[tuple[set[str], set[str]]] = []
    count_s, count_t, written = Counter(), Counter(), Counter()
    for n, (src, tgt) in enumerate(pairs):
        if cfg.sample and n >= cfg.sample:
            break
        words_t = _WORD.findall(tgt)
        s, t = {w.casefold() for w in _WORD.findall(src)}, {w.casefold() for w in words_t}
        sides.append((s, t))
        count_s.update(s)
        count_t.update(t)
        written.update((w.casefold(), w) for w in words_t)
    keep_s = _content_words(count_s, cfg)
    keep_t = _content_words(count_t, cfg)
    both: Counter = Counter()
    for s, t in sides:
        both.update((a, b) for a in s & keep_s for b in t & keep_t)
    best_t: dict[str, tuple] = {}
    best_s: dict[str, tuple] = {}
    for (a, b), n in both.items():
        if n < cfg.min_count:
            continue
        rank = (2 * n / (count_s[a] + count_t[b]), n)
        if (rank, b) > best_t.get(a, ((0.0, 0), "")):
            best_t[a] = (rank, b)
        if (rank, a) > best_s.get(b, ((0.0, 0), "")):
            best_s[b] = (rank, a)
    surface: dict[str, tuple[int, str]] = {}
    for (folded, form), n in written.items():
        surface[folded] = max(surface.get(folded, (0, "")), (n, form))
    found = [
        DictionaryPair(a, surface[b][1], rank[1], rank[0])
        for a, (rank, b) in best_t.items()
        if best_s[b][1] == a and rank[0] >= cfg.min_dice
    ]
    return sorted(found, key=lambda p: (-p.dice, -p.count, p.source))


def _content_words(counts: Counter, cfg: TermAnnotation) -> set[str]:
    stop = {w for w, _ in counts.most_common(cfg.stop_words)} if cfg.stop_words else set()
    return {w for w, n in counts.items() if n >= cfg.min_count and w not in stop}


def dictionary_glossary(learnt: list[DictionaryPair]) -> Glossary:
    """The learnt pairs as a glossary (source word -> its target's written form)."""
    return Glossary(Term(p.source, p.target, LEARNT) for p in learnt)

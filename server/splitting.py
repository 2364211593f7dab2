"""The texts of a request as the sentences a model translates, and back (both APIs).

A text is cut into pieces (`format: text`, both APIs: its lines, "\n" or "\r\n"; `format:
html`: its text nodes, `html.Document`), and each piece, when splitting is on, into sentences
(`data.sentences`, by the source language). Every sentence of every text goes to the model in
one job; `render` puts each text back together: its pieces' whitespace (blank lines too), line
breaks and markup as they came, each sentence replaced by its translation (`Split.join`, as
translate.py --split-sentences does). Torch-free.
"""

from __future__ import annotations

from typing import Any

from attnmt.data.sentences import Split, split_line, splitting_language
from attnmt.server.handling import error
from attnmt.server.html import Document
from attnmt.server.service import Limits, ServedModel


class Texts:
    """`texts` as a flat list of `sentences`; `render_one(i, translations)` is text i with
    its sentences' translations, `render` every text."""

    def __init__(self, texts: list[str], lang: str | None, split: bool, fmt: str = "text") -> None:
        code = splitting_language(lang)[0]  # an unknown language: English rules
        self._docs = [Document(t) if fmt == "html" else None for t in texts]
        self._pieces: list[list[Split]] = []
        self.longest = 0  # characters of the longest piece (stripped), before splitting
        for text, doc in zip(texts, self._docs, strict=True):
            pieces = doc.segments if doc is not None else text.split("\n")
            self._pieces.append([_piece(p, code, split) for p in pieces])
            self.longest = max([self.longest, *(len(p.strip()) for p in pieces)])
        self.sentences = [s for pieces in self._pieces for p in pieces for s in p.sentences]

    def counts(self) -> list[int]:
        """Sentences per text."""
        return [sum(len(p.sentences) for p in pieces) for pieces in self._pieces]

    def chunks(self, per_sentence: list[Any]) -> list[list[Any]]:
        """`per_sentence` (one item per sentence, in order) cut into one list per text."""
        out, start = [], 0
        for n in self.counts():
            out.append(per_sentence[start : start + n])
            start += n
        return out

    def render_one(self, i: int, translations: list[str]) -> str:
        """Text i with its sentences replaced by `translations` (its sentences' count)."""
        parts, start = [], 0
        for piece in self._pieces[i]:
            end = start + len(piece.sentences)
            parts.append(piece.join(translations[start:end]))
            start = end
        doc = self._docs[i]
        return doc.render(parts) if doc is not None else "\n".join(parts)

    def render(self, translations: list[str]) -> list[str]:
        """Every text, from the translations of `sentences` in order."""
        chunks = self.chunks(translations)
        return [self.render_one(i, chunk) for i, chunk in enumerate(chunks)]

    def best(self, hyps: list[list[tuple[str, float]]]) -> list[list[tuple[str, float]]]:
        """Per sentence n-best lists -> per text a one-entry list: (its sentences' best
        translations rendered, the sum of their scores)."""
        return [
            [(self.render_one(i, [n[0][0] for n in chunk]), sum(n[0][1] for n in chunk))]
            for i, chunk in enumerate(self.chunks(hyps))
        ]


def split_ours(
    sentences: list[str],
    prefixes: list[str] | None,
    nbest: int,
    model: ServedModel,
    src_lang: str | None,
    limits: Limits,
) -> Texts:
    """Our API's `split_sentences: true`: each of `sentences` (a text) split by the source
    language; 422 with prefixes or nbest (both per text), 413 past the limits."""
    if prefixes is not None:
        raise error(422, "'prefixes' and 'split_sentences' do not go together (a prefix is "
                    "per text); drop one")  # fmt: skip
    if nbest > 1:
        raise error(422, "option 'nbest' above 1 and 'split_sentences' do not go together "
                    "(a text's n-best list is not its sentences'); drop one")  # fmt: skip
    texts = Texts(sentences, source_language(model.sources, src_lang), True)
    check_limits(texts, limits, 413)
    return texts


def check_limits(texts: Texts, limits: Limits, status: int, prefix: str = "") -> None:
    """The deployer's limits on a split request: --max-chars bounds each piece as sent (a
    line, a text node, one of our texts), --max-sentences the sentences after splitting (what
    the model translates). `status`, `prefix`: the API's error code and message start."""
    if texts.longest > limits.max_chars:
        raise error(
            status,
            f"{prefix}a line or text of {texts.longest} characters, the limit is "
            f"{limits.max_chars} (serve.py --max-chars); split it",
        )
    if len(texts.sentences) > limits.max_sentences:
        raise error(
            status,
            f"{prefix}{len(texts.sentences)} sentences after sentence splitting, the limit "
            f"is {limits.max_sentences} (serve.py --max-sentences); send less text at a time",
        )


def _piece(text: str, lang: str, split: bool) -> Split:
    if split:
        return split_line(text, lang)
    core = text.strip()  # one sentence, its whitespace kept around it
    if not core:
        return Split(text, [], [])
    start = len(text) - len(text.lstrip())
    return Split(text[:start], [core], [text[start + len(core) :]])


def source_language(sources: list[str], requested: str | None) -> str | None:
    """The language a request's text is in: the one it names (not "auto"), else the model's
    only source language, else None (split by English rules)."""
    if requested and requested != "auto":
        return requested
    return sources[0] if len(sources) == 1 else None

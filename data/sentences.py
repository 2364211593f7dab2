"""Sentence splitting of documents: a line (a paragraph) -> its sentences, and back.

A model trained on sentences drops or merges content when it is given a paragraph, so
`translate.py --split-sentences` and the server split each line into sentences, translate
them all in one batch, and put each line's translations back together with the line's own
spacing. The splitter is sentencex (rules and abbreviation lists for ~300 languages, offline),
chosen by the source language's ISO 639-1 code (`splitting_language`); a language it has no
rules for follows sentencex's own fallback chain, which ends at English's rules.

Invariants (`split_line`): `line == lead + s[0] + gaps[0] + s[1] + ... + s[-1] + gaps[-1]`,
every sentence non-empty and without leading or trailing whitespace, every gap whitespace;
a line that is empty or only whitespace has no sentence and is its `lead`. Nothing is dropped:
a line's translation is its sentences' translations, each in its place, with the line's
whitespace as it came (`Split.join`: the one rejoining rule of translate.py and the server).
"""

from __future__ import annotations

from typing import NamedTuple

import sentencex

from attnmt.data.languages import parse

FALLBACK = "en"  # the rules used for a language nobody named


class Split(NamedTuple):
    """One line as sentences and the whitespace around them."""

    lead: str  # whitespace before the first sentence
    sentences: list[str]  # stripped, non-empty
    gaps: list[str]  # whitespace after each sentence (the last one: the line's trailing)

    def join(self, translations: list[str]) -> str:
        """The line with each sentence replaced by its translation, its whitespace (before,
        between and after the sentences; a blank line's) as it came."""
        if len(translations) != len(self.sentences):
            raise ValueError(f"{len(translations)} translations for {len(self.sentences)}")
        parts = [self.lead]
        for text, gap in zip(translations, self.gaps, strict=True):
            parts += [text, gap]
        return "".join(parts)


def splitting_language(code: str | None) -> tuple[str, str | None]:
    """(the ISO 639-1 code sentencex splits `code`'s text by, a warning or None). Any code
    `languages.parse` reads (`de`, `deu`, `de-AT`, `deu_Latn`, `>>deu<<`); a missing or
    unknown code gives English rules and a warning that says so."""
    if code:
        lang = parse(code)
        if lang is not None:
            return lang.language, None
        reason = f"the language code {code!r} is unknown"
    else:
        reason = "the source language is unknown"
    return FALLBACK, f"{reason}; sentences are split by English rules"


def split_line(line: str, lang: str) -> Split:
    """`line`'s sentences (sentencex, `lang` an ISO 639-1 code) and the whitespace between
    them; see the module's invariants."""
    segments = list(sentencex.segment(lang, line))
    if "".join(segments) != line:  # sentencex keeps every character; if not, do not split
        segments = [line]
    lead, sentences, gaps = "", [], []
    for segment in segments:
        core = segment.strip()
        start = len(segment) - len(segment.lstrip())
        before, after = segment[:start], segment[start + len(core) :]
        if not sentences:
            lead += before
        else:
            gaps[-1] += before
        if core:
            sentences.append(core)
            gaps.append(after)
        elif not sentences:
            lead += after
        else:
            gaps[-1] += after
    return Split(lead, sentences, gaps)


class SplitLines(NamedTuple):
    """A batch of lines split into one flat list of sentences (what is translated, in one
    batch), and how to put the translations back into lines."""

    splits: list[Split]

    @property
    def sentences(self) -> list[str]:
        return [s for split in self.splits for s in split.sentences]

    def counts(self) -> list[int]:
        """Sentences per line."""
        return [len(split.sentences) for split in self.splits]

    def rejoin(self, translations: list[str]) -> list[str]:
        """One translated line per line, from the translations of `sentences` in order."""
        expected = sum(self.counts())
        if len(translations) != expected:
            raise ValueError(f"{len(translations)} translations for {expected}")
        lines, start = [], 0
        for split in self.splits:
            end = start + len(split.sentences)
            lines.append(split.join(translations[start:end]))
            start = end
        return lines


def split_lines(lines: list[str], lang: str) -> SplitLines:
    """Each of `lines` split into sentences by `lang`'s rules (an ISO 639-1 code; see
    `splitting_language` for any other code)."""
    return SplitLines([split_line(line, lang) for line in lines])

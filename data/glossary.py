"""Glossaries on text: `source term<TAB>target term` files or mappings, and where their source
terms occur (torch-free, so the command line checks a glossary before loading torch). Training
reads the same files (`data.terms`: term annotation); decoding constrains the search with them
(`decoding.constraints`, through `decoding.glossary`).

A source term is found in a sentence on whole words, case-insensitively, longest terms first,
never overlapping, each once per sentence; its target term must then appear in the translation
exactly as written (`decoding.constraints`). A term mapped to itself is a do-not-translate term.

Case-insensitive is one rule everywhere (`fold`): Unicode's default caseless matching,
`str.casefold`. Two source terms that fold alike are one term, and a sentence is matched in its
folded form against the folded terms, so every match is a folded term: "STRASSE" finds
"Straße", "ǆ" finds "ǅ", and "İstanbul" (whose dotted capital folds to "i" + U+0307) finds a
term written "İstanbul" but not one written "Istanbul".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from attnmt.common.errors import UserError
from attnmt.common.files import read_lines


class GlossaryError(UserError):
    """A glossary line or entry that cannot be used; the message names where it is."""


@dataclass(frozen=True)
class Term:
    source: str
    target: str
    origin: str  # where it was given: "FILE:LINE", or "glossary entry 'SOURCE'"


class Glossary:
    """Source terms -> target terms, with the whole-word, case-insensitive matcher.

    Raises:
        GlossaryError: an empty term, or one source term given two different targets.
    """

    def __init__(self, terms: Iterable[Term]) -> None:
        self.terms: list[Term] = []
        seen: dict[str, Term] = {}
        for term in terms:
            if not term.source.strip() or not term.target.strip():
                side = "source" if not term.source.strip() else "target"
                raise GlossaryError(f"{term.origin}: the {side} term is empty; give both terms")
            key = fold(term.source)
            if key in seen:
                if seen[key].target != term.target:
                    raise GlossaryError(
                        f"{term.origin}: {term.source!r} is already mapped to "
                        f"{seen[key].target!r} at {seen[key].origin}; keep one of the two"
                    )
                continue
            seen[key] = term
            self.terms.append(Term(term.source.strip(), term.target.strip(), term.origin))
        # longest source terms first, so "young boy" wins over "boy" where both match
        keys = sorted((fold(t.source) for t in self.terms), key=len, reverse=True)
        self._by_key = {fold(t.source): t for t in self.terms}
        alternatives = "|".join(r"\s+".join(map(re.escape, k.split())) for k in keys)
        self._pattern = re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)")  # on folded text

    def __len__(self) -> int:
        return len(self.terms)

    @classmethod
    def from_file(cls, path: str, label: str = "--glossary") -> Glossary:
        """A TSV file of `source term<TAB>target term` lines (blank lines are skipped); `label`
        names the option that gave the path in the message of a missing file."""
        terms = []
        for number, line in enumerate(read_lines(path, label), start=1):
            if not line.strip():
                continue
            fields = line.split("\t")
            where = f"{path}:{number}"
            if len(fields) != 2:
                found = "no tab" if len(fields) == 1 else f"{len(fields) - 1} tabs"
                raise GlossaryError(f"{where}: {found}; each line is 'source term<TAB>target term'")
            terms.append(Term(fields[0], fields[1], where))
        return cls(terms)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, str]) -> Glossary:
        """`{"source term": "target term"}` (the server's `glossary` field)."""
        terms = []
        for source, target in mapping.items():
            if not isinstance(source, str) or not isinstance(target, str):
                raise GlossaryError("glossary: each term must be a string")
            terms.append(Term(source, target, f"glossary entry {source!r}"))
        return cls(terms)

    def updated(self, overrides: Glossary) -> Glossary:
        """These terms, with those of `overrides` in place of any that have the same source
        term (a server request's glossary over the model's default one)."""
        replaced = {fold(t.source) for t in overrides.terms}
        kept = [t for t in self.terms if fold(t.source) not in replaced]
        return Glossary([*kept, *overrides.terms])

    def find(self, sentence: str) -> list[Term]:
        """The terms whose source occurs in `sentence` (whole words, any case), each once, in
        order of first occurrence."""
        if not self.terms:
            return []
        found: dict[str, Term] = {}
        for match in self._pattern.finditer(sentence.casefold()):
            term = self._by_key[_words(match.group())]  # a folded key: casefold is idempotent
            found.setdefault(term.source, term)
        return list(found.values())

    def spans(self, sentence: str) -> list[tuple[int, int, Term]]:
        """Every occurrence of a source term in `sentence` as `(start, end, term)`, offsets
        into `sentence` itself, in order: the matches of `find` (whole words, any case,
        longest first, never overlapping), each occurrence, not only the first."""
        if not self.terms:
            return []
        folded, origin = [], []  # origin[k]: the sentence offset of folded character k
        for i, char in enumerate(sentence):
            piece = char.casefold()  # casefolding maps each character on its own
            folded.append(piece)
            origin += [i] * len(piece)
        found = []
        for match in self._pattern.finditer("".join(folded)):
            start, end = origin[match.start()], origin[match.end() - 1] + 1
            found.append((start, end, self._by_key[_words(match.group())]))
        return found


def _words(text: str) -> str:
    return " ".join(text.split())


def fold(text: str) -> str:
    """The form a source term is matched and looked up by: its words, casefolded."""
    return _words(text.casefold())


def uses_term(text: str, target: str) -> bool:
    """Whether `target` occurs in `text` as written (exact case), on whole words."""
    return re.search(rf"(?<!\w){re.escape(target)}(?!\w)", text) is not None

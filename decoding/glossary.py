"""Glossaries at translation time: the format and matcher (`data.glossary`, where training
reads the same files) and the sources a term-annotated model is given.

A model trained with `data.term_annotation` (`data.terms`) learnt to copy a target term that
the source carries inline; its tokenizer holds the markers as user-defined symbols, so
`annotated_sources` annotates the glossary's terms in the sources the same way, and leaves
every source of any other model as it is. The constrained search stays on top as the
guarantee (`decoding.constraints`).
"""

from __future__ import annotations

from attnmt.data.glossary import Glossary, GlossaryError, Term, fold, uses_term
from attnmt.data.terms import annotate, annotation_mode

__all__ = ["Glossary", "GlossaryError", "Term", "annotated_sources", "fold", "uses_term"]


def annotated_sources(
    tags: dict[str, int] | list[str],
    sentences: list[str],
    glossary: Glossary | list[Glossary | None] | None,
) -> list[str]:
    """`sentences` with each source term of their glossary annotated inline, as the model
    whose tokenizer has `tags` was trained (every occurrence); `sentences` itself when that
    model was trained without annotation or there is no glossary."""
    mode = annotation_mode(tags)
    if mode == "none" or glossary is None:
        return sentences
    glossaries = glossary if isinstance(glossary, list) else [glossary] * len(sentences)
    return [
        sentence if own is None else annotate(sentence, own.spans(sentence), mode)
        for sentence, own in zip(sentences, glossaries, strict=True)
    ]

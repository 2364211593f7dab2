"""A search's `stop` hook (serve.py's batch calls): checked before each decoding step, it ends
greedy search, beam search, sampling and continuous greedy search with `Cancelled` between two
steps once it says so; without it (translate.py) the search runs to its end."""

from __future__ import annotations

import pytest

from attnmt.decoding.config import SearchConfig
from attnmt.decoding.glossary import Glossary
from attnmt.decoding.search import Cancelled
from attnmt.decoding.translator import Translator
from attnmt.engine import Engine

SENTENCES = ["a b c d e f g", "b a", "c c c c", "a b a b"]


class Stop:
    """A `stop` that says so at its `at`-th call (never when None), counting its calls."""

    def __init__(self, at: int | None) -> None:
        self.at, self.calls = at, 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.at is not None and self.calls >= self.at


@pytest.mark.parametrize(
    ("options", "continuous", "terms"),
    [
        (dict(sampling=True, nbest=2, seed=3), False, None),
        (dict(beam_size=3), False, None),
        (dict(beam_size=1), False, None),
        (dict(beam_size=1), True, None),  # an `Engine`: continuous batching
        (dict(beam_size=1), False, {"b a": "c c a"}),  # constrained beam search
    ],
)
def test_stop_ends_a_search_between_steps_before_its_end(
    tokenizer,  # noqa: ANN001
    model,  # noqa: ANN001
    options: dict,
    continuous: bool,
    terms: dict | None,
) -> None:
    cfg = SearchConfig(batch_size=2, max_len_a=2.0, max_len_b=30, **options)
    searched = Engine(model).eval() if continuous else model
    glossary = None if terms is None else Glossary.from_mapping(terms)
    counted = Stop(None)
    translator = Translator(searched, tokenizer, cfg, stop=counted)
    whole = translator.translate_nbest(SENTENCES, glossary=glossary)
    assert len(whole) == len(SENTENCES) and counted.calls > 3  # one call per step
    assert terms is None or "c c a" in whole[1][0].text  # the term placed: constrained
    early = Stop(3)
    with pytest.raises(Cancelled):
        translator = Translator(searched, tokenizer, cfg, stop=early)
        translator.translate_nbest(SENTENCES, glossary=glossary)
    assert early.calls == 3  # stopped before its fourth step

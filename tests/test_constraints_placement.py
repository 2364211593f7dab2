"""Where a glossary term lands (decoding/constraints.py): at a word's start, before the
sentence's final mark, not glued into a compound, and instead of the source term's usual
translation rather than beside it."""

from __future__ import annotations

import pytest
import torch

from attnmt.data.tokenizer import Tokenizer
from attnmt.decoding import constraints as lexical
from attnmt.decoding import search
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.glossary import Glossary, uses_term
from attnmt.decoding.translator import Translator
from attnmt.engine import Engine
from tests.helpers_decoding import SPECIAL, ScriptedModel, random_sources

V = 20
TERM, WORD, PERIOD, OPEN, GLUED = 5, 4, 8, 10, 9


def _classes() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Toy pieces: 9 continues a word, 10 is "(", 8 is "."."""
    glued = torch.zeros(V, dtype=torch.bool)
    glued[GLUED] = True
    opener = torch.zeros(V, dtype=torch.bool)
    opener[[OPEN, SPECIAL.bos]] = True
    final = torch.zeros(V, dtype=torch.bool)
    final[PERIOD] = True
    return glued, opener, final


def _set(terms: list, limits: list[int] | None = None) -> lexical.ConstraintSet:
    glued, opener, final = _classes()
    return lexical.constraint_set(terms, glued, opener, torch.device("cpu"), final, limits)


def test_target_pieces_a_term_may_follow_are_word_starts_not_final_marks(
    tokenizer: Tokenizer,
) -> None:
    pieces = tokenizer.tgt_pieces(list(range(tokenizer.tgt_vocab_size)))
    classes = lexical.piece_classes(tokenizer, tokenizer.special.bos)
    for i, piece in enumerate(pieces):
        if piece.endswith((".", "!", "?")):
            assert not classes.opener[i] and classes.final[i], piece
        if piece[-1:].isalnum():
            assert not classes.opener[i], piece
        if piece.endswith("("):
            assert classes.opener[i], piece
        if piece.startswith("-"):
            assert classes.glued[i], piece  # "Velo" then "-Shirt": no invented compound
    assert classes.opener[tokenizer.special.bos]
    assert any(p.endswith(".") for p in pieces)


def test_an_attached_variant_starts_only_after_an_opener() -> None:
    cons = _set([[[[GLUED, 6]]]]).rows(3)  # a variant whose first piece has no "▁"
    state = lexical.initial_state(cons)
    last = torch.tensor([PERIOD, WORD, OPEN])
    new, bank = lexical.advance(cons, state, torch.full((3, 1), GLUED), last)
    assert bank[:, 0].tolist() == [0, 0, 1]  # not after "." or a word; after "("


def _term_after_the_period() -> ScriptedModel:
    """word . TERM EOS is the model's favourite; word TERM . EOS its second best."""
    script = {
        (): {WORD: 0.9},
        (WORD,): {PERIOD: 0.9},
        (WORD, PERIOD): {TERM: 0.9},
        (WORD, PERIOD, TERM): {3: 0.9},
        (WORD, TERM): {PERIOD: 0.9},
        (WORD, TERM, PERIOD): {3: 0.9},
    }
    return ScriptedModel(V, script)


def test_a_term_comes_before_the_final_mark_not_after_it() -> None:
    src = random_sources([6])
    cfg = SearchConfig(beam_size=3, max_len_a=0, max_len_b=8)
    found = search.beam_search(
        _term_after_the_period(), src, SPECIAL, cfg, constraints=_set([[[[TERM]]]])
    )
    assert found.hypotheses[0][0].tokens == [WORD, TERM, PERIOD]
    # a source of two sentences: the first period is not the last one, the term may follow it
    two = _set([[[[TERM]]]], limits=[2])
    found = search.beam_search(_term_after_the_period(), src, SPECIAL, cfg, constraints=two)
    assert found.hypotheses[0][0].tokens == [WORD, PERIOD, TERM]


def test_the_usual_translation_is_masked_but_never_a_term() -> None:
    term = lexical.TermIds([[TERM, 6]], avoid=[[11, 12], [13], [6]])  # 6 is the term's own
    cons = _set([[term]]).rows(2)
    tokens = torch.tensor([[SPECIAL.bos, 11], [SPECIAL.bos, WORD]])  # row 0 began 11 12
    masked = lexical.mask_usual(cons, tokens, torch.zeros(2, V))
    assert masked[0, 12].isneginf() and masked[1, 12] == 0  # only after 11
    assert masked[:, 13].isneginf().all() and masked[:, 6].eq(0).all()
    assert masked.isneginf().sum() == 3


def test_salient_words_are_those_the_source_term_makes_likely() -> None:
    from attnmt.decoding.translator import _without

    pieces = ["▁Ein", "▁Fahr", "rad", "."]
    with_term, without = [-0.1, -0.5, -0.2, -0.1], [-0.2, -3.0, -1.0, -0.1]
    assert lexical.salient_words(pieces, with_term, without, 2.0) == {"Fahrrad"}
    assert lexical.salient_words(pieces, with_term, without, 5.0) == set()
    assert lexical.usual_words([{"Fahrrad"}, {"Rad"}, {"Fahrrad"}, set()]) == ["Fahrrad"]
    assert _without("A man and a Man.", "man") == "A and a ."


def test_a_sentence_holds_the_term_instead_of_the_usual_word(
    model,  # noqa: ANN001
    tokenizer: Tokenizer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever word the search wrote beside the term is left out once it is the source
    term's usual translation."""
    glossary = Glossary.from_mapping({"man": "Hund"})
    sentence = "A man rides a bike."
    translator = Translator(Engine(model), tokenizer, SearchConfig(beam_size=3))
    key = (id(tokenizer), "man")
    learnt = {key: [set()] * 8}  # a full sample, no salient word: nothing avoided
    monkeypatch.setattr(translator, "_learn_usual", lambda *args: learnt)
    before = translator.translate([sentence], glossary=glossary)[0]
    usual = next(w for w in before.split() if w.isalpha() and len(w) > 1 and w != "Hund")
    learnt[key] = [{usual}] * 8
    after = translator.translate([sentence], glossary=glossary)[0]
    assert uses_term(before, usual) and not uses_term(after, usual), (before, after)
    assert uses_term(after, "Hund")


def test_a_met_term_hides_no_first_token_of_an_unmet_one() -> None:
    """Two terms whose word-start variants begin with the same piece ("▁"): once the first
    is met, the second's first piece is still proposed."""
    cons = _set([[[[4, 6]], [[4, 7, 11]]]])
    state, last = lexical.initial_state(cons), torch.tensor([SPECIAL.bos])
    for token in (4, 6):  # the first term
        new, _ = lexical.advance(cons, state, torch.tensor([[token]]), last)
        state, last = new[:, 0], torch.tensor([token])
    extra, tokens = lexical.extra_candidates(
        cons, state, torch.zeros(1, V), torch.tensor([[13]]), last
    )
    assert 4 in tokens[extra.isfinite()].tolist()


def test_every_token_of_the_longest_variant_raises_the_bank() -> None:
    """A term spelt with "▁" (3 pieces) or without (2): each piece matched of the longer
    spelling is a fuller bank, so a hypothesis a piece further on is never beaten by one
    behind it in the same bank."""
    cons = _set([[[[4, 7, 11], [7, 11]]]])
    state, last = lexical.initial_state(cons), torch.tensor([WORD])
    banks = []
    for token in (4, 7, 11):
        new, bank = lexical.advance(cons, state, torch.tensor([[token]]), last)
        state, last = new[:, 0], torch.tensor([token])
        banks.append(int(bank[0, 0]))
    assert banks == [1, 2, 3]


def test_the_measures_see_glued_terms_and_terms_after_the_final_mark() -> None:
    from attnmt.evaluation.terms import placement, window_overlap

    src = "A man rides a bike."
    assert placement(src, "Ein Mann fährt Fahrrad.Velo-Shirt.", "Velo") == (True, True, True)
    assert placement(src, "Ein Mann fährt (Velo).", "Velo") == (True, False, False)
    assert placement(src, "Ein Mann fährt Velos.", "Velo") == (False, True, False)
    ref = "Ein Mann fährt ein Velo im Park."
    assert window_overlap(ref, "Ein Mann fährt ein Velo.", "Velo", 2) == 0.5  # "fährt ein"
    assert window_overlap(ref, "Ein Mann fährt.", "Velo", 2) == 0.0


def test_what_a_call_learns_never_changes_another_calls_answer(
    model,  # noqa: ANN001
    tokenizer: Tokenizer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The usual words are learnt from a call's own sentences: what a request's search is told
    to avoid, and so its answer, is the same on a fresh translator and after other requests (no
    text of one user reaches another's)."""

    def every_word(pieces: list[str], *_: object) -> set[str]:  # each output word is "usual"
        return set(lexical._word_texts(pieces)) - {""}

    monkeypatch.setattr(lexical, "salient_words", every_word)
    glossary = Glossary.from_mapping({"man": "Hund", "dog": "Kerl"})
    asked = ["A man and a dog."]

    def searched(translator: Translator) -> tuple[list[str], list]:
        seen = []
        search = translator.search_ids
        monkeypatch.setattr(
            translator, "search_ids", lambda *a, **k: seen.append(a[-1]) or search(*a, **k)
        )
        return translator.translate(asked, glossary=glossary), seen

    alone = searched(Translator(Engine(model), tokenizer, SearchConfig(beam_size=3)))
    used = Translator(Engine(model), tokenizer, SearchConfig(beam_size=3))
    used.translate([f"A man number {i} sees a dog." for i in range(8)], glossary=glossary)
    fresh_avoid = [[t.avoid for t in terms] for terms in alone[1][0]]
    assert any(any(a) for a in fresh_avoid)  # something learnt, so something to differ
    answer, seen = searched(used)
    assert (answer, [[t.avoid for t in terms] for terms in seen[0]]) == (alone[0], fresh_avoid)

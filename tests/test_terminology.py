"""Terminology: glossaries (decoding/glossary.py), lexically constrained search
(decoding/constraints.py, decoding/search.py) through `Translator` and `translate.py --glossary`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from attnmt.data.tokenizer import Tokenizer
from attnmt.decoding import constraints as lexical
from attnmt.decoding import search
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.ensemble import Ensemble
from attnmt.decoding.glossary import Glossary, GlossaryError, uses_term
from attnmt.decoding.translator import Translator
from attnmt.engine import Engine
from tests.helpers_decoding import PAIRS, SPECIAL, ScriptedModel, random_sources
from tests.test_translate_cli import run_cli

SOURCES = [src for _, src in PAIRS[:8]]  # English sides: "A man rides a bike.", ...
TERMS = {"man": "Hund", "dog": "Kaffee", "soccer": "soccer", "the park": "Sofa"}


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------- glossary (text)


def test_glossary_file_is_read_and_matched_on_whole_words_any_case(tmp_path: Path) -> None:
    path = write(tmp_path / "g.tsv", "man\tHerr\n\nyoung boy\tkleiner Junge\nboy\tJunge\n")
    glossary = Glossary.from_file(str(path))
    found = glossary.find("A YOUNG   boy and a Man; the manager and two boys.")
    assert [(t.source, t.target) for t in found] == [
        ("young boy", "kleiner Junge"),  # longest first: "boy" alone is not matched there
        ("man", "Herr"),  # once, though "manager" and "boys" are no whole-word matches
    ]
    assert found[1].origin == f"{path}:1"
    assert glossary.find("A boy.")[0].target == "Junge"
    assert glossary.find("Nothing here.") == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("man Herr\n", "g.tsv:1: no tab"),
        ("man\tHerr\tx\n", "g.tsv:1: 2 tabs"),
        ("man\tHerr\n\t Junge\n", "g.tsv:2: the source term is empty"),
        ("man\t \n", "g.tsv:1: the target term is empty"),
        ("man\tHerr\nMan\tMann\n", "g.tsv:2: 'Man' is already mapped to 'Herr' at"),
    ],
)
def test_bad_glossary_lines_name_the_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(GlossaryError, match=re.escape(message)):
        Glossary.from_file(str(write(tmp_path / "g.tsv", text)))


def test_a_repeated_entry_is_one_term_and_a_mapping_works_like_a_file() -> None:
    glossary = Glossary.from_mapping({"dog": "Hund", "DOG": "Hund"})
    assert len(glossary) == 1
    with pytest.raises(GlossaryError, match="glossary entry 'cat': the target term is empty"):
        Glossary.from_mapping({"cat": ""})


def test_case_folding_is_one_rule_for_matching_and_lookup() -> None:
    # Unicode's default caseless matching (casefold) for both: a match is always a known term
    dotted = Glossary.from_mapping({"Istanbul": "Istanbul"})
    assert dotted.find("I love İstanbul.") == []  # "İ" folds to "i" + U+0307, not to "i"
    assert dotted.find("I love ISTANBUL.")[0].target == "Istanbul"
    own = Glossary.from_mapping({"İstanbul": "Istanbul"})
    assert own.find("I LOVE İSTANBUL.")[0].target == "Istanbul"
    sharp = Glossary.from_mapping({"Straße": "street", "ǅemal": "Dzemal"})
    assert [t.target for t in sharp.find("DIE STRASSE von ǄEMAL.")] == ["street", "Dzemal"]
    assert [t.target for t in sharp.find("die strasse, ǆemal")] == ["street", "Dzemal"]
    with pytest.raises(GlossaryError, match="'STRASSE' is already mapped to 'street'"):
        Glossary.from_mapping({"Straße": "street", "STRASSE": "road"})


def test_uses_term_is_exact_case_on_whole_words() -> None:
    assert uses_term("Ein Herr, der läuft.", "Herr")
    assert not uses_term("Ein herr läuft.", "Herr")
    assert not uses_term("Die Herren laufen.", "Herr")
    assert uses_term("Ein kleiner Junge.", "kleiner Junge")


# ------------------------------------------------------------------------ token ids and state


def test_variants_include_a_term_split_differently_in_context(tokenizer: Tokenizer) -> None:
    """In the tiny tokenizer "(Hund)" splits "Hund" into pieces without a word boundary."""
    alone = tokenizer.encode_tgt(["Hund"])[0]
    in_parens = tokenizer.encode_tgt(["(Hund)"])[0]
    variants = lexical.term_variants(tokenizer, "Hund")
    assert variants[0] == alone
    assert len(variants) > 1 and any(v != alone and _is_within(v, in_parens) for v in variants)
    for variant in variants:
        assert tokenizer.decode_tgt([variant])[0].strip() == "Hund"


def _is_within(part: list[int], whole: list[int]) -> bool:
    return any(whole[i : i + len(part)] == part for i in range(len(whole)))


def _toy_set(terms: list[list[list[list[int]]]]) -> lexical.ConstraintSet:
    glued = torch.zeros(20, dtype=torch.bool)
    glued[9] = True  # token 9 continues a word
    opener = ~glued
    return lexical.constraint_set(terms, glued, opener, torch.device("cpu"))


def test_state_advances_unwinds_and_counts_banks() -> None:
    cons = _toy_set([[[[5, 6, 7]], [[8]]]])  # two terms: 5 6 7, and 8
    state = lexical.initial_state(cons)  # (1, W)
    last = torch.tensor([2])
    trail = []
    for token in (5, 6, 4, 5, 6, 7, 8):
        new, bank = lexical.advance(cons, state, torch.tensor([[token]]), last)
        state, last = new[:, 0], torch.tensor([token])
        trail.append(int(bank[0, 0]))
    assert trail == [1, 2, 0, 1, 2, 3, 4]  # "4" unwinds the partial match of 5 6 7
    assert not lexical.unmet(cons, state).any()


def test_allocation_fills_the_beam_round_robin_over_banks() -> None:
    scores = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -5.0, float("-inf")]])
    banks = torch.tensor([[0, 0, 1, 2, 2, 2]])
    order = lexical.allocate(scores, banks, 6, 3)
    # the best of bank 2, 1, 0; then the second best of bank 2, 0; the -inf one last
    assert order.tolist() == [[3, 2, 0, 4, 1, 5]]


def test_glued_pieces_are_masked_only_after_a_completed_term() -> None:
    cons = _toy_set([[[[5]]]]).rows(3)
    state = lexical.initial_state(cons)
    state[1, -1] = 1  # row 1's last token completed a term
    lprobs = torch.zeros(3, 20)
    masked = lexical.mask_glued(cons, state, lprobs.clone())
    assert masked[1, 9] == float("-inf") and masked[1].isfinite().sum() == 19  # glued piece 9
    assert masked[[0, 2]].eq(0).all()


# ------------------------------------------------------------------------------ search


def _ends_after_the_term() -> ScriptedModel:
    """Term token 5 first (p 0.5), then EOS (p 0.9); or 7, 5, EOS: those two hypotheses win by
    far, while every other path is near-uniform over 20 tokens and ends (EOS p 1/20) only by
    chance."""
    script = {(): {5: 0.5, 7: 0.45}, (5,): {3: 0.9}, (7,): {5: 0.9}, (7, 5): {3: 0.9}}
    return ScriptedModel(20, script)


@pytest.mark.parametrize("nbest", [1, 2])
def test_a_sentence_stops_once_no_live_hypothesis_can_win(
    monkeypatch: pytest.MonkeyPatch, nbest: int
) -> None:
    """Early stop under constraints: once no live hypothesis, even at the longest length the
    budget allows, could score above the nbest-th finished one, the sentence is done; the
    results are those of running on to `beam_size` finished hypotheses."""
    src = random_sources([10])
    cons = _toy_set([[[[5]]]])
    cfg = SearchConfig(beam_size=3, nbest=nbest, max_len_a=0, max_len_b=8)
    stopping = _ends_after_the_term()
    early = search.beam_search(stopping, src, SPECIAL, cfg, constraints=cons)
    monkeypatch.setattr(search, "_cannot_improve", lambda beams, *_: torch.zeros(1, dtype=bool))
    running = _ends_after_the_term()
    full = search.beam_search(running, src, SPECIAL, cfg, constraints=cons)
    assert early.hypotheses == full.hypotheses
    assert [hyp.tokens for hyp in early.hypotheses[0]] == [[7, 5], [5]][:nbest]
    assert len(running.rows_per_step) == 9  # a third hypothesis ends only at the budget
    assert len(stopping.rows_per_step) == 3  # 7 5 EOS: no live one can reach the nbest-th


# ------------------------------------------------------------------------------ search


def _glossary() -> Glossary:
    return Glossary.from_mapping(TERMS)


def _expected(sentence: str) -> list[str]:
    return [term.target for term in _glossary().find(sentence)]


@pytest.mark.parametrize("beam", [1, 4])
def test_every_found_term_is_in_the_translation(model, tokenizer: Tokenizer, beam: int) -> None:  # noqa: ANN001
    translator = Translator(Engine(model), tokenizer, SearchConfig(beam_size=beam, nbest=beam))
    plain = translator.translate_nbest(SOURCES)
    constrained = translator.translate_nbest(SOURCES, glossary=_glossary())
    for sentence, before, after in zip(SOURCES, plain, constrained, strict=True):
        targets = _expected(sentence)
        if not targets:  # no term: searched as without a glossary
            assert [hyp.text for hyp in after] == [hyp.text for hyp in before]
            continue
        assert len(after) == beam
        best = after[0].text  # (the untrained model never ends: the budget ends every output)
        assert all(uses_term(best, target) for target in targets), (sentence, best)
    assert sum(bool(_expected(s)) for s in SOURCES) >= 4


@pytest.mark.parametrize("beam", [1, 3])
def test_a_sentence_translates_alike_alone_and_beside_more_constrained_ones(
    model,  # noqa: ANN001
    tokenizer: Tokenizer,
    beam: int,
) -> None:
    """Greedy search with terms is a beam as wide as a sentence's terms need: a batch never
    widens it for a sentence of fewer terms (one glossary per sentence, as the server sends)."""
    few = Glossary.from_mapping({"man": "Hund"})
    many = Glossary.from_mapping({"man": "Kaffee", "rides": "Sofa", "bike": "Hund"})
    sentence = "A man rides a bike."
    translator = Translator(Engine(model), tokenizer, SearchConfig(beam_size=beam))
    alone = translator.translate([sentence], glossary=few)
    beside = translator.translate([sentence, sentence], glossary=[few, many])
    assert beside[0] == alone[0] and uses_term(alone[0], "Hund")
    assert all(uses_term(beside[1], t) for t in ("Kaffee", "Sofa", "Hund"))


def test_ensembles_and_int8_use_the_terms(model, tokenizer: Tokenizer) -> None:  # noqa: ANN001
    for searched in (Ensemble([Engine(model), Engine(model)]), Engine(model, "int8")):
        translator = Translator(searched, tokenizer, SearchConfig(beam_size=3))
        found = translator.translate(SOURCES[:5], glossary=_glossary())
        for sentence, output in zip(SOURCES[:5], found, strict=True):
            assert all(uses_term(output, target) for target in _expected(sentence)), output


def test_a_term_longer_than_the_output_budget_is_named(model, tokenizer: Tokenizer) -> None:  # noqa: ANN001
    cfg = SearchConfig(beam_size=2, max_len_a=0, max_len_b=2)
    translator = Translator(Engine(model), tokenizer, cfg)
    with pytest.raises(GlossaryError, match="glossary entry 'dog': the target term 'Kaffee'"):
        translator.translate(["A dog runs."], glossary=_glossary())


# ------------------------------------------------------------------------------ command line


def test_translate_py_glossary(tmp_path: Path, checkpoint: Path) -> None:
    lines = "".join(f"{s}\t{t}\n" for s, t in TERMS.items())
    glossary = write(tmp_path / "terms.tsv", lines)
    inputs = write(tmp_path / "in.txt", "".join(s + "\n" for s in SOURCES[:4]))
    done = run_cli("-c", str(checkpoint), "--input", str(inputs), "--glossary", str(glossary))
    assert done.returncode == 0, done.stderr.decode()
    outputs = done.stdout.decode().splitlines()
    assert len(outputs) == 4
    for sentence, output in zip(SOURCES[:4], outputs, strict=True):
        assert all(uses_term(output, target) for target in _expected(sentence)), output


def test_translate_py_glossary_folds_case_without_a_traceback(
    tmp_path: Path, checkpoint: Path
) -> None:
    glossary = write(tmp_path / "terms.tsv", "Istanbul\tIstanbul\nStraße\tStraße\n")
    done = run_cli("-c", str(checkpoint), "--glossary", str(glossary), "I love İstanbul.")
    assert done.returncode == 0 and "Traceback" not in done.stderr.decode(), done.stderr
    done = run_cli("-c", str(checkpoint), "--glossary", str(glossary), "A STRASSE.", "--beam", "2")
    assert done.returncode == 0, done.stderr.decode()
    assert uses_term(done.stdout.decode(), "Straße"), done.stdout


@pytest.mark.parametrize(
    ("text", "extra", "message"),
    [
        ("man Hund\n", [], "terms.tsv:1: no tab"),
        ("man\tHund\n", ["--sampling"], "--glossary constrains beam or greedy search"),
    ],
)
def test_translate_py_bad_glossary_is_one_line(
    tmp_path: Path, checkpoint: Path, text: str, extra: list[str], message: str
) -> None:
    glossary = write(tmp_path / "terms.tsv", text)
    done = run_cli("-c", str(checkpoint), "--glossary", str(glossary), *extra, "A man.")
    err = done.stderr.decode()
    assert done.returncode != 0 and message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1

"""Term annotation (`data.term_annotation`, Dinu et al. 2019): training sources carry their
terms' target terms inline where the reference uses them, the markers are one SentencePiece id
anywhere in a text, a model trained so gets a glossary's terms annotated in its sources at
translation time, and a run without the option prepares the same data and tokenizer as
before."""

from __future__ import annotations

import logging
from pathlib import Path

import datasets
import pytest
import torch

from attnmt.checkpoint import load_for_inference
from attnmt.data.errors import DataError
from attnmt.data.glossary import Glossary
from attnmt.data.spm_train import TokenizerConfig, train_or_load_tokenizer
from attnmt.data.terms import (
    MARKERS,
    TermAnnotation,
    annotate_pair,
    annotation_config,
    annotation_mode,
    learn_dictionary,
    read_dictionary,
)
from attnmt.decoding.glossary import annotated_sources
from attnmt.decoding.search import SearchConfig
from attnmt.decoding.translator import Translator
from attnmt.training import build
from attnmt.training.config import Configs
from attnmt.training.loop import fit
from tests.helpers_decoding import PAIRS, single_thread
from tests.train_helpers import TOY, run_train, toy_cfg

BIKE = Glossary.from_mapping({"bike": "Velo", "young boy": "Knabe"})
APPEND = TermAnnotation(mode="append")


def test_append_puts_the_target_term_after_the_source_term():
    out = annotate_pair("a bike is red", "ein Velo ist rot", BIKE, APPEND, 0)
    assert out == "a <t> bike <r> Velo </t> is red"


def test_replace_puts_the_target_term_instead_of_the_source_term():
    cfg = TermAnnotation(mode="replace")
    assert annotate_pair("A bike.", "Ein Velo.", BIKE, cfg, 0) == "A <r> Velo </t>."
    # every occurrence, the longest term first, the source term's own case kept by append
    out = annotate_pair("The Young  Boy's BIKE", "Knabe, Velo", BIKE, APPEND, 0)
    assert out == "The <t> Young  Boy <r> Knabe </t>'s <t> BIKE <r> Velo </t>"


@pytest.mark.parametrize(
    "src, ref",
    [
        ("a bike is red", "ein Fahrrad ist rot"),  # the reference does not use the target term
        ("a bike is red", "ein velo ist rot"),  # ... as written (its case)
        ("a bike is red", "ein Velos ist rot"),  # ... as a whole word
        ("bikes are red", "Velo ist rot"),  # the source term is not a whole word
        ("a motorbike", "ein Velo"),
    ],
)
def test_no_annotation_without_a_whole_word_match_on_both_sides(src, ref):
    assert annotate_pair(src, ref, BIKE, APPEND, 0) == src


def test_the_rate_draws_the_same_occurrences_for_the_same_seed():
    def annotated(rate: float, seed: int) -> list[int]:
        cfg = TermAnnotation(mode="append", rate=rate, seed=seed)
        return [
            row for row in range(400) if "<t>" in annotate_pair("a bike", "Velo", BIKE, cfg, row)
        ]

    half = annotated(0.5, 1)
    assert 150 < len(half) < 250  # about half of the 400 rows
    assert annotated(0.5, 1) == half  # a rerun (a resume) annotates the same rows
    assert annotated(0.5, 2) != half
    assert annotated(0.0, 1) == [] and len(annotated(1.0, 1)) == 400


def test_learnt_dictionary_pairs_the_words_that_go_together():
    animals = [("cat", "Katze"), ("dog", "Hund"), ("horse", "Pferd"), ("bird", "Vogel")]
    places = [("garden", "Garten"), ("street", "Straße"), ("house", "Haus")]
    pairs = [
        (f"The {a} is in the {p}.", f"Die {b} ist in dem {q}.")
        for a, b in animals
        for p, q in places
    ]
    cfg = TermAnnotation(mode="append", min_count=3, min_dice=0.5, stop_words=3)
    learnt = {(p.source, p.target) for p in learn_dictionary(pairs * 2, cfg)}
    assert learnt == {*animals, *[(p, q) for p, q in places]}  # the reference's own spelling
    # "the", "is", "in" are the three most frequent words: stop words. Without stop words they
    # pair up (ties all at Dice 1), and punctuation never does.
    everything = learn_dictionary(pairs, TermAnnotation(stop_words=0))
    assert {p.source for p in everything} & {"the", "is", "in"}
    assert all(p.source.isalpha() and p.target.isalpha() for p in everything)


def test_markers_are_one_id_each_anywhere_in_a_text(tmp_path):
    rows = {"src": [s for s, _ in PAIRS], "tgt": [t for _, t in PAIRS]}
    cfg = TokenizerConfig(vocab_size=90, input_sentence_size=0, user_symbols=MARKERS["append"])
    tokenizer = train_or_load_tokenizer(datasets.Dataset.from_dict(rows), cfg, tmp_path)
    ids = tokenizer.encode_src(["Ein <t> Mann <r> man </t> fährt<t>Fahrrad </t>."])[0]
    marker_ids = [tokenizer.tags[m] for m in MARKERS["append"]]
    assert [i for i in ids if i in marker_ids] == [marker_ids[0], marker_ids[1], marker_ids[2]] + [
        marker_ids[0],
        marker_ids[2],
    ]
    assert annotation_mode(tokenizer.tags) == "append"
    assert annotation_mode(["<r>", "</t>"]) == "replace" and annotation_mode([]) == "none"


@pytest.mark.parametrize(
    "values, message",
    [
        ({"mode": "inline"}, "data.term_annotation.mode=inline is not one of none|append|replace"),
        ({"rate": 1.5}, "data.term_annotation.rate=1.5 must be in [0, 1]"),
        ({"rate": -0.1}, "data.term_annotation.rate=-0.1 must be in [0, 1]"),
        ({"modes": "append"}, "unknown key(s) data.term_annotation.modes; valid keys: mode"),
        ({"min_count": 0}, "data.term_annotation.min_count=0 must be a whole number >= 1"),
        ({"terms": 3}, "data.term_annotation.terms=3 must be the path of a TSV file, or null"),
        ({"rate": "half"}, "data.term_annotation.rate=half must be in [0, 1]"),
    ],
)
def test_bad_settings_name_the_key_and_the_fix(values, message):
    with pytest.raises(DataError) as caught:
        annotation_config(values)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_missing_or_malformed_terms_file_names_the_key(tmp_path):
    with pytest.raises(DataError, match="data.term_annotation.terms file not found: .*nope"):
        read_dictionary(annotation_config({"mode": "append", "terms": str(tmp_path / "nope")}))
    bad = tmp_path / "terms.tsv"
    bad.write_text("bike\tVelo\ncar Auto\n", encoding="utf-8")
    with pytest.raises(DataError) as caught:
        read_dictionary(annotation_config({"mode": "append", "terms": str(bad)}))
    assert str(caught.value) == (
        f"data.term_annotation.terms: {bad}:2: no tab; each line is 'source term<TAB>target term'"
    )


def test_train_py_refuses_a_bad_mode_in_one_line(tmp_path):
    proc = run_train(tmp_path / "run", "data.term_annotation.mode=inline", timeout=120)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("train.py: error:")]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert len(errors) == 1 and "data.term_annotation.mode=inline" in errors[0], proc.stderr


def test_the_default_prepares_the_data_and_tokenizer_of_a_run_without_the_key(tmp_path):
    """The default (`mode: none`) against a config without `data.term_annotation` at all
    (every run before the option): the same SentencePiece model, sources and ids."""
    default = build.load_data(Configs.from_hydra(toy_cfg(tmp_path / "a")), tmp_path / "a" / "run")
    before = toy_cfg(tmp_path / "b", "~data.term_annotation")
    assert "term_annotation" not in before.data
    old = build.load_data(Configs.from_hydra(before), tmp_path / "b" / "run")
    assert (tmp_path / "a/run/spm.model").read_bytes() == (
        tmp_path / "b/run/spm.model"
    ).read_bytes()
    assert default.tokenizer.tags == {} and default.train["src"] == old.train["src"]
    assert default.train["src_ids"] == old.train["src_ids"]
    assert default.train["src"] == [
        line for line in (TOY / "train.de").read_text(encoding="utf-8").splitlines()
    ]


def _encoder_inputs(translator: Translator, sentences: list[str], glossary: Glossary) -> list:
    """The source ids (without eos and padding) the model's encoder receives."""
    seen = []
    encode = translator.model.encode

    def recording(src_ids, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        seen.extend(row[row != 0].tolist()[:-1] for row in src_ids)
        return encode(src_ids, *args, **kwargs)

    translator.model.encode = recording
    try:
        outputs = translator.translate(sentences, glossary=glossary)
    finally:
        del translator.model.encode
    return seen, outputs


def test_a_model_without_annotation_gets_its_sources_as_before(model, tokenizer):
    glossary = Glossary.from_mapping({"Mann": "man", "Fahrrad": "bike"})
    sentences = ["Ein Mann fährt Fahrrad."]
    assert annotated_sources(tokenizer.tags, sentences, glossary) is sentences
    translator = Translator(model, tokenizer, SearchConfig(beam_size=2, max_len_b=12))
    with single_thread():
        seen, outputs = _encoder_inputs(translator, sentences, glossary)
    # the search's input (the usual words are learnt on sources without the term, too)
    assert tokenizer.encode_src(sentences)[0] in seen
    assert "man" in outputs[0] and "bike" in outputs[0]  # the constraints hold as before


def test_a_tiny_run_with_annotation_annotates_glossary_sources(tmp_path, caplog):
    terms = tmp_path / "terms.tsv"
    terms.write_text("Mann\tman\nHund\tdog\n", encoding="utf-8")
    cfg = toy_cfg(
        tmp_path,
        "data.term_annotation.mode=append",
        f"data.term_annotation.terms={terms}",
        "trainer.max_steps=8",
        "trainer.eval_every=8",
        "tokenizer.vocab_size=120",
    )
    with caplog.at_level(logging.INFO, logger="attnmt"), single_thread():
        fit(cfg, tmp_path / "run")
    assert "term annotation (append, rate 1): 11 of 40 training sources annotated, 2 terms" in (
        caplog.text
    )
    bundle = load_for_inference(tmp_path / "run")
    tokenizer = bundle.tokenizer
    assert set(MARKERS["append"]) <= set(tokenizer.tags)
    glossary = Glossary.from_mapping({"mann": "man"})
    translator = Translator(bundle.model, tokenizer, SearchConfig(beam_size=2, max_len_b=12))
    with single_thread(), torch.no_grad():
        seen, outputs = _encoder_inputs(translator, ["Ein Mann wartet."], glossary)
    expected = tokenizer.encode_src(["Ein <t> Mann <r> man </t> wartet."])[0]
    assert expected in seen and tokenizer.encode_src(["Ein Mann wartet."])[0] not in seen
    assert "man" in outputs[0].split()  # the constrained search stays on top


def test_a_learnt_dictionary_is_logged_and_used(tmp_path, caplog):
    cfg = Configs.from_hydra(
        toy_cfg(
            tmp_path,
            "data.term_annotation.mode=replace",
            "data.term_annotation.min_count=3",
            "data.term_annotation.stop_words=4",
        )
    )
    with caplog.at_level(logging.INFO, logger="attnmt"):
        data = build.load_data(cfg, tmp_path / "run")
    assert "term annotation: learnt 6 dictionary pairs" in caplog.text
    assert "hund -> dog (1.00)" in caplog.text  # examples, with their Dice coefficients
    assert "Der <r> dog </t> bellt laut." in data.train["src"]
    assert annotation_mode(data.tokenizer.tags) == "replace"
    assert Path(tmp_path / "run" / "spm.model").is_file()


def test_a_rerun_annotates_the_same_training_sources(tmp_path):
    """Fresh caches each time, as a resume on another machine would have: the same draws."""
    terms = tmp_path / "terms.tsv"
    terms.write_text("Mann\tman\nHund\tdog\n", encoding="utf-8")

    def sources(name: str, seed: int) -> list[str]:
        overrides = [
            f"data.term_annotation.{k}={v}" for k, v in (("mode", "append"), ("rate", 0.5))
        ]
        overrides += [f"data.term_annotation.terms={terms}", f"data.term_annotation.seed={seed}"]
        cfg = Configs.from_hydra(toy_cfg(tmp_path / name, *overrides))
        return build.load_data(cfg, tmp_path / name / "run").train["src"]

    first = sources("a", 1)
    annotated = sum("<t>" in src for src in first)
    assert 0 < annotated < 11  # of the 11 sources with a match
    assert sources("b", 1) == first and sources("c", 2) != first

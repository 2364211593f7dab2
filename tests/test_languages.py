"""Language codes in every form (`data.languages`): ISO 639-1, ISO 639-3, BCP-47 and a model's
own codes (NLLB `eng_Latn`, OPUS-MT `deu` / `>>deu<<`) reach the same language on the command
line (`translate.py --src-lang/--tgt-lang`, a subprocess) and on both server APIs (a
`serve.py` subprocess serving a bilingual run and a multilingual one); `/languages` lists
every served language by its ISO 639-1 code; a code no model has is one line (CLI) or a 400
/ 422 naming the codes. The multilingual runs are imported-style (a `VocabTokenizer` with
language tokens over the tiny SentencePiece model), so no Transformers folder is needed.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sentencepiece as spm

from attnmt.checkpoint import model_payload, save_checkpoint
from attnmt.data.languages import (
    describe_codes,
    detect,
    language_name,
    listed_codes,
    resolve,
    same_language,
)
from attnmt.data.vocab_tokenizer import VocabTokenizer, Vocabulary
from tests.conftest import make_tiny_model
from tests.helpers_decoding import PAIRS, SEARCH_MODEL, tiny_tokenizer
from tests.test_serve import ENV, ROOT, post, request, serve
from tests.test_serve_api import make_run

NLLB = ["eng_Latn", "deu_Latn", "fra_Latn", "zho_Hans", "zho_Hant", "arb_Arab", "nob_Latn"]
OPUS = ["deu", "fra", "ces"]
ENGLISH = [tgt for _, tgt in PAIRS]


def multilingual_run(run_dir: Path, codes: list[str], convention: str, seed: int = 7) -> Path:
    """A run dir of an imported-style multilingual model: `nllb` (its codes on both sides, a
    source and a target language token) or `marian` (source `en`, a `>>xxx<<` target token)."""
    base = tiny_tokenizer(run_dir / "spm")
    proto = base._src_bytes
    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(proto)
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    tokens = [f">>{c}<<" if convention == "marian" else c for c in codes]
    ids = pieces + tokens
    langs = {code: len(pieces) + i for i, code in enumerate(codes)}
    tokenizer = VocabTokenizer(proto, None, Vocabulary(ids, ids, base.special, langs, convention))
    model = make_tiny_model(vocab_size=len(ids), seed=seed, **SEARCH_MODEL)
    payload = model_payload(model, tokenizer)
    sources = codes if convention == "nllb" else ["en"]
    payload["languages"] = {"source": sources, "target": codes}
    save_checkpoint(run_dir / "checkpoints" / "best.pt", payload)
    tokenizer.save(run_dir)
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("languages")
    return {
        "en-de": make_run(base / "en-de", "en", "de", seed=5),
        "nllb": multilingual_run(base / "nllb", ["eng_Latn", "deu_Latn", "fra_Latn"], "nllb"),
        "opus": multilingual_run(base / "opus", OPUS, "marian", seed=9),
    }


def translate_py(
    run: Path, *flags: str, lines: list[str] = ENGLISH[:2]
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "translate.py", "-c", str(run), "--beam", "1", *flags, *lines],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


# ---------------------------------------------------------------- the library


def test_every_form_of_a_code_finds_the_models_own() -> None:
    for code, nllb, opus in [
        ("de", "deu_Latn", "deu"),  # ISO 639-1
        ("deu", "deu_Latn", "deu"),  # ISO 639-3
        ("ger", "deu_Latn", "deu"),  # ISO 639-2/B
        ("DE-de", "deu_Latn", "deu"),  # BCP-47, any case
        ("deu_Latn", "deu_Latn", "deu"),  # NLLB
        (">>deu<<", "deu_Latn", "deu"),  # OPUS-MT's token
        ("fr-CA", "fra_Latn", "fra"),
        ("zh", "zho_Hans", None),  # Chinese's usual script
        ("zh-TW", "zho_Hant", None),  # Taiwan's
        ("zh-Hant", "zho_Hant", None),
        ("cmn", "zho_Hans", None),  # a macrolanguage's main member
        ("ar", "arb_Arab", None),
        ("no", "nob_Latn", None),  # Norwegian: Bokmål
        ("cs", None, "ces"),
        ("xx", None, None),
        ("auto", None, None),
        ("", None, None),
    ]:
        assert (resolve(code, NLLB), resolve(code, OPUS)) == (nllb, opus), code
    assert listed_codes(NLLB) == {
        "eng_Latn": "en", "deu_Latn": "de", "fra_Latn": "fr", "zho_Hans": "zh-Hans",
        "zho_Hant": "zh-Hant", "arb_Arab": "ar", "nob_Latn": "nb",
    }  # fmt: skip
    assert listed_codes(["en", "xx_Yy"]) == {"en": "en", "xx_Yy": "xx_Yy"}
    assert [language_name(c) for c in ("de", "deu", "eng_Latn", "zh-Hant", "xx")] == [
        "German", "German", "English", "Chinese (Traditional)", "xx",
    ]  # fmt: skip
    assert same_language("en", "eng_Latn") and not same_language("zh-Hans", "zh-Hant")
    assert describe_codes(OPUS) == "deu (de), fra (fr), ces (cs)"


def test_detection_ranks_only_the_codes_it_is_given() -> None:
    found = detect("Zwei Hunde spielen im Park.", ["en", "deu_Latn"])
    assert [code for code, _ in found] == ["deu_Latn", "en"]
    assert found[0][1] > 90 and abs(sum(c for _, c in found) - 100) < 0.1
    assert detect("Two dogs play in the park.", ["de", "en", "fr"])[0][0] == "en"
    assert detect("anything", ["de"]) == [("de", 100.0)]  # nothing to choose from
    assert detect("anything", ["xx", "tlh"]) == []  # no code the identifier knows


# ---------------------------------------------------------------- translate.py


def test_translate_py_takes_every_form_of_a_code(runs: dict[str, Path]) -> None:
    """The same output for each form of a pair; another target gives another output (the
    code reached the model); a code the model lacks is one line listing its codes."""
    nllb = [translate_py(runs["nllb"], "--src-lang", s, "--tgt-lang", t) for s, t in [
        ("eng_Latn", "deu_Latn"), ("en", "de"), ("eng", "deu"), ("en-US", "de-DE"),
        ("en", "fr"),
    ]]  # fmt: skip
    assert all(done.returncode == 0 for done in nllb), [d.stderr for d in nllb]
    assert nllb[0].stdout == nllb[1].stdout == nllb[2].stdout == nllb[3].stdout != nllb[4].stdout
    opus = [translate_py(runs["opus"], "--tgt-lang", t) for t in ("fra", "fr", ">>fra<<", "cs")]
    assert all(done.returncode == 0 for done in opus), [d.stderr for d in opus]
    assert opus[0].stdout == opus[1].stdout == opus[2].stdout != opus[3].stdout
    bad = translate_py(runs["opus"], "--tgt-lang", "it")
    assert bad.returncode == 1 and bad.stdout == "" and bad.stderr.count("\n") == 1
    assert all(word in bad.stderr for word in ("'it'", "ces", "deu", "fra")), bad.stderr


# ---------------------------------------------------------------- serve.py, both APIs


@pytest.fixture(scope="module")
def server(runs: dict[str, Path]) -> Iterator[str]:
    flags = ["-c", str(runs["nllb"]), "--beam", "1", "--max-sentences", "8", "--max-chars", "200"]
    with serve(runs["en-de"], *flags) as served:
        yield served.url


def test_both_apis_route_every_form_of_a_code(server: str) -> None:
    lines = ENGLISH[:2]
    want = {}
    for pair in [("en", "de"), ("eng_Latn", "fra_Latn")]:  # the two models' own codes
        status, answer = post(server, "/translate", {"sentences": lines, "src_lang": pair[0],
                                                     "tgt_lang": pair[1]})  # fmt: skip
        assert status == 200, answer
        want[pair[1][:2]] = (answer["model"], answer["translations"])
    assert want["de"][0] == "en-de" and want["fr"][0] == "nllb"
    for src, tgt, expected in [
        ("eng", "deu", "de"), ("en-GB", "de-AT", "de"), ("en", "fr", "fr"), ("eng", "fra", "fr"),
        ("en-US", "fr-FR", "fr"), (">>eng<<", "fra_Latn", "fr"),
    ]:  # fmt: skip
        status, ours = post(server, "/translate", {"sentences": lines, "source": src,
                                                   "target": tgt})  # fmt: skip
        assert status == 200 and (ours["model"], ours["translations"]) == want[expected], ours
        body = {"q": lines, "source": src, "target": tgt}
        status, theirs = post(server, "/translate", body)
        assert status == 200 and theirs["translatedText"] == want[expected][1], theirs
    # the multilingual model's own pair in ISO 639-1: de -> fr
    status, answer = post(
        server, "/translate", {"sentences": lines, "source": "de", "target": "fr"}
    )
    assert status == 200 and answer["model"] == "nllb"


def test_languages_lists_every_served_language_by_iso_639_1(server: str) -> None:
    status, listed = request(server, "GET", "/languages")
    assert status == 200
    assert listed == [
        {"code": "en", "name": "English", "targets": ["de", "fr"]},
        {"code": "de", "name": "German", "targets": ["en", "fr"]},
        {"code": "fr", "name": "French", "targets": ["en", "de"]},
    ]


def test_a_code_no_model_has_names_the_served_codes(server: str) -> None:
    status, answer = post(server, "/translate", {"q": "A man.", "source": "en", "target": "xx"})
    assert status == 400 and set(answer) == {"error"}
    assert "'xx': no served model has it; languages: en, de, fr" in answer["error"], answer
    status, answer = post(server, "/translate", {"sentences": ["A man."], "tgt_lang": "tlh"})
    assert status == 422 and "languages: en, de, fr" in answer["error"], answer
    body = {"sentences": ["A man."], "model": "nllb", "tgt_lang": "it"}
    status, answer = post(server, "/translate", body)
    assert status == 422 and "no target language 'it' (Italian)" in answer["error"]
    assert "translates eng_Latn (en), deu_Latn (de), fra_Latn (fr) -> " in answer["error"]
    assert post(server, "/translate", {"sentences": ["A man."]})[0] == 200  # still serving


def test_training_imports_no_language_code_package() -> None:
    """langcodes (and the sentence splitter) load where a code is parsed or a line split:
    train.py's modules run without them (a machine that lacks them still trains)."""
    code = (
        "import sys, attnmt.cli.train, attnmt.training.run, attnmt.data.vocab_tokenizer\n"
        "print(sorted({'langcodes', 'sentencex'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    from attnmt.data.languages import listed_codes, parse

    assert parse("deu").language == "de" and listed_codes(["zh_Hant", "zh_Hans"])  # still parses

"""One rule for a language pair a user names, in translate.py (--src-lang/--tgt-lang) and the
server (source/target): any form of the model's own languages is accepted, also by a model
without language tokens (a run trained here knows its pair from its config); any other code is
refused with the model's pair named (`data.languages.match_pair`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from attnmt.checkpoint import model_payload, save_checkpoint
from attnmt.data.languages import LanguageError, match_pair
from attnmt.decoding.config import SearchConfig
from attnmt.server.batcher import Batcher
from attnmt.server.service import Limits, RoutingError, ServedModel, Service

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
# What a user may call an en -> de model's languages: (source, target) as typed.
SAME_PAIR = [("eng", "deu"), ("en", "de"), ("en-US", "de-DE"), (None, "de-DE"), ("eng", None)]


def test_any_form_of_the_models_languages_names_them_others_name_the_pair() -> None:
    for src, tgt in SAME_PAIR:
        expected = ("en" if src else None, "de" if tgt else None)
        assert match_pair(src, tgt, ["en"], ["de"]) == expected, (src, tgt)
    with pytest.raises(
        LanguageError, match=r"no target language 'fra' \(French\); it translates en -> de$"
    ):
        match_pair("en", "fra", ["en"], ["de"])
    with pytest.raises(LanguageError, match="no source language 'de' .* en -> de") as refused:
        match_pair("de", "en", ["en"], ["de"])
    assert refused.value.side == "source"
    nllb = ["eng_Latn", "deu_Latn", "fra_Latn"]
    assert match_pair("en", "fr-FR", nllb, nllb) == ("eng_Latn", "fra_Latn")
    assert match_pair("xx", None, [], []) == ("xx", None)  # nothing to check it by


def served_model(model_id: str, sources: list[str], targets: list[str]) -> ServedModel:
    def translate(cfg: Any, sentences: list[str], prefixes: list[str], langs: tuple) -> list:
        return [[(s, 0.0)] for s in sentences]

    batcher = Batcher(translate, lambda *a: None, 8, 0.0, 8)
    return ServedModel(model_id, sources, targets, batcher, lambda s: 1)


def test_the_server_routes_any_form_and_refuses_another_language_naming_the_pair() -> None:
    model = served_model("tiny", ["en"], ["de"])
    service = Service([model], SearchConfig(), Limits(8, 100, 4, 64))
    try:
        for src, tgt in SAME_PAIR:
            assert service.route(None, src, tgt) == (model, (None, None)), (src, tgt)
            assert service.route("tiny", src, tgt) == (model, (None, None)), (src, tgt)
        with pytest.raises(
            RoutingError,
            match=r"model 'tiny': .* no target language 'fra' \(French\); .* en -> de;",
        ):
            service.route("tiny", "eng", "fra")
        with pytest.raises(RoutingError, match="no model translates eng -> fra .*en->de"):
            service.route(None, "eng", "fra")
    finally:
        model.batcher.close()


@pytest.fixture(scope="module")
def en_de_run(tmp_path_factory: pytest.TempPathFactory, model, tokenizer) -> Path:  # noqa: ANN001
    """A checkpoint whose training config names its pair, en -> de; no language tokens."""
    path = tmp_path_factory.mktemp("en_de") / "checkpoints" / "best.pt"
    config = {"data": {"src_lang": "en", "tgt_lang": "de"}}
    save_checkpoint(path, {**model_payload(model, tokenizer), "config": config})
    return path


def translate(checkpoint: Path, *flags: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(ROOT / "translate.py"), "-c", str(checkpoint), "--beam", "2"]
    return subprocess.run(
        [*command, "--device", "cpu", *flags, "ein Mann ."],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=ROOT,
        timeout=120,
    )


def test_translate_py_takes_the_models_languages_in_any_form(en_de_run: Path) -> None:
    plain = translate(en_de_run)
    assert plain.returncode == 0, plain.stderr
    for src, tgt in SAME_PAIR:
        flags = [*(["--src-lang", src] if src else []), *(["--tgt-lang", tgt] if tgt else [])]
        named = translate(en_de_run, *flags)
        assert named.returncode == 0, (flags, named.stderr)
        assert named.stdout == plain.stdout, flags  # the model's one pair: same translation
    wrong = translate(en_de_run, "--src-lang", "eng", "--tgt-lang", "fra")
    assert wrong.returncode == 1 and wrong.stdout == "" and "Traceback" not in wrong.stderr
    assert wrong.stderr.splitlines() == [
        "translate.py: error: --tgt-lang: this model has no target language 'fra' (French); it "
        "translates en -> de; give one of its languages (any form) or drop --tgt-lang"
    ]


def test_distill_py_refuses_a_pair_that_is_not_its_teachers(
    en_de_run: Path, tmp_path: Path
) -> None:
    """The flags name the corpus files; a teacher would translate another language blindly."""
    data = tmp_path / "data"
    data.mkdir()
    for lang in ("fr", "de"):
        (data / f"train.{lang}").write_text("un homme .\n")
    flags = ["--teacher", str(en_de_run), "--data-dir", str(data), "--out", str(tmp_path / "o")]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "distill.py"), *flags, "--device", "cpu"]
        + ["--src-lang", "fr", "--tgt-lang", "de"],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        "distill.py: error: --src-lang: this model has no source language 'fr' (French); it "
        "translates en -> de; give one of its languages (any form) or drop --src-lang"
    ]
    assert not (tmp_path / "o").exists()

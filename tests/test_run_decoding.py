"""A run's decoding is the default: train.py records the search, precision and device of its
test scores in results.json and in every checkpoint ("decoding"); translate.py -c RUN with no
search flag decodes that way and reproduces results.json's test BLEU to the last digit, and
serve.py answers a request that names no search option with the same text. Flags and request
fields override one field each; a checkpoint written before the record decodes with today's
defaults.

The toy run decodes unlike the defaults on every field that changes output (beam 3, length
penalty 0.6, a length limit of 0.5 x source + 3, batches of 5, bf16 autocast), so a
translate.py that ignored the record would print other translations (checked below).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from attnmt.checkpoint import load_checkpoint, save_checkpoint
from attnmt.decoding.config import RunDecoding, SearchConfig
from attnmt.evaluation import corpus_bleu
from tests.test_serve import ENV, post, request, serve
from tests.train_helpers import ROOT, TOY, run_train

SEARCH = SearchConfig(beam_size=3, length_penalty=0.6, max_len_a=0.5, max_len_b=3, batch_size=5)
RECORD = {**asdict(SEARCH), "precision": "bf16", "device": "cpu"}
OVERRIDES = (
    *(f"decoding.{k}={v}" for k, v in asdict(SEARCH).items() if v != getattr(SearchConfig(), k)),
    "trainer.precision=bf16",  # autocast on any CPU (emulated where it lacks AVX512-BF16)
)
# Every search flag and --precision at today's defaults: what a run without a record gets.
TODAY = ("--beam", "5", "--length-penalty", "1", "--max-len-a", "1.2", "--max-len-b", "10")
TODAY += ("--batch-size", "64", "--precision", "fp32")
SRC, REF = TOY / "test.de", TOY / "test.en"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("decoding") / "run"
    proc = run_train(run_dir, *OVERRIDES, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def translate(
    checkpoint: Path, *flags: str, env: dict | None = None
) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "translate.py", "-c", str(checkpoint), *flags]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_results_json_and_every_checkpoint_record_the_tests_decoding(run: Path) -> None:
    results = json.loads((run / "results.json").read_text())
    assert results["decoding"] == RECORD
    checkpoints = sorted((run / "checkpoints").glob("*.pt"))
    assert {p.name for p in checkpoints} >= {"best.pt", "last.pt"}
    for path in checkpoints:
        assert load_checkpoint(path)["decoding"] == RECORD, path.name  # weights_only=True


def test_translate_py_without_search_flags_reproduces_results_json_to_the_digit(run: Path):
    results = json.loads((run / "results.json").read_text())["test"]["test"]
    proc = translate(run, "--input", str(SRC), "--ref", str(REF))
    assert proc.stdout == (run / "hyp.test.en").read_text(encoding="utf-8")  # train.py's test
    refs = REF.read_text(encoding="utf-8").splitlines()
    bleu = corpus_bleu(proc.stdout.splitlines(), refs)
    assert bleu.score == results["bleu"]  # every digit
    assert f"BLEU = {bleu}" in proc.stderr.splitlines()  # the line translate.py prints
    said = [line for line in proc.stderr.splitlines() if line.startswith("translate.py: decoding:")]
    assert len(said) == 1 and "beam 3, length penalty 0.6 (fairseq)" in said[0]
    assert "at most 0.5 x source + 3 tokens, 5 sentences a batch, bf16" in said[0]

    today = translate(run, "--input", str(SRC), *TODAY)
    assert today.stdout != proc.stdout  # the record changes what is printed


@pytest.mark.slow  # four translate.py processes
def test_a_flag_overrides_its_field_and_the_others_stay_the_runs(run: Path, tmp_path: Path):
    bare = tmp_path / "bare.pt"  # no record: every field comes from the flags
    ckpt = load_checkpoint(run / "checkpoints" / "best.pt")
    del ckpt["decoding"]
    save_checkpoint(bare, ckpt)
    longer = translate(run, "--input", str(SRC), "--max-len-b", "8")
    runs_flags = ("--beam", "3", "--length-penalty", "0.6", "--max-len-a", "0.5")
    runs_flags += ("--batch-size", "5", "--precision", "bf16")
    spelled = translate(bare, "--input", str(SRC), *runs_flags, "--max-len-b", "8")
    assert longer.stdout == spelled.stdout
    assert longer.stdout != translate(run, "--input", str(SRC)).stdout
    fp32 = translate(run, "--precision", "fp32", "Ein Hund .")
    assert "beam 3, length penalty 0.6 (fairseq)" in fp32.stderr
    assert "5 sentences a batch, fp32 (" in fp32.stderr


@pytest.mark.slow  # four translate.py processes
def test_a_checkpoint_without_a_record_decodes_with_todays_defaults(run: Path, tmp_path: Path):
    """A checkpoint written before runs recorded their decoding still loads (weights_only) and
    decodes as translate.py did then, without a word about the run's decoding."""
    old = tmp_path / "old.pt"
    ckpt = load_checkpoint(run / "checkpoints" / "best.pt")
    del ckpt["decoding"]
    save_checkpoint(old, ckpt)
    before = translate(old, "--input", str(SRC))
    assert "decoding:" not in before.stderr
    assert before.stdout == translate(run, "--input", str(SRC), *TODAY).stdout


def test_an_averaged_checkpoint_keeps_the_record(run: Path, tmp_path: Path) -> None:
    from attnmt.cli import average

    out = tmp_path / "avg.pt"
    assert average.main(["--run-dir", str(run), "--last", "2", "--output", str(out)]) == 0
    assert load_checkpoint(out)["decoding"] == RECORD


def test_serve_py_answers_a_request_without_options_as_translate_py_does(run: Path) -> None:
    sentences = SRC.read_text(encoding="utf-8").splitlines()[:5]
    expected = translate(run, *sentences, env=ENV).stdout.splitlines()  # serve.py's threads
    with serve(run) as served:
        status, answer = post(served.url, "/translate", {"sentences": sentences})
        assert status == 200, answer
        assert answer["translations"] == expected
        options = {k: v for k, v in asdict(SEARCH).items() if k != "batch_size"}  # the server's
        assert answer["options"] == options
        status, answer = post(served.url, "/translate", {"sentences": sentences, "beam_size": 1})
        assert status == 200 and answer["options"] == {**options, "beam_size": 1}
        assert request(served.url, "GET", "/info")[1]["precision"] == "bf16"


def test_bf16_on_a_cpu_whose_onednn_lacks_it_says_so_once_and_fp32_does_not(run: Path):
    """Capped to AVX2 (oneDNN without bf16), the run's bf16 decoding warns once on stderr,
    naming the flag; fp32 there, or bf16 where oneDNN has it, says nothing."""
    from attnmt.engine.packing import bf16_packing_runs

    capped = {**ENV, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    warned = translate(run, "--input", str(SRC), env=capped)
    said = [line for line in warned.stderr.splitlines() if "bf16 runs emulated" in line]
    assert len(said) == 1 and "--precision fp32" in said[0], warned.stderr
    assert (
        "bf16 runs emulated"
        not in translate(run, "--precision", "fp32", "Ein Hund .", env=capped).stderr
    )
    native = translate(run, "Ein Hund .", env=ENV).stderr
    assert ("bf16 runs emulated" in native) == (not bf16_packing_runs())


def test_serve_py_warns_of_emulated_bf16_under_its_own_name(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """serve.py (and distill.py) take the run's decoding through `run_decoding`, whose warning
    names the program that runs it."""
    from attnmt.cli import serve
    from attnmt.engine import packing
    from attnmt.engine.runs import run_decoding

    monkeypatch.setattr(packing, "bf16_packing_runs", lambda: False)
    args = serve.build_parser().parse_args(["-c", str(run)])
    options = serve.serve_options(args, serve.search_from_flags(args))
    cfg, precision, recorded = run_decoding(
        options.model.runtime(), options.search, str(run), "cpu"
    )
    assert (cfg, precision, recorded) == (SEARCH, "bf16", True)
    assert capsys.readouterr().err.startswith("serve.py: warning: bf16 runs emulated")


def test_the_stored_record_round_trips_and_unknown_keys_are_ignored() -> None:
    record = RunDecoding(SEARCH, "bf16", "cuda")
    assert RunDecoding.from_stored(record.as_dict()) == record
    assert RunDecoding.from_stored({**record.as_dict(), "a_later_field": 1}) == record
    assert RunDecoding.from_stored(None) is None
    with pytest.raises(ValueError, match="precision"):
        RunDecoding.from_stored({**record.as_dict(), "precision": "auto"})
    with pytest.raises(ValueError, match="beam_size"):
        RunDecoding.from_stored({**record.as_dict(), "beam_size": 0})

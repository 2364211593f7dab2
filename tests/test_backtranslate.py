"""scripts/backtranslate.sh as a user runs it: the data split, the reverse model, the synthetic
sources, the forward runs with and without the <BT> tag (toy corpus, a few updates each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.train_helpers import ROOT, TOY

SCRIPT = ROOT / "scripts" / "backtranslate.sh"


def _run(work: Path, corpus: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), str(work), str(corpus)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHON": sys.executable, **env},
    )


def test_bad_input_is_one_line(tmp_path):
    proc = _run(tmp_path / "work", tmp_path / "nowhere")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "has no train.en" in proc.stderr
    assert not (tmp_path / "work").exists()
    proc = _run(tmp_path / "work", TOY, REAL="40")
    assert proc.returncode == 2 and "leaves no monolingual text" in proc.stderr


@pytest.mark.slow
def test_end_to_end_on_the_toy_corpus(tmp_path):
    work = tmp_path / "work"
    args = (
        "debug=fast logger=none data.test_splits=[test] trainer.max_steps=4 "
        f"trainer.eval_every=4 data.cache_dir={tmp_path / 'cache'}"
    )
    proc = _run(work, TOY, REAL="30", TRAIN_ARGS=args, BT_ARGS="--beam 2", UNTAGGED="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = work / "data"
    assert len((data / "train.en").read_text().splitlines()) == 30
    mono = (data / "mono.de").read_text().splitlines()
    assert mono == (TOY / "train.de").read_text().splitlines()[30:]
    assert (data / "bt.de").read_text().splitlines() == mono
    assert len((data / "bt.en").read_text().splitlines()) == len(mono) == 10
    for name in ("reverse", "real_only", "real_bt", "real_bt_untagged"):
        assert json.loads((work / name / "results.json").read_text())["steps"] == 4, name
    assert "<BT>" in (work / "real_bt" / "spm.vocab").read_text()
    assert "<BT>" not in (work / "real_bt_untagged" / "spm.vocab").read_text()
    assert set(json.loads((work / "real_bt" / "results.json").read_text())["test"]) == {"real.test"}
    summary = proc.stdout.split("== test BLEU\n")[1].splitlines()
    assert [line.split()[:2] for line in summary] == [
        ["real_only", "test"],
        ["real_bt", "real.test"],
        ["real_bt_untagged", "real.test"],
    ]
    again = _run(work, TOY, REAL="30", TRAIN_ARGS=args, BT_ARGS="--beam 2", UNTAGGED="1")
    assert again.returncode == 0 and "back-translating" not in again.stdout  # all done: skipped

"""`scripts/prepare_data.py`: prepare once, then `train.py` finds everything in the cache."""

from __future__ import annotations

import subprocess
import sys

from tests.train_helpers import ROOT, TOY_ARGS, run_train

SCRIPT = str(ROOT / "scripts" / "prepare_data.py")


def _prepare(*overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, SCRIPT, *overrides]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_train_after_prepare_data_reads_the_cache_and_trains_nothing_again(tmp_path):
    cache = f"data.cache_dir={tmp_path / 'cache'}"
    prepared = _prepare(*TOY_ARGS, cache, "trainer.max_steps=3")  # other groups: ignored
    assert prepared.returncode == 0, prepared.stderr[-2000:]
    assert "prepared in" in prepared.stdout and "train 40 pairs" in prepared.stdout
    assert (tmp_path / "cache" / "spm").is_dir()
    cached = sorted((tmp_path / "cache").rglob("*.arrow"))

    trained = run_train(tmp_path / "run", cache, "trainer.max_steps=2")
    assert trained.returncode == 0, trained.stderr[-2000:]
    log = (tmp_path / "run" / "train.log").read_text()
    assert "reusing the SentencePiece model(s) prepared in" in log
    assert "training joint SentencePiece" not in log
    assert "caching" not in log  # no corpus read into Arrow again
    assert "encoding" not in trained.stdout + trained.stderr  # no progress bar: nothing re-encoded
    assert sorted((tmp_path / "cache").rglob("*.arrow")) == cached
    assert "first update done (step 1)" in log
    assert (tmp_path / "run" / "spm.model").is_file()  # the run dir still holds its model


def test_prepare_data_errors_are_one_line(tmp_path):
    missing = _prepare(f"data.dir={tmp_path / 'nowhere'}")
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"prepare_data.py: error: data.dir={tmp_path / 'nowhere'} is not a directory; point "
        "data.dir at a folder of <split>.<lang> files (e.g. train.de, train.en)"
    ]
    bad = _prepare("trainer.no_such_key=1")
    assert bad.returncode == 2 and bad.stderr.startswith("prepare_data.py: error: bad override")
    assert len(bad.stderr.strip().splitlines()) == 1

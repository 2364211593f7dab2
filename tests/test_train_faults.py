"""Faults that must not lose a run: a damaged `last.pt` (resume falls back to an intact
checkpoint), a full disk while saving (a real size-limited tmpfs), a diverging loss (skipped
updates, rollback with a lowered learning rate, or a one-line stop).

Each test injects the fault as it happens to users and checks what is left on disk."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import torch

import attnmt.training.loop as loop
from attnmt.checkpoint import CheckpointError, load_checkpoint
from attnmt.training import build
from attnmt.training.config import Configs
from attnmt.training.loop import TrainingError, fit
from tests.test_checkpoint import damage, flip_byte_in_tensor_data
from tests.train_helpers import TOY, run_train, toy_cfg


def _assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = load_checkpoint(a)["model"], load_checkpoint(b)["model"]
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=0, rtol=0, msg=name)


def _finite(path: Path) -> bool:
    ckpt = load_checkpoint(path)
    tensors = [*ckpt["model"].values(), *ckpt.get("train_weights", {}).values()]
    return all(torch.isfinite(t).all() for t in tensors if t.is_floating_point())


def _error_lines(text: str) -> list[str]:
    return [line for line in text.strip().splitlines() if line.startswith("train.py: error")]


# ------------------------------------------------------------------ damaged last.pt


def test_damaged_last_resumes_from_the_newest_intact_step_file(tmp_path):
    """last.pt has a flipped byte and step_8.pt is truncated: train.py moves last.pt aside,
    says so in one warning line, resumes from step_4.pt, and ends equal to a run that never
    stopped."""
    common = (
        "trainer.eval_every=4",
        "trainer.keep_last=5",
        "trainer.log_every=2",
        "trainer.num_threads=1",
    )
    run_dir = tmp_path / "run"
    fit(toy_cfg(tmp_path, *common, "trainer.max_steps=8"), run_dir)
    ckpts = run_dir / "checkpoints"
    flip_byte_in_tensor_data(ckpts / "last.pt", ckpts / "flipped")
    os.replace(ckpts / "flipped", ckpts / "last.pt")
    damage("truncated", ckpts / "step_8.pt", ckpts / "short")
    os.replace(ckpts / "short", ckpts / "step_8.pt")
    damaged_bytes = (ckpts / "last.pt").read_bytes()

    resumed = run_train(run_dir, *common, "trainer.max_steps=12")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log_text = (run_dir / "train.log").read_text()
    warnings = [line for line in log_text.splitlines() if "moved it to" in line]
    assert len(warnings) == 1, log_text[-3000:]
    assert "last.pt.damaged" in warnings[0] and "resuming from step_4.pt (step 4)" in warnings[0]
    assert (ckpts / "last.pt.damaged").read_bytes() == damaged_bytes  # kept, not overwritten
    assert load_checkpoint(ckpts / "last.pt")["train_state"]["step"] == 12

    fit(toy_cfg(tmp_path, *common, "trainer.max_steps=12"), tmp_path / "straight")
    _assert_same_weights(tmp_path / "straight" / "checkpoints" / "last.pt", ckpts / "last.pt")


def test_damaged_last_without_a_fallback_says_what_each_lacks(tmp_path):
    """No step files, and best.pt holds no optimizer: one line, and last.pt stays in place
    (moving it would let the next run start over in the same run dir)."""
    run_dir = tmp_path / "run"
    common = ("trainer.eval_every=4", "trainer.keep_last=0")
    fit(toy_cfg(tmp_path, *common, "trainer.max_steps=4"), run_dir)
    last = run_dir / "checkpoints" / "last.pt"
    damage("empty", last, last)
    with pytest.raises(CheckpointError) as error:
        fit(toy_cfg(tmp_path, *common, "trainer.max_steps=8"), run_dir)
    message = str(error.value)
    assert "\n" not in message and str(last) in message
    assert "best.pt has no optimizer/scaler/rng" in message
    assert last.exists() and not (run_dir / "checkpoints" / "last.pt.damaged").exists()


def test_init_from_a_damaged_checkpoint_is_one_line(tmp_path):
    fit(toy_cfg(tmp_path, "trainer.max_steps=2", "trainer.eval_every=2"), tmp_path / "base")
    bad = tmp_path / "bad.pt"
    flip_byte_in_tensor_data(tmp_path / "base" / "checkpoints" / "best.pt", bad)
    result = run_train(tmp_path / "tuned", f"trainer.init_from={bad}", "trainer.max_steps=2")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    lines = _error_lines(result.stderr)
    assert len(lines) == 1 and str(bad) in lines[0] and "checksum" in lines[0], result.stderr


# ------------------------------------------------------------------ full disk


@pytest.fixture
def small_fs(tmp_path):
    """A real 4 MiB tmpfs, mounted for the test (root only)."""
    mount = tmp_path / "fs"
    mount.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", f"attnmt-{uuid.uuid4().hex[:8]}", str(mount)],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.strip() or made.returncode})")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(folder: Path, leave: int) -> None:
    """Fill the filesystem of `folder` up to `leave` free bytes."""
    free = shutil.disk_usage(folder).free
    with open(folder / "filler", "wb") as f:
        f.write(b"\0" * max(free - leave, 0))


def test_full_disk_while_saving_keeps_the_previous_checkpoints(small_fs, tmp_path):
    """The run dir sits on a 4 MiB tmpfs, filled after the first validation but for 64 KiB (a
    checkpoint needs more, a log line less): the next save fails, the run says so in one
    line and exits non-zero; last.pt, best.pt and step_2.pt of the first run load, no temp
    file is left, and after freeing space the same command resumes and finishes."""
    run_dir = small_fs / "run"
    common = ("trainer.eval_every=2", "trainer.keep_last=2")
    first = run_train(run_dir, *common, "trainer.max_steps=2")
    assert first.returncode == 0, first.stderr[-3000:]
    ckpts = run_dir / "checkpoints"
    before = {p.name: p.read_bytes() for p in ckpts.iterdir()}
    assert set(before) == {"last.pt", "best.pt", "step_2.pt"}
    _fill(small_fs, leave=64 * 1024)

    full = run_train(run_dir, *common, "trainer.max_steps=4")
    assert full.returncode != 0 and "Traceback" not in full.stderr, full.stderr[-3000:]
    lines = _error_lines(full.stderr)
    assert len(lines) == 1, full.stderr[-3000:]
    assert "No space left on device" in lines[0] and "last.pt" in lines[0]
    assert {p.name for p in ckpts.iterdir()} == set(before)  # no partial file left
    for name, data in before.items():
        assert (ckpts / name).read_bytes() == data
        assert load_checkpoint(ckpts / name)["train_state"]["step"] == 2

    (small_fs / "filler").unlink()
    again = run_train(run_dir, *common, "trainer.max_steps=4")
    assert again.returncode == 0, again.stderr[-3000:]
    assert load_checkpoint(ckpts / "last.pt")["train_state"]["step"] == 4


# ------------------------------------------------------------------ divergence


def _nan_at(monkeypatch, updates: set[int]) -> None:
    """Make the training loss NaN at the given updates (1-based calls, update_freq=1)."""
    real = loop.label_smoothed_cross_entropy
    calls = [0]

    def poisoned(*args, **kwargs):
        calls[0] += 1
        out = real(*args, **kwargs)
        if calls[0] in updates:
            return out._replace(loss=out.loss * float("nan"))
        return out

    monkeypatch.setattr(loop, "label_smoothed_cross_entropy", poisoned)


def test_a_nan_batch_is_skipped_counted_and_never_reaches_a_checkpoint(
    tmp_path, monkeypatch, caplog
):
    _nan_at(monkeypatch, {3})
    run_dir = tmp_path / "run"
    with caplog.at_level("WARNING", logger="attnmt.training.loop"):
        fit(toy_cfg(tmp_path, "trainer.max_steps=6", "trainer.eval_every=3"), run_dir)
    results = json.loads((run_dir / "results.json").read_text())
    assert results["nonfinite_updates"] == 1 and results["steps"] == 6
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert (
        skipped
        == [
            "steps 1-5: 1 of 5 updates skipped (loss or gradient norm not finite), "
            "1 in a row at most (trainer.max_nonfinite=10)"
        ]
        or len(skipped) == 1
    ), skipped
    for name in ("last.pt", "best.pt", "step_3.pt", "step_6.pt"):
        assert _finite(run_dir / "checkpoints" / name), name
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")["train_state"]
    assert state["nonfinite_total"] == 1 and state["rollbacks"] == 0


def test_updates_nan_in_a_row_roll_back_with_a_lower_learning_rate(tmp_path, monkeypatch, caplog):
    """Updates 5 and 6 NaN with trainer.max_nonfinite=2: the run goes back to last.pt of
    step 4 (its weights and Adam moments), halves the learning rate and finishes."""
    _nan_at(monkeypatch, {5, 6})
    run_dir = tmp_path / "run"
    args = ("trainer.max_nonfinite=2", "trainer.eval_every=4", "trainer.log_every=2")
    with caplog.at_level("WARNING", logger="attnmt.training.loop"):
        fit(toy_cfg(tmp_path, *args, "trainer.max_steps=8"), run_dir)
    rolled = [r.getMessage() for r in caplog.records if "rolled back" in r.getMessage()]
    assert len(rolled) == 1 and "(step 4) with the learning rate x0.5" in rolled[0], rolled
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")["train_state"]
    assert state["rollbacks"] == 1 and state["lr_scale"] == 0.5 and state["nonfinite_total"] == 2
    assert state["step"] == 8 and _finite(run_dir / "checkpoints" / "last.pt")
    ckpt = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    cfg = Configs.from_hydra(toy_cfg(tmp_path, *args))
    scheduled = build.learning_rate(8, cfg.optim, ckpt["model_config"]["d_model"])
    assert math.isclose(ckpt["optimizer"]["param_groups"][0]["lr"], 0.5 * scheduled)


def test_divergence_with_on_divergence_stop_is_one_line(tmp_path, monkeypatch):
    _nan_at(monkeypatch, {3, 4})
    args = ("trainer.max_nonfinite=2", "trainer.on_divergence=stop", "trainer.log_every=2")
    with pytest.raises(TrainingError) as error:
        fit(toy_cfg(tmp_path, *args, "trainer.max_steps=8"), tmp_path / "run")
    assert "NaN/inf for 2 updates in a row (step 4)" in str(error.value)
    assert "\n" not in str(error.value)


def test_an_absurd_learning_rate_rolls_back_then_stops_in_one_line(tmp_path):
    """A run trained 4 updates, resumed through train.py with optim.lr=1e30: the loss turns
    NaN/inf at once, the validation loss too (that checkpoint is not good and not best.pt);
    the run rolls back to step_4.pt once at a lower rate, diverges again and stops in one
    line. Every checkpoint left holds finite weights, and best.pt is still step 4's."""
    run_dir = tmp_path / "run"
    fit(toy_cfg(tmp_path, "trainer.max_steps=4", "trainer.eval_every=2"), run_dir)
    best = (run_dir / "checkpoints" / "best.pt").read_bytes()
    result = run_train(
        run_dir,
        "optim.lr=1e30",
        "trainer.max_nonfinite=2",
        "trainer.max_rollbacks=1",
        "trainer.log_every=1",
        "trainer.eval_every=1",
        "trainer.max_steps=40",
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = _error_lines(result.stderr)
    assert len(lines) == 1 and "NaN/inf for 2 updates in a row" in lines[0], result.stderr
    assert "after 1 rollback(s)" in lines[0]
    log_text = (run_dir / "train.log").read_text()
    rolled = [line for line in log_text.splitlines() if "rolled back to" in line]
    assert len(rolled) == 1 and "step_4.pt (step 4)" in rolled[0], log_text[-3000:]
    for path in (run_dir / "checkpoints").glob("*.pt"):
        assert _finite(path), path
    assert (run_dir / "checkpoints" / "best.pt").read_bytes() == best


def test_without_a_good_checkpoint_divergence_stops_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train(
        run_dir,
        "optim.lr=1e30",
        "optim.warmup_steps=1",
        "trainer.max_nonfinite=2",
        "trainer.log_every=1",
        "trainer.eval_every=1",
        "trainer.max_steps=40",
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = _error_lines(result.stderr)
    assert len(lines) == 1 and "no checkpoint with a finite validation loss" in lines[0]
    assert not (run_dir / "checkpoints" / "best.pt").exists()


# ------------------------------------------------------------------ bad corpus lines


def _corpus(folder: Path, de: list[str], en: list[str]) -> Path:
    """The toy corpus with `de`/`en` lines appended to its train split (bytes allowed)."""
    shutil.copytree(TOY, folder)
    for lang, extra in (("de", de), ("en", en)):
        path = folder / f"train.{lang}"
        data = path.read_bytes()
        for line in extra:
            data += line if isinstance(line, bytes) else line.encode() + b"\n"
        path.write_bytes(data)
    return folder


def test_empty_and_over_long_pairs_are_skipped_and_counted(tmp_path):
    """Empty and whitespace-only sides, and a line of 3,000 words (far beyond data.max_len
    and the positions a model is trained on): skipped, counted in the log and results.json."""
    words = " ".join(["Haus"] * 3000)
    corpus = _corpus(
        tmp_path / "corpus",
        ["", "Ein Hund.", words, "Eine Katze."],
        ["An empty source.", "   ", " ".join(["house"] * 3000), "A cat."],
    )
    run_dir = tmp_path / "run"
    result = run_train(run_dir, f"data.dir={corpus}", "trainer.max_steps=2")
    assert result.returncode == 0, result.stderr[-3000:]
    dropped = json.loads((run_dir / "results.json").read_text())["dropped_pairs"]
    assert dropped == {"empty_side": 2, "length_ratio": 0, "over_max_len": 1}
    log_text = (run_dir / "train.log").read_text()
    assert "2 with an empty or whitespace-only side" in log_text
    assert "removed 1 of 42 training pairs longer than max_len=128" in log_text


@pytest.mark.parametrize("fault", ["invalid UTF-8", "line counts"])
def test_unusable_corpus_is_refused_in_one_line_and_nothing_half_written(tmp_path, fault):
    """12,000 lines (more than one Arrow record batch is written before the fault): invalid
    UTF-8 at line 11,000 of train.de, or a train.en one line short. One line names the file
    and line; no cache file (nor temp file) is left for the split."""
    n = 12_000
    de = [f"Satz {i}." for i in range(n)]
    en = [f"Sentence {i}." for i in range(n if fault == "invalid UTF-8" else n - 1)]
    if fault == "invalid UTF-8":
        de[10_959] = b"Gr\xfc\xdfe.\n"  # latin-1: line 40 + 10,960 = 11,000 of train.de
    corpus = _corpus(tmp_path / "corpus", de, en)
    cache = tmp_path / "cache"
    result = run_train(tmp_path / "run", f"data.dir={corpus}")  # caches in tmp_path/cache
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = _error_lines(result.stderr)
    assert len(lines) == 1, result.stderr[-3000:]
    if fault == "invalid UTF-8":
        assert f"{corpus / 'train.de'}: line 11000 is not valid UTF-8" in lines[0]
    else:
        assert f"line {n + 40} of {corpus / 'train.de'} has no counterpart" in lines[0]
    left = [p.name for p in cache.rglob("*") if p.is_file() and "train" in p.name]
    assert left == [], left

"""scripts/distill.py: a teacher's translations of the training sources as a corpus folder, an
ensemble of teachers, and resuming after a kill to the same result line for line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnmt.checkpoint import model_payload, save_checkpoint
from attnmt.common.errors import UserError
from attnmt.training.distill import STATE_DIR, distill_corpus
from tests.helpers_decoding import PAIRS

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
SETTINGS = {"teachers": ["t"], "beam": 5}


def corpus(folder: Path, n: int) -> Path:
    """A corpus folder: train.{de,en} of `n` lines, valid.{de,en}, a test split, a README."""
    folder.mkdir(parents=True, exist_ok=True)
    sources = [PAIRS[i % len(PAIRS)][0] + f" {i}" for i in range(n)]
    (folder / "train.de").write_text("".join(s + "\n" for s in sources))
    (folder / "train.en").write_text("".join(f"english {i}\n" for i in range(n)))
    for split in ("valid", "test2016"):
        (folder / f"{split}.de").write_text("Ein Hund.\n")
        (folder / f"{split}.en").write_text("A dog.\n")
    (folder / "SOURCE.md").write_text("provenance\n")
    return folder


def reverse_words(lines: list[str]) -> list[str]:
    return [" ".join(reversed(line.split())) for line in lines]


def test_the_corpus_keeps_its_layout_with_the_teachers_targets(tmp_path: Path) -> None:
    data = corpus(tmp_path / "data", 23)
    out = distill_corpus(reverse_words, data, tmp_path / "out", "de", "en", SETTINGS, 5, print)
    sources = (data / "train.de").read_text().splitlines()
    assert (out / "train.de").read_text() == (data / "train.de").read_text()
    assert (out / "train.en").read_text().splitlines() == reverse_words(sources)
    for name in ("valid.de", "valid.en", "test2016.de", "test2016.en", "SOURCE.md"):
        assert (out / name).read_bytes() == (data / name).read_bytes(), name
    assert not (out / STATE_DIR).exists()
    assert json.loads((out / "distill.json").read_text())["chunk_lines"] == 5


def test_a_run_killed_mid_chunk_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    data = corpus(tmp_path / "data", 23)
    whole = distill_corpus(reverse_words, data, tmp_path / "whole", "de", "en", SETTINGS, 5)
    calls = []

    def dies_in_the_third_chunk(lines: list[str]) -> list[str]:
        calls.append(len(lines))
        if len(calls) == 3:  # as a kill while the chunk was being written: half of it on disk
            partial = tmp_path / "out" / STATE_DIR / "train.en"
            with open(partial, "ab") as f:
                f.write(b"half a chu")
            raise KeyboardInterrupt
        return reverse_words(lines)

    with pytest.raises(KeyboardInterrupt):
        distill_corpus(dies_in_the_third_chunk, data, tmp_path / "out", "de", "en", SETTINGS, 5)
    state = json.loads((tmp_path / "out" / STATE_DIR / "state.json").read_text())
    assert state["lines"] == 10
    seen = []

    def counting(lines: list[str]) -> list[str]:
        seen.extend(lines)
        return reverse_words(lines)

    distill_corpus(counting, data, tmp_path / "out", "de", "en", SETTINGS, 5)
    assert len(seen) == 13  # only what was not saved is translated again
    assert (tmp_path / "out" / "train.en").read_bytes() == (whole / "train.en").read_bytes()


def test_keep_original_puts_the_corpus_pairs_after_the_teachers_also_when_killed_at_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = corpus(tmp_path / "data", 12)
    sources = (data / "train.de").read_text().splitlines()
    originals = (data / "train.en").read_text().splitlines()
    moves = []
    real_replace = os.replace

    def dies_moving_the_second_file(a, b):  # noqa: ANN001, ANN202
        moves.extend([b] if Path(b).name.startswith("train.") else [])
        if len(moves) == 2:  # train.de is in, train.en not yet, the work folder is there
            raise KeyboardInterrupt
        return real_replace(a, b)

    monkeypatch.setattr(os, "replace", dies_moving_the_second_file)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        distill_corpus(reverse_words, data, out, "de", "en", SETTINGS, 5, print, True)
    assert not (out / "distill.json").exists()  # unfinished: a rerun finishes it
    monkeypatch.setattr(os, "replace", real_replace)
    seen: list[str] = []
    distill_corpus(
        lambda lines: seen.extend(lines) or reverse_words(lines),
        data, out, "de", "en", SETTINGS, 5, print, True,
    )  # fmt: skip
    assert not seen  # every chunk was saved: nothing translated again
    assert (out / "train.de").read_text().splitlines() == sources + sources
    assert (out / "train.en").read_text().splitlines() == reverse_words(sources) + originals
    assert json.loads((out / "distill.json").read_text())["keep_original"].endswith("train.en")
    assert not (out / STATE_DIR).exists()
    distill_corpus(reverse_words, data, out, "de", "en", SETTINGS, 5, print, True)  # done: as is
    with pytest.raises(UserError, match="already distilled with other settings"):
        distill_corpus(reverse_words, data, out, "de", "en", SETTINGS, 5)  # not silently plain
    with pytest.raises(UserError, match="other settings"):  # a plain run's state differs
        (out / "distill.json").unlink()
        (out / STATE_DIR).mkdir()
        state = {"settings": {"teachers": ["t"]}, "lines": 0, "bytes": 0}
        (out / STATE_DIR / "state.json").write_text(json.dumps(state))
        distill_corpus(reverse_words, data, out, "de", "en", SETTINGS, 5, print, True)


def two_best(lines: list[str]) -> list[list[str]]:
    """Two hypotheses a line (the reversed words, then the words as they are); one for an
    empty line, as the search gives."""
    return [[" ".join(reversed(x.split())), x] if x else [""] for x in lines]


def test_nbest_makes_each_source_n_pairs_also_with_the_original_pairs(tmp_path: Path) -> None:
    data = corpus(tmp_path / "data", 12)
    (data / "train.de").write_text((data / "train.de").read_text() + "\n")  # and an empty line
    (data / "train.en").write_text((data / "train.en").read_text() + "empty\n")
    sources = (data / "train.de").read_text().splitlines()
    out = distill_corpus(two_best, data, tmp_path / "out", "de", "en", SETTINGS, 5, nbest=2)
    pairs = [hyp for hyps in two_best(sources) for hyp in (hyps * 2)[:2]]
    assert (out / "train.de").read_text().splitlines() == [s for s in sources for _ in "12"]
    assert (out / "train.en").read_text().splitlines() == pairs
    assert json.loads((out / "distill.json").read_text())["pairs_per_source"] == 2
    kept = distill_corpus(
        two_best, data, tmp_path / "kept", "de", "en", SETTINGS, 5, print, True, nbest=2
    )
    originals = (data / "train.en").read_text().splitlines()
    assert (kept / "train.de").read_text().splitlines() == [
        s for s in sources for _ in "12"
    ] + sources
    assert (kept / "train.en").read_text().splitlines() == pairs + originals
    with pytest.raises(UserError, match="already distilled with other settings"):
        distill_corpus(two_best, data, out, "de", "en", SETTINGS, 5)  # not silently 1-best


def test_other_settings_and_bad_folders_are_one_line(tmp_path: Path) -> None:
    data = corpus(tmp_path / "data", 12)

    def dies(lines: list[str]) -> list[str]:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        distill_corpus(dies, data, tmp_path / "out", "de", "en", SETTINGS, 5)
    with pytest.raises(UserError, match="unfinished distillation with other settings"):
        distill_corpus(reverse_words, data, tmp_path / "out", "de", "en", {"beam": 1}, 5)
    with pytest.raises(UserError, match="has no train.fr"):
        distill_corpus(reverse_words, data, tmp_path / "o2", "fr", "en", SETTINGS, 5)
    with pytest.raises(UserError, match="folder of its own"):
        distill_corpus(reverse_words, data, data, "de", "en", SETTINGS, 5)
    (data / "train.de").write_text("")
    with pytest.raises(UserError, match="is empty"):
        distill_corpus(reverse_words, data, tmp_path / "o3", "de", "en", SETTINGS, 5)


def distill(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "distill.py"), *args],
        env=ENV,
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_script_translates_like_translate_py_and_resumes_after_sigkill(
    tmp_path: Path, checkpoint: Path
) -> None:
    """An ensemble of two teachers, killed with SIGKILL once some chunks are saved, run again:
    train.en is translate.py's output for the same ensemble and beam, line for line."""
    data = corpus(tmp_path / "data", 160)
    teacher_b = tmp_path / "b.pt"
    save_checkpoint(teacher_b, model_payload(*_model_and_tokenizer(checkpoint)))
    flags = ["--teacher", str(checkpoint), "--teacher", str(teacher_b), "--data-dir", str(data)]
    flags += ["--out", str(tmp_path / "out"), "--src-lang", "de", "--tgt-lang", "en"]
    flags += ["--beam", "3", "--chunk-lines", "8", "--device", "cpu"]
    first = distill(*flags)
    state = tmp_path / "out" / STATE_DIR / "state.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and first.poll() is None:
        if state.exists() and json.loads(state.read_text())["lines"] >= 16:
            first.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    first.wait(60)
    second = distill(*flags)
    _, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert first.returncode == -signal.SIGKILL  # killed mid-run, not finished
    assert "resuming: " in err, err
    expected = subprocess.run(
        [sys.executable, str(ROOT / "translate.py"), "-c", str(checkpoint), "-c", str(teacher_b)]
        + ["--beam", "3", "--device", "cpu", "--input", str(data / "train.de")],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=ROOT,
        timeout=120,
        check=True,
    ).stdout
    assert (tmp_path / "out" / "train.en").read_text() == expected
    assert "ETA" in err and "lines/s" in err


def test_the_script_writes_the_nbest_of_translate_py_as_pairs(
    tmp_path: Path, checkpoint: Path
) -> None:
    """--nbest 2: two pairs a source, train.en the hypotheses translate.py --nbest 2 prints,
    best first; where the beam's two differ, so do the two lines."""
    data = corpus(tmp_path / "data", 12)
    flags = ["--teacher", str(checkpoint), "--data-dir", str(data), "--out", str(tmp_path / "o")]
    flags += ["--src-lang", "de", "--tgt-lang", "en", "--beam", "3", "--device", "cpu"]
    proc = distill(*flags, "--nbest", "2")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    printed = subprocess.run(
        [sys.executable, str(ROOT / "translate.py"), "-c", str(checkpoint), "--nbest", "2"]
        + ["--beam", "3", "--device", "cpu", "--input", str(data / "train.de")],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=ROOT,
        timeout=120,
        check=True,
    ).stdout.splitlines()
    expected = [line.split(" ||| ")[1] for line in printed]  # INDEX ||| TEXT ||| SCORE
    sources = (data / "train.de").read_text().splitlines()
    assert len(expected) == 2 * len(sources)
    assert (tmp_path / "o" / "train.en").read_text().splitlines() == expected
    assert (tmp_path / "o" / "train.de").read_text().splitlines() == [
        s for s in sources for _ in "12"
    ]
    assert any(a != b for a, b in zip(expected[::2], expected[1::2], strict=True))
    settings = json.loads((tmp_path / "o" / "distill.json").read_text())
    assert settings["pairs_per_source"] == 2 and settings["search"]["nbest"] == 2


def _model_and_tokenizer(path: Path) -> tuple:
    """Another teacher of the same tokenizer: the checkpoint's model with other weights."""
    import torch

    from attnmt.checkpoint import load_for_inference

    model, tokenizer, _ = load_for_inference(path)
    torch.manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model, tokenizer


def test_bad_flags_are_one_line(tmp_path: Path, checkpoint: Path) -> None:
    data = corpus(tmp_path / "data", 4)
    proc = distill("--teacher", str(checkpoint), "--data-dir", str(data), "--out", str(data))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "Traceback" not in err
    assert err.strip().splitlines() == [err.strip()] and "distill.py: error: " in err
    assert "does not say its languages" in err  # a checkpoint without a training config

"""Sequence-level knowledge distillation (Kim & Rush 2016): a teacher's translations of a corpus's
training sources become the targets a student is trained on.

`distill_corpus` writes a corpus folder of the same layout as the one it reads: `train.<src>`
copied as given, `train.<tgt>` the teacher's translations (line i translates line i), every
other file (the valid and test splits, other languages) copied. `train.py data.dir=OUT` trains
on it like on any local corpus. With `keep_original`, the corpus's own pairs follow the
teacher's in `train.<src>` and `train.<tgt>` (line n + i is the original pair i), so the
student learns from both (docs/distillation.md#measured-multi30k-en-de). With `nbest` N above
1, each source has N pairs (its N-best translations, best first, as extra pairs): `train.<tgt>`
holds N lines a source and `train.<src>` repeats each source N times, so line k of one still
translates line k of the other; a source the search gives fewer hypotheses (an empty line gets
one) repeats its last one to N.

It resumes: the sources are translated in chunks of `chunk_lines` lines, each appended to
`OUT/.distill/train.<tgt>` and then recorded (lines and bytes done) in `OUT/.distill/state.json`,
written atomically. A process killed at any moment leaves at most one chunk half-written past
the recorded bytes; the next run cuts it off and goes on. Chunks are the same in every run
(their size is part of the state), and a chunk's translation depends only on its lines, so a
resumed run's output equals an uninterrupted run's, line for line.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from attnmt.common.errors import UserError
from attnmt.common.files import atomic_write
from attnmt.data.dataset import iter_corpus_lines

# A source's translation, or its hypotheses best first (with `nbest` above 1).
Translations = Sequence[str | Sequence[str]]
STATE_DIR = ".distill"  # OUT's work folder while a distillation is unfinished
SETTINGS_FILE = "distill.json"  # what made the corpus, beside it in OUT once done


def corpus_file(folder: Path, split: str, lang: str) -> Path:
    """`folder/<split>.<lang>`, or its `.gz` (the loader reads both; the plain one first)."""
    for name in (f"{split}.{lang}", f"{split}.{lang}.gz"):
        if (folder / name).is_file():
            return folder / name
    raise UserError(
        f"{folder} has no {split}.{lang} (or .gz); --data-dir must be a corpus folder of "
        f"<split>.<lang> files holding {split}.{lang}"
    )


class ProgressLine:
    """Lines done, lines/s and the time left, on one stderr line a chunk."""

    def __init__(self, total: int, start: int, log: Callable[[str], None]) -> None:
        self.total, self.start, self.log = total, start, log
        self.t0 = time.perf_counter()

    def __call__(self, done: int) -> None:
        elapsed = time.perf_counter() - self.t0
        rate = (done - self.start) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - done) / rate if rate > 0 else float("inf")
        self.log(
            f"distilled {done:,}/{self.total:,} lines ({100 * done / max(self.total, 1):.1f}%), "
            f"{rate:.1f} lines/s, ETA {_clock(eta)}"
        )


def _clock(seconds: float) -> str:
    if seconds == float("inf"):
        return "unknown"
    m, s = divmod(round(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


def _chunks(lines: list[str], start: int, size: int) -> Iterator[tuple[int, list[str]]]:
    """(lines done after the chunk, the chunk) from line `start` on."""
    for begin in range(start, len(lines), size):
        chunk = lines[begin : begin + size]
        yield begin + len(chunk), chunk


def _load_state(work: Path, settings: dict[str, Any], out: Path) -> dict[str, Any]:
    """The state of an unfinished run in `work` (or a fresh one); refuses other settings."""
    state_file = work / "state.json"
    if not state_file.exists():
        return {"settings": settings, "lines": 0, "bytes": 0}
    state = json.loads(state_file.read_text())
    if state["settings"] != settings:
        theirs = json.dumps(state["settings"], sort_keys=True)
        raise UserError(
            f"{out} holds an unfinished distillation with other settings ({theirs}); run it "
            f"again with those, or remove {work} to start over"
        )
    return state


def _target_lines(translations: Translations, nbest: int) -> str:
    """The target file's text for a chunk's translations: `nbest` lines a source, its
    hypotheses in order, the last repeated where it has fewer."""
    lines = []
    for found in translations:
        hyps = [found] if isinstance(found, str) else list(found)
        if not hyps or len(hyps) > nbest:
            raise ValueError(f"a source has {len(hyps)} translations, not 1 to {nbest}")
        lines += hyps + hyps[-1:] * (nbest - len(hyps))
    return "".join(line + "\n" for line in lines)


def distill_corpus(
    translate: Callable[[list[str]], Translations],
    data_dir: str | Path,
    out_dir: str | Path,
    src: str,
    tgt: str,
    settings: dict[str, Any],
    chunk_lines: int = 10_000,
    log: Callable[[str], None] = print,
    keep_original: bool = False,
    nbest: int = 1,
) -> Path:
    """Translate `data_dir/train.<src>` with `translate` into `out_dir/train.<tgt>`, copy the
    rest of `data_dir` into `out_dir`, and return `out_dir`'s path.

    `translate` gives each line's translation, or with `nbest` above 1 its hypotheses (up to
    `nbest`, best first): each becomes a pair of its own (the module's docstring).
    `settings` (teachers, search, languages: JSON values) is what made the translations; a run
    that finds an unfinished or finished one with other settings in `out_dir` stops with a
    `UserError`, and a finished one with the same settings is left as it is.
    """
    data, out = Path(data_dir), Path(out_dir)
    if data.resolve() == out.resolve():
        raise UserError(f"--out {out} is --data-dir; give the distilled corpus a folder of its own")
    src_file = corpus_file(data, "train", src)
    settings = {**settings, "chunk_lines": chunk_lines, "source": str(src_file.resolve())}
    if keep_original:  # a key only when set: the settings of runs before it stay equal
        settings["keep_original"] = str(corpus_file(data, "train", tgt).resolve())
    if nbest > 1:  # likewise
        settings["pairs_per_source"] = nbest
    if (out / SETTINGS_FILE).exists() and (out / f"train.{tgt}").exists():
        if json.loads((out / SETTINGS_FILE).read_text()) != settings:
            raise UserError(
                f"{out} is already distilled with other settings ({out / SETTINGS_FILE}); "
                "give another --out, or remove it to distill again"
            )
        log(f"{out} is already distilled ({out / SETTINGS_FILE}); nothing to do")
        return out
    work = out / STATE_DIR
    work.mkdir(parents=True, exist_ok=True)
    state = _load_state(work, settings, out)
    atomic_write(work / "state.json", json.dumps(state, indent=1))  # the settings, pinned
    sources = list(iter_corpus_lines(src_file))
    if not sources:
        raise UserError(f"{src_file} is empty; give --data-dir a corpus with training sources")
    partial = work / f"train.{tgt}"
    with open(partial, "ab") as f:
        f.truncate(state["bytes"])  # drop a chunk a killed run wrote only part of
    if state["lines"]:
        log(f"resuming: {state['lines']:,} of {len(sources):,} lines were distilled before")
    progress = ProgressLine(len(sources), state["lines"], log)
    for done, chunk in _chunks(sources, state["lines"], chunk_lines):
        translations = translate(chunk)
        if len(translations) != len(chunk):
            raise ValueError(f"{len(chunk)} lines got {len(translations)} translations")
        text = _target_lines(translations, nbest).encode("utf-8")
        with open(partial, "ab") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        state = {"settings": settings, "lines": done, "bytes": state["bytes"] + len(text)}
        atomic_write(work / "state.json", json.dumps(state, indent=1))
        progress(done)
    _finish(data, out, partial, (src, tgt), settings)
    shutil.rmtree(work)
    return out


def _finish(data: Path, out: Path, partial: Path, pair: tuple[str, str], settings: dict) -> None:
    """Copy the corpus around the translations into `out` (the sources as given), then the
    translations (each source repeated once per hypothesis with `pairs_per_source`; after
    them the original sources, and the original targets after the translations, with
    `keep_original`), each written whole in the work folder and moved in, then say what made
    them (`distill.json`, last: its presence means the folder is complete). `partial` stays
    until the work folder goes, so a run killed here redoes this from it."""
    src, tgt = pair
    original = corpus_file(data, "train", src)
    repeat = settings.get("pairs_per_source", 1)  # each source, once per hypothesis
    parts = {tgt: [(partial, 1)]}
    if repeat > 1:
        parts[src] = [(original, repeat)]
    if "keep_original" in settings:
        parts[src] = [(original, repeat), (original, 1)]
        parts[tgt] = [(partial, 1), (Path(settings["keep_original"]), 1)]
    written = {f"train.{lang}{gz}" for lang in parts for gz in ("", ".gz")}
    for item in sorted(data.iterdir()):
        if item.is_file() and item.name not in written:
            shutil.copy2(item, out / item.name)
    for lang, files in parts.items():
        whole = partial.with_name(f"whole.{lang}")
        with open(whole, "w", encoding="utf-8", newline="\n") as f:
            for path, times in files:
                f.writelines((line + "\n") * times for line in iter_corpus_lines(path))
        os.replace(whole, out / f"train.{lang}")
    atomic_write(out / SETTINGS_FILE, json.dumps(settings, indent=1) + "\n")

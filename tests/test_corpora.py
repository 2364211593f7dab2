"""Several training corpora in one run (`data.corpora`): sampling weights as shares of pairs
per epoch, source tags as one SentencePiece piece, validation and test from named corpora,
exact resume, translate.py --tag, and one-line errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from attnmt.checkpoint import load_checkpoint
from attnmt.data.batching import TokenBatchSampler
from attnmt.data.dataset import DataConfig, corpora
from attnmt.data.errors import DataError
from attnmt.training.loop import fit
from tests.train_helpers import ROOT, TOY, run_train, toy, toy_cfg


def _epoch_rows(sampler: TokenBatchSampler, epoch: int) -> list[int]:
    sampler.set_epoch(epoch)
    return [i for batch in sampler for i in batch]


@pytest.mark.parametrize("weights", [(1.0, 1.0), (3.0, 1.0), (1.0, 4.0)])
def test_an_epoch_draws_each_corpus_by_its_share_of_pairs(weights):
    sizes = (100, 300)
    n = sum(sizes)
    lengths = np.random.default_rng(0).integers(1, 30, n)
    sampler = TokenBatchSampler(
        lengths, lengths, 256, seed=3, mixture=list(zip(sizes, weights, strict=True))
    )
    for epoch in (0, 1):
        rows = _epoch_rows(sampler, epoch)
        drawn = [sum(r < sizes[0] for r in rows), sum(r >= sizes[0] for r in rows)]
        assert drawn == [round(n * w / sum(weights)) for w in weights]
        counts = Counter(rows)
        for lo, hi, share in ((0, sizes[0], drawn[0]), (sizes[0], n, drawn[1])):
            copies = [counts.get(i, 0) for i in range(lo, hi)]
            # Whole copies of the corpus, plus a subset: no pair twice more than another.
            assert max(copies) - min(copies) <= 1 and sum(copies) == share
    # The subsets change from epoch to epoch, and are the same for the same (seed, epoch).
    assert sorted(_epoch_rows(sampler, 0)) != sorted(_epoch_rows(sampler, 1))
    again = TokenBatchSampler(
        lengths, lengths, 256, seed=3, mixture=list(zip(sizes, weights, strict=True))
    )
    assert _epoch_rows(again, 1) == _epoch_rows(sampler, 1)


def test_one_corpus_of_weight_one_batches_as_without_a_mixture():
    lengths = np.random.default_rng(1).integers(1, 30, 200)
    plain = TokenBatchSampler(lengths, lengths, 200, seed=5)
    mixed = TokenBatchSampler(lengths, lengths, 200, seed=5, mixture=[(200, 1.0)])
    assert _epoch_rows(plain, 2) == _epoch_rows(mixed, 2)


def test_ranks_share_the_mixed_epoch():
    lengths = np.random.default_rng(2).integers(1, 30, 120)
    mixture = [(20, 2.0), (100, 1.0)]
    one = Counter(_epoch_rows(TokenBatchSampler(lengths, lengths, 128, mixture=mixture), 0))
    ranks = Counter()
    for rank in (0, 1):
        sampler = TokenBatchSampler(lengths, lengths, 128, mixture=mixture, rank=rank, world_size=2)
        ranks.update(_epoch_rows(sampler, 0))
    assert ranks == one


def _two_corpora(tmp: Path, *extra: str) -> tuple[str, ...]:
    """The toy corpus twice: `real` (data.dir) and `bt` (a folder of a copy of its training
    split, nothing else), tagged."""
    folder = tmp / "bt"
    if not folder.exists():
        folder.mkdir()
        for lang in ("de", "en"):
            shutil.copy(TOY / f"train.{lang}", folder / f"train.{lang}")
    return (
        f"data.dir={TOY}",
        "+data.corpora.real.weight=1",
        f"+data.corpora.bt.dir={folder}",
        "+data.corpora.bt.weight=3",
        "+data.corpora.bt.tag='<BT>'",
        "data.valid_from=[real]",
        *extra,
    )


def test_tag_is_one_piece_at_the_start_of_its_corpus_sources(tmp_path):
    run = toy(tmp_path, *_two_corpora(tmp_path))
    data, tokenizer = run.data, run.data.tokenizer
    assert list(tokenizer.tags) == ["<BT>"]
    tag = tokenizer.tags["<BT>"]
    real, bt = data.mixture
    assert real == (40, 1.0) and bt == (40, 3.0)
    rows = data.train[:]
    assert all(ids[0] != tag for ids in rows["src_ids"][:40])
    assert all(ids[0] == tag for ids in rows["src_ids"][40:])
    # The rest is encoded as the untagged sentence is.
    assert [ids[1:] for ids in rows["src_ids"][40:]] == rows["src_ids"][:40]
    assert list(data.test) == ["real.test"] and data.test_langs == {"real.test": "en"}
    assert all(not s.startswith("<BT>") for s in data.valid["src"])


def test_resume_with_corpora_equals_uninterrupted(tmp_path):
    common = (*_two_corpora(tmp_path), "model.dropout=0.1", "trainer.eval_every=6")
    fit(toy_cfg(tmp_path, *common, "trainer.max_steps=12"), tmp_path / "straight")
    fit(toy_cfg(tmp_path, *common, "trainer.max_steps=6"), tmp_path / "resumed")
    fit(toy_cfg(tmp_path, *common, "trainer.max_steps=12"), tmp_path / "resumed")
    straight = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")
    resumed = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")
    for key in ("step", "epoch", "batches_done"):
        assert resumed["train_state"][key] == straight["train_state"][key], key
    for name, value in straight["model"].items():
        torch.testing.assert_close(resumed["model"][name], value, atol=0, rtol=0, msg=name)
    results = json.loads((tmp_path / "straight" / "results.json").read_text())
    assert set(results["test"]) == {"real.test"}
    assert (tmp_path / "straight" / "hyp.real.test.en").is_file()


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"a": {"weight": 0}}, "data.corpora.a.weight=0 must be a positive number"),
        ({"a": {"weight": -1}}, "data.corpora.a.weight=-1 must be a positive number"),
        ({"a": {"tag": "<2 de>"}}, "must be one word without spaces"),
        ({"a": {"wieght": 1}}, "unknown key(s) wieght"),
    ],
)
def test_bad_corpus_entries_are_one_line(entry, message):
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        corpora(DataConfig(corpora=entry, valid_from=["a"]))


def test_valid_from_must_name_a_listed_corpus():
    with pytest.raises(DataError, match=r"data.valid_from names none"):
        corpora(DataConfig(corpora={"a": {}}))
    with pytest.raises(DataError, match=r"data.test_from names b, which data.corpora"):
        corpora(DataConfig(corpora={"a": {}}, valid_from=["a"], test_from=["b"]))


def test_relative_corpus_dir_is_under_data_dir():
    (a,) = corpora(
        DataConfig(dir="/x", corpora={"a": {"dir": "y", "tgt_lang": "fr"}}, valid_from=["a"])
    )
    assert a.data.dir == "/x/y" and a.data.tgt_lang == "fr" and a.data.hub_name is None


def _one_error_line(proc: subprocess.CompletedProcess, prog: str, message: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith(f"{prog}: error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr[-1500:]


def test_corpus_list_without_valid_split_is_one_line(tmp_path):
    proc = run_train(tmp_path / "run", *_two_corpora(tmp_path, "data.valid_from=[bt]"))
    _one_error_line(proc, "train.py", "split 'valid' not found")


@pytest.mark.slow
def test_tag_unknown_to_init_from_checkpoint_is_one_line(tmp_path):
    fit(toy_cfg(tmp_path, "trainer.max_steps=2", "trainer.eval_every=2"), tmp_path / "base")
    proc = run_train(
        tmp_path / "run", *_two_corpora(tmp_path), f"trainer.init_from={tmp_path / 'base'}"
    )
    _one_error_line(proc, "train.py", "unknown tag(s) <BT>")


@pytest.mark.slow
def test_translate_tag_flag(tmp_path):
    """A two-target toy model (de->en tagged <2en>, de->de tagged <2de>): --tag picks the
    target; a tag the model does not know is one line."""
    folder = tmp_path / "corpus"
    shutil.copytree(TOY, folder)
    for split in ("train", "valid", "test"):  # a "copy" direction de->de, as language "xx"
        shutil.copy(TOY / f"{split}.de", folder / f"{split}.xx")
    overrides = (
        f"data.dir={folder}",
        "+data.corpora.en.tgt_lang=en",
        "+data.corpora.en.tag='<2en>'",
        "+data.corpora.xx.tgt_lang=xx",
        "+data.corpora.xx.tag='<2xx>'",
        "data.valid_from=[en,xx]",
        "trainer.max_steps=4",
        "trainer.eval_every=4",
    )
    assert run_train(tmp_path / "run", *overrides).returncode == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert set(results["test"]) == {"en.test", "xx.test"}

    def translate(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, str(ROOT / "translate.py"), "-c", str(tmp_path / "run"), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)

    tagged = translate("--tag", "<2xx>", "--beam", "1", "Ein Mann.", "", "Zwei Hunde.")
    typed = translate("--beam", "1", "<2xx> Ein Mann.", "", "<2xx> Zwei Hunde.")
    assert tagged.returncode == 0, tagged.stderr
    assert tagged.stdout == typed.stdout and len(tagged.stdout.splitlines()) == 3
    _one_error_line(translate("--tag", "<2fr>", "Ein Mann."), "translate.py", "<2en>, <2xx>")

"""`benchmarks/bench_data.py`: the grown corpora are aligned, varied, and the stages run."""

from __future__ import annotations

import json
import subprocess
import sys

from benchmarks.bench_data import build_corpus, read_lines
from tests.train_helpers import ROOT, TOY


def test_grown_corpus_is_aligned_and_mixes_single_and_joined_pairs(tmp_path):
    """Sampled with replacement, half of the pairs joined with another: aligned, varied."""
    out = build_corpus(TOY, tmp_path / "c", 500, ("de", "en"), seed=1)
    src, tgt = read_lines(out / "train.de"), read_lines(out / "train.en")
    assert len(src) == len(tgt) == 500
    orig = list(zip(read_lines(TOY / "train.de"), read_lines(TOY / "train.en"), strict=True))
    singles = set(orig)
    joined = {(f"{a[0]} {b[0]}", f"{a[1]} {b[1]}") for a in orig for b in orig}
    pairs = list(zip(src, tgt, strict=True))
    assert all(p in singles or p in joined for p in pairs)  # still aligned translations
    n_joined = sum(p in joined for p in pairs)
    assert 150 < n_joined < 350  # about half of them
    assert len(set(pairs)) > 200  # the 40 source pairs give far more than 40 distinct ones
    assert read_lines(out / "valid.de") == read_lines(TOY / "valid.de")


def test_one_size_reports_every_stage(tmp_path):
    cmd = [sys.executable, "-m", "benchmarks.bench_data", "--corpus", str(TOY)]
    cmd += ["--langs", "de", "en", "--sizes", "300", "--work", str(tmp_path), "--json"]
    cmd += ["--experiment=multi30k_de_en", "--override=tokenizer.vocab_size=100"]
    cmd += ["--override=data.test_splits=[test]", "--override=data.hub_name=null"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    row = json.loads(out.stdout.splitlines()[0])
    assert row["size"] == 300 and row["pairs"] == 300
    assert set(row["seconds"]) == {"load", "filter", "sentencepiece", "encode", "first_batch"}
    assert row["rss_mib"] > 0 and row["cache_mib"] > 0
    assert "| 300 | 300 |" in out.stdout  # the Markdown table

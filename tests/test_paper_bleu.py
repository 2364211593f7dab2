"""The paper's tokenized, compound-split BLEU (`evaluation/paper_bleu.py`) against a BLEU
computed here by multi-bleu.perl's formula on tokens written out by hand, and
`scripts/score.py` as users run it."""

from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter

import pytest

from attnmt.evaluation.bleu import corpus_bleu
from attnmt.evaluation.paper_bleu import SIGNATURE, paper_bleu, paper_tokens
from tests.train_helpers import ROOT


@pytest.mark.parametrize(
    "line, tokens",
    [
        # Punctuation and German quotes split off; a hyphen between letters is its own token.
        (
            "„Hallo“, sagte Dr. Müller-Lüdenscheidt.",
            "„ Hallo “ , sagte Dr . Müller - Lüdenscheidt .",
        ),
        # Hyphens next to digits are kept by the tokenizer, then compound-split like Perl's s///g:
        # non-overlapping, so the second hyphen of 1-2-3 stays.
        ("Seiten 1-2-3 im Jahr 2014", "Seiten 1 ##AT##-##AT## 2-3 im Jahr 2014"),
        ("geht's 3,5 Mio. €", "geht ' s 3,5 Mio . €"),
    ],
)
def test_lines_are_tokenized_and_compound_split(line, tokens):
    assert paper_tokens(line) == tokens


def _multi_bleu(hyps: list[str], refs: list[str]) -> float:
    """multi-bleu.perl's BLEU of whitespace-tokenized lines (one reference, no smoothing)."""
    correct, total, hyp_len, ref_len = [0] * 4, [0] * 4, 0, 0
    for hyp, ref in zip(hyps, refs, strict=True):
        h, r = hyp.split(), ref.split()
        hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
        for n in range(1, 5):
            grams = Counter(tuple(h[i : i + n]) for i in range(len(h) - n + 1))
            ref_grams = Counter(tuple(r[i : i + n]) for i in range(len(r) - n + 1))
            correct[n - 1] += sum(min(c, ref_grams[g]) for g, c in grams.items())
            total[n - 1] += max(len(h) - n + 1, 0)
    if min(correct) == 0:
        return 0.0
    brevity = 1.0 if hyp_len >= ref_len else math.exp(1 - ref_len / hyp_len)
    return (
        100
        * brevity
        * math.exp(sum(math.log(c / t) for c, t in zip(correct, total, strict=True)) / 4)
    )


HYPS = ["Das ist ein Rich-Text-Format für alle.", "„Hallo“, sagte Dr. Müller zu ihr."]
REFS = ["Das ist ein Rich-Text-Format für alle.", "„Hallo“, sagte Dr. Meier zu ihr."]


def test_paper_bleu_is_multi_bleu_of_the_tokenized_compound_split_lines():
    tokenized = (
        ["Das ist ein Rich - Text - Format für alle .", "„ Hallo “ , sagte Dr . Müller zu ihr ."],
        ["Das ist ein Rich - Text - Format für alle .", "„ Hallo “ , sagte Dr . Meier zu ihr ."],
    )
    assert [paper_tokens(x) for x in HYPS + REFS] == tokenized[0] + tokenized[1]
    score = paper_bleu(HYPS, REFS)
    assert score.score == pytest.approx(_multi_bleu(*tokenized))
    assert score.signature == SIGNATURE
    # sacreBLEU's 13a keeps compounds and German quotes whole: fewer, rarer n-grams, lower BLEU.
    assert corpus_bleu(HYPS, REFS).score < score.score - 5


def test_score_py_prints_both_bleus_and_refuses_unaligned_files(tmp_path):
    hyp, ref = tmp_path / "hyp.de", tmp_path / "ref.de"
    hyp.write_text("\n".join(HYPS) + "\n")
    ref.write_text("\n".join(REFS) + "\n")
    script = [sys.executable, str(ROOT / "scripts" / "score.py")]
    proc = subprocess.run([*script, "--hyp", hyp, "--ref", ref], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    print(proc.stdout)
    count, bleu, _, paper = proc.stdout.splitlines()
    assert bleu.startswith("sacreBLEU BLEU") and f"{corpus_bleu(HYPS, REFS).score:.2f}" in bleu
    assert "tok:13a" in bleu and "version:" in bleu  # the signature
    assert paper.startswith("paper BLEU") and f"{paper_bleu(HYPS, REFS).score:.2f}" in paper
    assert count.split() == ["sentences", "2"]

    ref.write_text(REFS[0] + "\n")
    proc = subprocess.run([*script, "--hyp", hyp, "--ref", ref], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == (
        "score.py: error: --hyp has 2 lines but --ref has 1; give line-aligned files\n"
    )

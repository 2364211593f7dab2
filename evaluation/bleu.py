"""Corpus BLEU and chrF with sacreBLEU, on detokenized text, with their signatures."""

from __future__ import annotations

from typing import NamedTuple

from sacrebleu.metrics import BLEU, CHRF


class Score(NamedTuple):
    score: float
    signature: str

    def __str__(self) -> str:
        return f"{self.score:.2f} ({self.signature})"


def corpus_bleu(hyps: list[str], refs: list[str]) -> Score:
    """sacreBLEU BLEU (13a tokenizer, exp smoothing) of raw hypotheses against raw references."""
    check_lengths(hyps, refs)
    metric = BLEU()
    result = metric.corpus_score(hyps, [refs])
    return Score(result.score, str(metric.get_signature()))


def corpus_chrf(hyps: list[str], refs: list[str]) -> Score:
    """sacreBLEU chrF (character 6-grams, beta 2)."""
    check_lengths(hyps, refs)
    metric = CHRF()
    result = metric.corpus_score(hyps, [refs])
    return Score(result.score, str(metric.get_signature()))


def check_lengths(hyps: list[str], refs: list[str]) -> None:
    """Raises ValueError unless there is one reference per hypothesis."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")

"""Scoring: sacreBLEU BLEU and chrF with signatures."""

from attnmt.evaluation.bleu import Score, corpus_bleu, corpus_chrf

__all__ = ["Score", "corpus_bleu", "corpus_chrf"]

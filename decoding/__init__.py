"""Inference: greedy/beam search on the KV cache (`search`), text in/out (`translator`).

Attention heatmaps live in `decoding.plot` (imported on demand: it pulls in matplotlib).
"""

from decoding.search import (
    Hypothesis,
    SearchConfig,
    SearchResult,
    beam_search,
    greedy_search,
    length_penalty_divisor,
    max_lengths,
)
from decoding.translator import SentenceAttention, TextHypothesis, Translator

__all__ = [
    "Hypothesis",
    "SearchConfig",
    "SearchResult",
    "SentenceAttention",
    "TextHypothesis",
    "Translator",
    "beam_search",
    "greedy_search",
    "length_penalty_divisor",
    "max_lengths",
]

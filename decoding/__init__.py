"""Inference: greedy/beam search on a KV cache (`search`), ensembles of models (`ensemble`),
text in/out (`translator`), the decoding options (`config`), a reference decoder without a
cache (`uncached`), and the `translate.py` command line (`cli`) with its input sources
(`inputs`). Search runs anything with the model's protocol: the model itself, or the
inference engine beside it (`engine.Engine`, what `translate.py` loads).

The names below are imported on first use, so that `decoding.config` and `decoding.cli` load
without torch. Attention heatmaps live in `decoding.plot` (it pulls in matplotlib).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOME = {
    "SearchConfig": "attnmt.decoding.config",
    "Ensemble": "attnmt.decoding.ensemble",
    "Hypothesis": "attnmt.decoding.search",
    "SearchResult": "attnmt.decoding.search",
    "beam_search": "attnmt.decoding.search",
    "greedy_search": "attnmt.decoding.search",
    "length_penalty_divisor": "attnmt.decoding.search",
    "max_lengths": "attnmt.decoding.search",
    "SentenceAttention": "attnmt.decoding.translator",
    "TextHypothesis": "attnmt.decoding.translator",
    "Translator": "attnmt.decoding.translator",
}

__all__ = [  # the keys of _HOME
    "Ensemble",
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

if TYPE_CHECKING:
    from attnmt.decoding.config import SearchConfig
    from attnmt.decoding.ensemble import Ensemble
    from attnmt.decoding.search import (
        Hypothesis,
        SearchResult,
        beam_search,
        greedy_search,
        length_penalty_divisor,
        max_lengths,
    )
    from attnmt.decoding.translator import SentenceAttention, TextHypothesis, Translator


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'decoding' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)

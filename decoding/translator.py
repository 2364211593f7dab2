"""Translator: text in, text out (encode -> batch -> search -> decode).

Legend: B batch, S src len, T tgt len, L decoder layers, H heads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import NamedTuple

import torch
from torch import Tensor, nn

from common import runtime
from data.batching import encode_source_batch
from data.tokenizer import Tokenizer
from decoding.search import Hypothesis, SearchConfig, beam_search, greedy_search

logger = logging.getLogger(__name__)


class TextHypothesis(NamedTuple):
    """One translation with its search score (log-probability / length penalty)."""

    text: str
    score: float
    tokens: list[int]  # target ids without bos/eos


class SentenceAttention(NamedTuple):
    """Cross-attention of one translated sentence, for heatmaps."""

    src_pieces: list[str]  # S source pieces, ending in "</s>"
    tgt_pieces: list[str]  # T generated pieces, ending in "</s>"
    cross_attn: Tensor  # (L, H, T, S) float32 on the CPU; row t is the step that produced piece t


class Translator:
    """Translates lists of sentences with greedy or beam search (`search_cfg.beam_size`).

    Sentences are sorted by length and searched in batches of `search_cfg.batch_size`, so
    that padding stays small; results come back in input order. Greedy search on a model that
    offers continuous batching (`decoding.search.ContinuousGreedy`: one float `engine.Engine`),
    with `inter_threads` 1, keeps `batch_size` sentences in flight instead: a finished
    sentence's row takes the next one at once, with the same outputs up to float rounding.
    Empty (or whitespace-only) sentences give empty translations without reaching the model.
    The model is put in eval mode while translating and restored afterwards, so a trainer can
    call this mid-training.

    `inter_threads` > 1 searches that many batches at once, each on a thread of its own,
    with torch's intra-op threads divided among them (CTranslate2's `inter_threads`;
    Marian's `--cpu-threads` workers). The results are the same; on a CPU it pays where one
    batch's ops are too small to keep every core busy (2 cores, the default Multi30k model:
    see docs/benchmarks.md). The caller's autocast (bf16) reaches the worker threads.

    Args:
        model: what search runs (`decoding.search.Seq2SeqModel`): a `model.Transformer`, an
            `engine.Engine` built from one (what `translate.py` uses), or an `Ensemble`;
            already on `device`.
        tokenizer: the tokenizer the model was trained with.
        search_cfg: decoding options; the defaults of `SearchConfig` when None.
        device: where the inputs go; the model's device when None.
        inter_threads: batches searched at once (default 1: one after the other).

    Example:
        >>> translator = Translator(model, tokenizer, SearchConfig(beam_size=5))
        >>> translator.translate(["Ein Mann fährt Fahrrad."])
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Tokenizer,
        search_cfg: SearchConfig | None = None,
        device: str | torch.device | None = None,
        inter_threads: int = 1,
    ) -> None:
        if inter_threads < 1:
            raise ValueError(f"inter_threads must be >= 1, got {inter_threads}")
        self.model = model
        self.tokenizer = tokenizer
        self.search_cfg = search_cfg or SearchConfig()
        self.device = torch.device(device) if device is not None else _device_of(model)
        self.inter_threads = inter_threads
        self._pool: ThreadPoolExecutor | None = None  # made at the first parallel search

    def translate(self, sentences: list[str]) -> list[str]:
        """The best translation of each sentence, in input order."""
        return [nbest[0].text for nbest in self.translate_nbest(sentences)]

    def translate_nbest(
        self, sentences: list[str], progress: Callable[[int], object] | None = None
    ) -> list[list[TextHypothesis]]:
        """Up to `search_cfg.nbest` translations per sentence, best first, in input order.

        An empty sentence gets one empty hypothesis with score 0. `progress(n)` is called
        as sentences are done (n at a time; the counts add up to `len(sentences)`).
        """
        if isinstance(sentences, str):
            raise TypeError("translate takes a list of sentences, not a string")
        src_ids = self.tokenizer.encode_src([s.strip() for s in sentences])
        hypotheses = self.search_ids(src_ids, progress)
        tokens = [hyp.tokens for nbest in hypotheses for hyp in nbest]
        texts = iter(self.tokenizer.decode_tgt(tokens) if tokens else [])
        return [
            [TextHypothesis(next(texts), hyp.score, hyp.tokens) for hyp in nbest]
            for nbest in hypotheses
        ]

    def search_ids(
        self, src_ids: list[list[int]], progress: Callable[[int], object] | None = None
    ) -> list[list[Hypothesis]]:
        """Search source id lists (no specials) in length-sorted batches; input order out.

        `progress(n)`, if given, is called with the number of empty sentences first, then
        after each batch with its size (greedy with continuous batching: as sentences finish).
        """
        results: list[list[Hypothesis]] = [[Hypothesis([], 0.0, 0.0)] for _ in src_ids]
        batches = length_sorted_batches(src_ids, self.search_cfg.batch_size)
        n_empty = len(src_ids) - sum(len(chunk) for chunk in batches)
        if progress is not None and n_empty:
            progress(n_empty)
        if self._continuous():
            order = [i for chunk in batches for i in chunk]
            with self._eval_mode():
                sources = [src_ids[i] for i in order]
                special, cfg = self.tokenizer.special, self.search_cfg
                found = self.model.greedy_search_continuous(sources, special, cfg, progress)
            for i, nbest in zip(order, found, strict=True):
                results[i] = nbest
            return results
        with self._eval_mode():
            for chunk, found in zip(batches, self._search_all(src_ids, batches), strict=True):
                for i, nbest in zip(chunk, found, strict=True):
                    results[i] = nbest
                if progress is not None:
                    progress(len(chunk))
        return results

    def _continuous(self) -> bool:
        """Whether greedy search runs with continuous batching: a model that offers it (an
        `engine.Engine` that is not int8: see `decoding.search.ContinuousGreedy`), one batch at
        a time."""
        return (
            self.search_cfg.beam_size == 1
            and self.inter_threads == 1
            and getattr(self.model, "continuous_batching", False)
        )

    def _search_all(
        self, src_ids: list[list[int]], batches: list[list[int]]
    ) -> Iterator[list[list[Hypothesis]]]:
        """Each batch's hypotheses, in batch order: one after the other, or `inter_threads`
        at once on a thread pool, torch's intra-op threads divided among them meanwhile."""
        if self.inter_threads == 1 or len(batches) < 2:
            for chunk in batches:
                yield self._search([src_ids[i] for i in chunk])
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.inter_threads, thread_name_prefix="search")
        context = runtime.autocast_of(self.device.type)  # thread-local: each worker enters it again
        threads = torch.get_num_threads()
        intra = max(1, threads // self.inter_threads)

        def search(chunk: list[int]) -> list[list[Hypothesis]]:
            torch.set_num_threads(intra)  # OpenMP's team size is per thread: set it in each
            with context():
                return self._search([src_ids[i] for i in chunk])

        try:  # the workers' set_num_threads changes torch's process-wide count too
            yield from self._pool.map(search, batches)
        finally:
            torch.set_num_threads(threads)

    def attention_for(self, sentence: str) -> SentenceAttention:
        """Translate one sentence and return its cross-attention weights of every layer.

        The weights come from a teacher-forced pass over [bos] + the best hypothesis, which
        equals what the search computed step by step.

        Raises:
            ValueError: the sentence is empty.
        """
        ids = self.tokenizer.encode_src([sentence.strip()])[0]
        if not ids:
            raise ValueError("cannot show attention for an empty sentence")
        special = self.tokenizer.special
        hyp = self.search_ids([ids])[0][0]
        src = encode_source_batch([ids], special).to(self.device)  # (1, S)
        tgt_in = torch.tensor([[special.bos] + hyp.tokens], device=self.device)  # (1, T)
        with self._eval_mode():
            maps = self.model.attention_maps(src, tgt_in)
        cross = torch.stack([layer[0] for layer in maps.cross]).float().cpu()  # (L, H, T, S)
        return SentenceAttention(
            self.tokenizer.src_pieces(ids + [special.eos]),
            self.tokenizer.tgt_pieces(hyp.tokens + [special.eos]),
            cross,
        )

    def _search(self, batch: list[list[int]]) -> list[list[Hypothesis]]:
        cfg = self.search_cfg
        src = encode_source_batch(batch, self.tokenizer.special).to(self.device)  # (B, S)
        search = greedy_search if cfg.beam_size == 1 else beam_search
        result = search(self.model, src, self.tokenizer.special, cfg)
        return result.hypotheses

    @contextmanager
    def _eval_mode(self) -> Iterator[None]:
        """Eval mode (no dropout) for the duration; the caller's mode is restored after."""
        was_training = self.model.training
        self.model.eval()
        try:
            yield
        finally:
            self.model.train(was_training)


def length_sorted_batches(src_ids: list[list[int]], batch_size: int) -> list[list[int]]:
    """The batches `Translator.search_ids` searches: indices of the non-empty sources, longest
    first, `batch_size` at a time (benchmarks give peers the same batches)."""
    order = sorted((i for i, ids in enumerate(src_ids) if ids), key=lambda i: -len(src_ids[i]))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device

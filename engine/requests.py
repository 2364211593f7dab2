"""Requests (lists of sentences) through one continuous-batching search, greedy
(`engine.continuous.GreedyStream`) or beam (`engine.beams.BeamStream`): what serve.py's model
thread runs for requests with those options (`server.batcher`'s streams)."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from attnmt.data.tokenizer import Tokenizer
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.search import Hypothesis
from attnmt.engine.beams import BeamStream
from attnmt.engine.continuous import GreedyStream


class RequestStream:
    """Requests (lists of sentences) through one `GreedyStream` or `engine.beams.BeamStream`,
    each translated as `Translator.translate_nbest` translates it (greedy: with the same
    continuous batching; beam: batch by batch, the same n-best lists up to float rounding):
    the sentences stripped and tokenized, an empty one an empty translation with score 0 that
    never reaches the model; a request is done when its last sentence is. `open` says where
    that applies.

    `add` a request (its handle back), then `step` until `live` is 0 (`cancel` drops requests
    between steps): each step returns the
    requests that finished, (handle, per sentence its n-best `[(text, score), ...]`, best
    first). `record(sentences, source tokens, target tokens of the best, seconds since
    added)`, if given, is called per request. `context()` is entered around each step
    (autocast, on the thread that steps).
    """

    def __init__(
        self,
        search: GreedyStream | BeamStream,
        tokenizer: Tokenizer,
        context: Callable[[], AbstractContextManager] = nullcontext,
        record: Callable[[int, int, int, float], object] | None = None,
    ) -> None:
        self.search, self.tokenizer, self.context, self.record = search, tokenizer, context, record
        self.requests: dict[int, _Request] = {}  # by handle, until answered
        self.owners: dict[int, tuple[_Request, int]] = {}  # search index -> request, sentence
        self.handles = 0

    @staticmethod
    def open(
        model: object, tokenizer: Tokenizer, cfg: SearchConfig, gather: int = 1, **kwargs: Any
    ) -> RequestStream | None:
        """A stream for requests with these options on `model` (`gather`: `GreedyStream`'s),
        or None where no stream searches them (sampling, an int8 engine, a model without
        continuous batching, a forced target language token)."""
        if cfg.sampling or tokenizer.target_prefix():
            return None
        if not getattr(model, "continuous_batching", False) or getattr(model, "training", True):
            return None
        if cfg.beam_size > 1:
            return RequestStream(BeamStream(model, tokenizer.special, cfg), tokenizer, **kwargs)
        search = GreedyStream(model, tokenizer.special, cfg, gather=gather)
        return RequestStream(search, tokenizer, **kwargs)

    @property
    def live(self) -> int:
        """Requests added and not yet returned by `step`."""
        return len(self.requests)

    @property
    def sentences(self) -> int:
        """Sentences in the search: searching or waiting for a row."""
        return self.search.live

    def add(self, sentences: list[str]) -> int:
        """Queue a request; its handle."""
        ids = self.tokenizer.encode_src([s.strip() for s in sentences])
        request = _Request(self.handles, ids)
        self.handles += 1
        self.requests[request.handle] = request
        kept = [j for j, one in enumerate(ids) if one]
        for j, index in zip(kept, self.search.add([ids[j] for j in kept]), strict=True):
            self.owners[index] = (request, j)
        request.left = len(kept)
        return request.handle

    def cancel(self, handles: list[int]) -> None:
        """Drop requests `handles` between two steps (their clients have gone): their sentences
        leave the search, queued or searching, and `step` never returns them; the other
        requests' translations stay as they were."""
        gone = {handle for handle in handles if self.requests.pop(handle, None) is not None}
        indices = [index for index, (request, _) in self.owners.items() if request.handle in gone]
        for index in indices:
            del self.owners[index]
        self.search.cancel(indices)

    def step(self) -> list[tuple[int, list[list[tuple[str, float]]]]]:
        """One search step (none when no sentence is searching); the requests done."""
        with self.context():
            finished = self.search.step() if self.search.live else []
        for index, found in finished:  # greedy: one hypothesis; beams: the n-best list
            request, j = self.owners.pop(index)
            request.hyps[j] = found if isinstance(found, list) else [found]
            request.left -= 1
        done = [r for r in self.requests.values() if r.left == 0]
        answers = []
        for request in done:
            del self.requests[request.handle]
            nbests = request.hyps
            texts = iter(self.tokenizer.decode_tgt([h.tokens for hyps in nbests for h in hyps]))
            answers.append((request.handle, [[(next(texts), h.score) for h in hyps] for hyps in nbests]))  # fmt: skip
            if self.record is not None:
                src = sum(len(ids) for ids in request.ids)
                tgt = sum(len(hyps[0].tokens) for hyps in request.hyps)
                self.record(len(request.hyps), src, tgt, time.perf_counter() - request.added)
        return answers


class _Request:
    """A request in a `RequestStream`: its source ids, hypotheses, sentences still searching."""

    def __init__(self, handle: int, ids: list[list[int]]) -> None:
        self.handle, self.ids, self.added = handle, ids, time.perf_counter()
        self.hyps = [[Hypothesis([], 0.0, 0.0)] for _ in ids]  # the n-best of each sentence
        self.left = 0

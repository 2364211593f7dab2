"""Dynamic batching: requests that arrive together are translated together, on one thread.

Handlers `submit` jobs from the event loop; the model thread takes the oldest job, waits up to
`wait` seconds for more jobs with the same search options (while the batch holds fewer than
`max_sentences` sentences), and runs them as one call. Invariants:

- one model call at a time: only the model thread calls `translate` / `attention`;
- a job is never split across batches, and a batch holds jobs of one `SearchConfig` and one
  language pair only (jobs with other options or another pair wait, in arrival order, for a
  later batch); a job that samples has a batch of its own (`runs_alone`);
- every submitted job gets its result or its exception exactly once, also when the server
  shuts down (`close` lets the thread finish every queued job before it returns), unless its
  future was cancelled while it waited: then it is dropped without a model call;
- at most `max_queue` jobs wait; beyond that `submit` raises `QueueFull`.

`one_request` (serve.py --no-batching) makes every batch one job, for the load comparison.
Torch-free: the model is behind the two callables.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from attnmt.decoding.config import SearchConfig

logger = logging.getLogger(__name__)

# The (source, target) languages a multilingual model is asked for; (None, None) otherwise.
Langs = tuple[str | None, str | None]
# translate(cfg, sentences, prefixes, langs) -> one result per sentence, in order (prefixes:
# one target prefix per sentence, "" for none); attention(cfg, sentence, langs)
Translate = Callable[[SearchConfig, list[str], list[str], Langs], list[Any]]
Attention = Callable[[SearchConfig, str, Langs], Any]


def runs_alone(cfg: SearchConfig) -> bool:
    """Whether a request with these options gets a batch of its own: one that samples, since
    a batch draws from one generator seeded once, so a request's samples would depend on the
    requests batched with it; alone, they are `translate.py`'s for the same sentences and
    seed."""
    return cfg.sampling


class QueueFull(Exception):
    """More jobs are waiting than the server's limit (`--max-queue`)."""


class Closed(Exception):
    """The batcher is shutting down and takes no new jobs."""


@dataclass
class Job:
    cfg: SearchConfig
    sentences: list[str]  # translate: the request's sentences; attention: exactly one
    attention: bool = False
    prefixes: list[str] | None = None  # a forced target prefix per sentence (translate only)
    langs: Langs = (None, None)  # the pair a multilingual model is asked for
    future: Future = field(default_factory=Future)


class Batcher:
    """The model thread and its queue (see the module docstring).

    Args:
        translate: runs one batch; called on the model thread only.
        attention: cross-attention of one sentence; called on the model thread only.
        max_sentences: a batch grows by whole jobs up to this many sentences (a bigger job
            runs alone).
        wait: seconds the oldest job waits for others to join its batch.
        max_queue: jobs allowed to wait at once.
        one_request: one job per batch, no waiting (batching off).
    """

    def __init__(
        self,
        translate: Translate,
        attention: Attention,
        max_sentences: int,
        wait: float,
        max_queue: int,
        one_request: bool = False,
    ) -> None:
        self._translate, self._attention = translate, attention
        self.max_sentences, self.wait, self.max_queue = max_sentences, wait, max_queue
        self.one_request = one_request
        self._pending: deque[Job] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self.batches = 0  # model calls made (translate batches + attention jobs)
        self._thread = threading.Thread(target=self._loop, name="model", daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        """Jobs waiting for the model thread (not counting the batch it is running)."""
        with self._cond:
            return len(self._pending)

    def submit(self, job: Job) -> Future:
        """Queue `job`; its future gets the result list (or the attention, or the exception)."""
        with self._cond:
            if self._closing:
                raise Closed("the server is shutting down")
            if len(self._pending) >= self.max_queue:
                raise QueueFull(f"{len(self._pending)} requests are queued (the limit)")
            self._pending.append(job)
            self._cond.notify()
        return job.future

    def close(self) -> None:
        """Take no new jobs, finish the queued ones, stop the model thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._run(batch)

    def _next_batch(self) -> list[Job] | None:
        """The next batch: the oldest job plus jobs that may join it; None once closed and
        drained."""
        with self._cond:
            while not self._pending:
                if self._closing:
                    return None
                self._cond.wait()
            first = self._pending.popleft()
            batch = [first]
            if first.attention or self.one_request or runs_alone(first.cfg):
                return batch
            size = len(first.sentences)
            deadline = time.monotonic() + self.wait
            while size < self.max_sentences:
                size += self._take_joining(first, batch, size)
                left = deadline - time.monotonic()
                if size >= self.max_sentences or left <= 0 or self._closing:
                    break
                self._cond.wait(left)
            return batch

    def _take_joining(self, first: Job, batch: list[Job], size: int) -> int:
        """Move the queued jobs that fit (the options and pair of `first`, room left) into
        `batch`, keeping the others in order; the sentences added."""
        added, keep = 0, deque()
        while self._pending:
            job = self._pending.popleft()
            fits = size + added + len(job.sentences) <= self.max_sentences
            if not job.attention and job.cfg == first.cfg and job.langs == first.langs and fits:
                batch.append(job)
                added += len(job.sentences)
            else:
                keep.append(job)
        self._pending = keep
        return added

    def _run(self, batch: list[Job]) -> None:
        # A job whose request was cancelled while it waited is dropped; the others' futures
        # can no longer be cancelled, so setting their results cannot fail.
        batch = [job for job in batch if job.future.set_running_or_notify_cancel()]
        if not batch:
            return
        self.batches += 1
        try:
            if batch[0].attention:
                job = batch[0]
                results = [self._attention(job.cfg, job.sentences[0], job.langs)]
            else:
                sentences = [s for job in batch for s in job.sentences]
                prefixes = [p for job in batch for p in job.prefixes or [""] * len(job.sentences)]
                flat = self._translate(batch[0].cfg, sentences, prefixes, batch[0].langs)
                results, start = [], 0
                for job in batch:
                    results.append(flat[start : start + len(job.sentences)])
                    start += len(job.sentences)
        except Exception as e:  # the thread survives; every job of the batch gets the error
            logger.exception("batch of %d requests failed", len(batch))
            for job in batch:
                job.future.set_exception(e)
            return
        for job, result in zip(batch, results, strict=True):
            job.future.set_result(result)

"""Dynamic batching: requests that arrive together are translated together, on one thread.

Handlers `submit` jobs from the event loop; the model thread takes the oldest job, waits up to
`wait` seconds for more jobs with the same search options (while the batch holds fewer than
`max_sentences` sentences), and runs them as one call. Where the model offers a stream for
the oldest job's options (`open_stream`: greedy or beam search with continuous batching,
`engine.requests.RequestStream`), it does not wait: the job starts at once and, between
the stream's steps, queued jobs with the same options and pair join it (in arrival order,
while its sentences stay within `max_sentences`; the first job that may not join stops the
joining, so it waits for at most one stream to drain), each answered as soon as its own
sentences are done: iteration-level scheduling, as vLLM's. Invariants:

- one model call at a time: only the model thread calls `translate` / `attention` / a
  stream;
- a job is never split across batches, and a batch holds jobs of one `SearchConfig` and one
  language pair only (jobs with other options or another pair wait, in arrival order, for a
  later batch); a job that samples has a batch of its own (`runs_alone`);
- jobs with different glossaries share a batch (the translator takes one per sentence), but
  a job with a glossary neither starts nor joins a stream (streams search without terms),
  and under greedy search a batch holds at most one job with a glossary (`shares_terms`);
- every submitted job gets its result or its exception exactly once, also when the server
  shuts down (`close` lets the thread finish every queued job before it returns), unless its
  future was cancelled while it waited: then it is dropped without a model call;
- a job in a stream whose client has `gone` leaves it between two steps (`Stream.cancel`:
  its sentences, queued or decoding, are dropped, the other jobs' results unchanged), answered
  `Gone`; a stream left with no job ends there; a batch call (sampling, glossaries, prefixes,
  one-request mode) whose jobs have all gone stops between two steps (`translate`'s `stop`),
  each answered `Gone`;
- at most `max_queue` jobs wait; beyond that `submit` raises `QueueFull`.

`one_request` (serve.py --no-batching) makes every batch one job, for the load comparison.
Torch-free: the model is behind the callables.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from attnmt.decoding.config import SearchConfig
from attnmt.decoding.glossary import Glossary

logger = logging.getLogger(__name__)

# The (source, target) languages a multilingual model is asked for; (None, None) otherwise.
Langs = tuple[str | None, str | None]
# translate(cfg, sentences, prefixes, langs[, glossaries=...]) -> one result per sentence, in
# order (prefixes: one target prefix per sentence, "" for none; glossaries: one `Glossary` or
# None per sentence, passed only when a job of the batch has one; stop: a callable, true once
# every job of the batch has gone, passed where `translate` names a `stop` parameter: its
# search then raises between two steps); attention(cfg, sentence, langs)
Translate = Callable[..., list[Any]]
Attention = Callable[[SearchConfig, str, Langs], Any]


class Stream(Protocol):
    """A search that takes requests between its steps (`engine.requests.RequestStream`)."""

    @property
    def sentences(self) -> int: ...  # sentences in the search (searching or waiting for a row)

    def add(self, sentences: list[str]) -> int: ...  # a request's handle

    def step(self) -> list[tuple[int, list[Any]]]: ...  # (handle, results) of requests done

    def cancel(self, handles: list[int]) -> None: ...  # drop these requests between steps


# open_stream(cfg, langs): a stream for jobs with these options, or None (they are batched)
OpenStream = Callable[[SearchConfig, Langs], Stream | None]


def runs_alone(cfg: SearchConfig) -> bool:
    """Whether a request with these options gets a batch of its own: one that samples, since
    a batch draws from one generator seeded once, so a request's samples would depend on the
    requests batched with it; alone, they are `translate.py`'s for the same sentences and
    seed."""
    return cfg.sampling


def shares_terms(cfg: SearchConfig) -> bool:
    """Whether jobs with glossaries may share a batch: not under greedy search, whose
    constrained beam is as wide as the batch's most constrained sentence asks for
    (`decoding.search.greedy_search`), so that a request's translations would depend on the
    terms of the requests batched with it; beam search's do not."""
    return cfg.beam_size > 1


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
    glossary: Glossary | None = None  # terms the translations must use (translate only)
    future: Future = field(default_factory=Future)
    # set when the job's client has gone: the job leaves its stream between two steps
    gone: threading.Event = field(default_factory=threading.Event)


class JobQueue(Protocol):
    """What the handlers use of a model's queue: `Batcher` here, or `worker.ModelProcess`
    (the same batcher in a process of its own)."""

    batches: int  # model calls so far

    @property
    def queued(self) -> int: ...

    def submit(self, job: Job) -> Future: ...

    def close(self) -> None: ...


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
        open_stream: the model's streams, if it has any (see the module docstring).
    """

    def __init__(
        self,
        translate: Translate,
        attention: Attention,
        max_sentences: int,
        wait: float,
        max_queue: int,
        one_request: bool = False,
        open_stream: OpenStream | None = None,
    ) -> None:
        self._translate, self._attention, self._open_stream = translate, attention, open_stream
        self.max_sentences, self.wait, self.max_queue = max_sentences, wait, max_queue
        self.one_request = one_request
        self._stops = "stop" in inspect.signature(translate).parameters
        self._pending: deque[Job] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self.batches = 0  # model calls (translate batches, attention jobs, jobs joining a stream)
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
            found = self._next_batch()
            if found is None:
                return
            batch, stream = found
            if stream is None:
                self._run(batch)
            else:
                self._run_stream(stream, batch[0])

    def _next_batch(self) -> tuple[list[Job], Stream | None] | None:
        """The next batch: the oldest job plus jobs that may join it, or the oldest job alone
        with a stream to start it on; None once closed and drained."""
        with self._cond:
            while not self._pending:
                if self._closing:
                    return None
                self._cond.wait()
            first = self._pending.popleft()
            batch = [first]
            if first.attention or self.one_request or runs_alone(first.cfg):
                return batch, None
            stream = self._stream_for(first)
            if stream is not None:  # no waiting: jobs join between the stream's steps
                return batch, stream
            size = len(first.sentences)
            deadline = time.monotonic() + self.wait
            while size < self.max_sentences:
                size += self._take_joining(first, batch, size)
                left = deadline - time.monotonic()
                if size >= self.max_sentences or left <= 0 or self._closing:
                    break
                self._cond.wait(left)
            return batch, None

    def _stream_for(self, job: Job) -> Stream | None:
        """A stream for `job` (not one-request or attention: `_next_batch` decides those)."""
        if self._open_stream is None or not _streamable(job):
            return None
        return self._open_stream(job.cfg, job.langs)

    def _run_stream(self, stream: Stream, first: Job) -> None:
        """`first` and the jobs that join it between steps, until the stream runs dry."""
        jobs: dict[int, Job] = {}  # by handle: added, not yet answered
        joining = [first]
        try:
            while True:
                joining = [job for job in joining if job.future.set_running_or_notify_cancel()]
                for job in joining:
                    jobs[stream.add(job.sentences)] = job
                self.batches += bool(joining)
                if not jobs:
                    return
                for handle, result in stream.step():
                    jobs.pop(handle).future.set_result(result)
                gone = [handle for handle, job in jobs.items() if job.gone.is_set()]
                if gone:  # nobody waits for these: their sentences leave the stream
                    stream.cancel(gone)
                    _drop([jobs.pop(handle) for handle in gone])
                joining = self._stream_joining(first, stream.sentences)
        except Exception as e:  # the thread survives; every job of the stream gets the error
            logger.exception("a stream of %d requests failed", len(jobs) + len(joining))
            for job in [*jobs.values(), *joining]:
                if not job.future.done():
                    job.future.set_exception(e)

    def _stream_joining(self, first: Job, size: int) -> list[Job]:
        """The queued jobs, oldest first, that join a stream started by `first` holding `size`
        sentences: up to the first one of other options, pair or kind, with prefixes or a
        glossary, or too big."""
        joining: list[Job] = []
        with self._cond:
            while self._pending:
                job = self._pending[0]
                same = job.cfg == first.cfg and job.langs == first.langs and not job.attention
                fits = size + len(job.sentences) <= self.max_sentences or size == 0
                if not (same and fits and _streamable(job)):
                    break
                joining.append(self._pending.popleft())
                size += len(job.sentences)
        return joining

    def _take_joining(self, first: Job, batch: list[Job], size: int) -> int:
        """Move the queued jobs that fit (the options and pair of `first`, room left, a
        glossary only where `shares_terms`) into `batch`, keeping the others in order; the
        sentences added."""
        added, keep = 0, deque()
        terms = any(job.glossary is not None for job in batch) and not shares_terms(first.cfg)
        while self._pending:
            job = self._pending.popleft()
            fits = size + added + len(job.sentences) <= self.max_sentences
            same = not job.attention and job.cfg == first.cfg and job.langs == first.langs
            if same and fits and not (terms and job.glossary is not None):
                batch.append(job)
                added += len(job.sentences)
                terms = terms or (job.glossary is not None and not shares_terms(job.cfg))
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
                terms: dict[str, Any] = {}
                if any(job.glossary is not None for job in batch):
                    terms["glossaries"] = [job.glossary for job in batch for _ in job.sentences]
                if self._stops:
                    terms["stop"] = lambda: all(job.gone.is_set() for job in batch)
                flat = self._translate(batch[0].cfg, sentences, prefixes, batch[0].langs, **terms)
                results, start = [], 0
                for job in batch:
                    results.append(flat[start : start + len(job.sentences)])
                    start += len(job.sentences)
        except Exception as e:  # the thread survives; every job of the batch gets the error
            if all(job.gone.is_set() for job in batch):  # stopped (`stop`): nobody waits
                _drop(batch)
                return
            logger.exception("batch of %d requests failed", len(batch))
            for job in batch:
                job.future.set_exception(e)
            return
        for job, result in zip(batch, results, strict=True):
            job.future.set_result(result)


def _drop(jobs: Any) -> None:
    """End started jobs whose clients have gone: each future gets `Gone`."""
    for job in jobs:
        job.future.set_exception(Gone("the client has gone"))


class Gone(Exception):
    """A started job stopped because its client had gone (`Job.gone`)."""


def _streamable(job: Job) -> bool:
    """Whether `job` may join a stream: the stream forces no prefix and no terms."""
    return not any(job.prefixes or []) and job.glossary is None

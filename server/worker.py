"""A model's batcher in a process of its own, so that the model's Python (each decoder step's
ops, between which it retakes the GIL) never waits for the event loop's (HTTP, JSON,
tokenizing for the limits): one GIL each. `ModelProcess` is what the server's handlers hold
(`submit`, `queued`, `batches`, `close`, as `batcher.Batcher`); `serve_jobs` is the child's
side: it builds the `Batcher` (the model loaded there) and runs it on the jobs it receives.

Measured by `benchmarks.load_server` (docs/benchmarks.md#the-server-against-offline-translatepy).

Messages, pickled over one duplex pipe:
- to the child: `("job", id, job fields)`, `("cancel", id)`, `("close",)`;
- to the parent: `("ready", facts)` or `("failed", message, user_error)` once at start, then
  `("done", id, result, batches)`, `("error", id, exception, batches)`, `("cancelled", id)`
  and `("batch", figures)` (a batch's metrics, for `record`).

Invariants: every submitted job's future gets its result or exception exactly once (also when
the child dies: then a `RuntimeError`); a cancel reaches a job the child has not started, which
is then dropped without a model call, or one it has, which is then marked `gone` (as
`Batcher`'s); `close` lets the child answer every job
it has, then joins it. The child ignores SIGINT and SIGTERM (Ctrl-C reaches the whole process
group): it stops when the parent closes it or its pipe ends.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import multiprocessing
import pickle
import signal
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from attnmt.common.errors import UserError
from attnmt.server.batcher import Batcher, Closed, Job, QueueFull

logger = logging.getLogger(__name__)

# Job fields that stay in their process (not sent to the child): the last ones.
LOCAL = ("future", "gone")

# make_batcher(record) -> (the Batcher, facts for the parent); `record(*figures)` forwards a
# batch's metrics. Called in the child; must be a module-level function (pickled by name).
MakeBatcher = Callable[..., tuple[Batcher, dict[str, Any]]]


class StartError(Exception):
    """The child could not load its model: `user_error` tells a user mistake (a bad
    checkpoint, a flag the model rejects) from a crash."""

    def __init__(self, message: str, user_error: bool) -> None:
        super().__init__(message)
        self.user_error = user_error


class ModelProcess:
    """The parent's side (see the module docstring). Blocks in `__init__` until the child has
    loaded its model; `facts` is what `make_batcher` returned beside the batcher. With
    `wait=False` it returns once the child is started (several children load at once): call
    `wait` before anything else.

    Raises:
        StartError: the child failed to load (its message).
    """

    def __init__(
        self,
        make_batcher: MakeBatcher,
        args: tuple,
        max_queue: int,
        record: Callable[..., None] | None = None,
        name: str = "model",
        wait: bool = True,
    ) -> None:
        context = multiprocessing.get_context("spawn")  # no forked torch threads or locks
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=serve_jobs, args=(child, make_batcher, args), name=name, daemon=True
        )
        self._process.start()
        # Exiting without `close` (a second Ctrl-C): nobody waits for the child's answers,
        # and it ignores SIGTERM, which multiprocessing's own exit hook would send it.
        atexit.register(self._kill)
        child.close()
        self.max_queue, self._record = max_queue, record
        self._lock = threading.Lock()  # sends, `_futures`, `_closing`
        self._futures: dict[int, Future] = {}  # sent, not yet answered
        self._ids = 0
        self._closing = False
        self.batches = 0  # the child's `Batcher.batches` at its last answer
        self.name, self.facts = name, {}
        self._reader: threading.Thread | None = None  # reads replies once the child is ready
        if wait:
            self.wait()

    def wait(self) -> dict[str, Any]:
        """Block until the child has loaded its model (at once after the first call); its
        `facts`.

        Raises:
            StartError: the child failed to load (its message).
        """
        if self._reader is None:
            self.facts = self._started()
            self._reader = threading.Thread(target=self._read, name=f"{self.name}-replies", daemon=True)  # fmt: skip
            self._reader.start()
        return self.facts

    def _started(self) -> dict[str, Any]:
        try:
            message = self._conn.recv()
        except EOFError:
            self._process.join()
            raise StartError(
                f"the model process exited with code {self._process.exitcode} while loading",
                False,
            ) from None
        if message[0] == "failed":
            self._process.join()
            raise StartError(message[1], message[2])
        return message[1]

    @property
    def queued(self) -> int:
        """Jobs sent to the model process and not answered yet (waiting or in a batch)."""
        with self._lock:
            return len(self._futures)

    def submit(self, job: Job) -> Future:
        """Send `job`; its future gets the result list (or the attention, or the exception)."""
        fields = tuple(getattr(job, f.name) for f in dataclasses.fields(job) if f.name not in LOCAL)
        with self._lock:
            if self._closing:
                raise Closed("the server is shutting down")
            if len(self._futures) >= self.max_queue:
                raise QueueFull(f"{len(self._futures)} requests are queued (the limit)")
            job_id, self._ids = self._ids, self._ids + 1
            self._futures[job_id] = job.future
            self._conn.send(("job", job_id, fields))
        job.future.add_done_callback(lambda future: self._cancel(job_id, future))
        return job.future

    def _cancel(self, job_id: int, future: Future) -> None:
        if future.cancelled():
            with self._lock:
                if job_id in self._futures and not self._closing:
                    self._conn.send(("cancel", job_id))

    def close(self) -> None:
        """Take no new jobs; the child answers every job it has, then exits."""
        with self._lock:
            if not self._closing:
                self._closing = True
                self._conn.send(("close",))
        if self._reader is not None:
            self._reader.join()
        self._process.join()

    def _kill(self) -> None:
        if self._process.is_alive():
            self._process.kill()
            self._process.join()

    def _read(self) -> None:
        """Replies -> futures and metrics, until the child ends."""
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            kind = message[0]
            if kind == "batch":
                if self._record is not None:
                    self._record(*message[1])
                continue
            with self._lock:
                future = self._futures.pop(message[1], None)
            if kind != "cancelled":
                self.batches = message[3]
            if future is None or not future.set_running_or_notify_cancel():
                continue  # cancelled here while the child ran it: nobody waits
            if kind == "done":
                future.set_result(message[2])
            elif kind == "error":
                future.set_exception(message[2])
        self._process.join(timeout=5)  # its exit code, for the log
        with self._lock:
            orphans, self._futures = list(self._futures.values()), {}
            if not self._closing:  # died: new jobs get `Closed` (503), not a broken pipe
                self._closing = True
                logger.error("the model process exited (code %s)", self._process.exitcode)
        for future in orphans:  # the child died with jobs in hand
            if future.set_running_or_notify_cancel():
                future.set_exception(RuntimeError("the model process exited"))


def serve_jobs(conn: Any, make_batcher: MakeBatcher, args: tuple) -> None:
    """The child: load (`make_batcher`), report, then hand each received job to the batcher
    until told to close or the parent's end of the pipe is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    lock = threading.Lock()  # the main thread and the model thread both send

    def send(message: tuple) -> None:
        with lock:
            conn.send(message)

    try:
        batcher, facts = make_batcher(lambda *figures: send(("batch", figures)), *args)
    except Exception as e:  # noqa: BLE001 (reported to the parent, which exits with it)
        user_error = isinstance(e, UserError)
        send(("failed", str(e) if user_error else f"{type(e).__name__}: {e}", user_error))
        return
    send(("ready", facts))
    jobs: dict[int, Job] = {}  # received, not answered (the model thread pops)
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            if message[0] == "close":
                break
            if message[0] == "cancel":
                job = jobs.get(message[1])
                if job is not None and not job.future.cancel():  # started: stop between steps
                    job.gone.set()
                continue
            _, job_id, fields = message
            job = Job(*fields)
            jobs[job_id] = job
            job.future.add_done_callback(
                lambda future, i=job_id: _answer(send, jobs, i, future, batcher)
            )
            try:
                batcher.submit(job)
            except (QueueFull, Closed) as e:  # the parent's limit is the same: not expected
                job.future.set_exception(e)
    finally:
        batcher.close()  # answers every job it has
        conn.close()


def _answer(
    send: Callable[[tuple], None], jobs: dict, job_id: int, future: Future, batcher: Batcher
) -> None:
    jobs.pop(job_id, None)
    if future.cancelled():
        send(("cancelled", job_id))
        return
    error = future.exception()
    if error is None:
        send(("done", job_id, future.result(), batcher.batches))
        return
    try:
        pickle.dumps(error)
    except Exception:  # noqa: BLE001 (an exception that cannot travel travels as its text)
        error = RuntimeError(f"{type(error).__name__}: {error}")
    send(("error", job_id, error, batcher.batches))

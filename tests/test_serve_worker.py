"""The model's batcher in its own process (`server.worker.ModelProcess`): results, errors and
metrics cross the pipe; a job cancelled while it waits never reaches the model; `close`
answers every job; a load failure is one line; processes started without waiting load at
once; a dead model process fails its jobs and refuses new ones. The fake model runs in the
child, so what it saw is written to a file."""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from attnmt.common.errors import UserError
from attnmt.decoding.config import SearchConfig
from attnmt.server.batcher import Batcher, Closed, Job, QueueFull
from attnmt.server.worker import ModelProcess, StartError

GREEDY, BEAM = SearchConfig(beam_size=1), SearchConfig(beam_size=2)


def fake_batcher(record, log: str, fail: str = "") -> tuple[Batcher, dict]:  # noqa: ANN001
    """In the child: a model that upper-cases, waits 0.5 s on "slow", fails on "boom", and
    appends each call's sentences to `log`."""
    if fail == "user":
        raise UserError("-c run: no such checkpoint; pass a run dir")
    if fail == "crash":
        raise RuntimeError("out of memory")
    if fail.startswith("meet:"):  # "meet:DIR:ME:OTHER": loads only while OTHER loads too
        folder, me, other = fail.split(":")[1:]
        Path(folder, me).touch()
        deadline = time.monotonic() + 60
        while not Path(folder, other).exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{me} loaded alone")
            time.sleep(0.05)

    def translate(cfg, sentences, prefixes, langs, glossaries=None):  # noqa: ANN001, ANN202
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps(sentences) + "\n")
        if "slow" in sentences:
            time.sleep(0.5)
        if "boom" in sentences:
            raise ValueError("boom")
        record(len(sentences), 1, 1, 0.0)
        return [[(s.upper(), -1.0)] for s in sentences]

    def attention(cfg, sentence, langs):  # noqa: ANN001, ANN202
        return {"translation": sentence.upper()}

    return Batcher(translate, attention, 8, 0.0, 16), {"pid": os.getpid()}


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_jobs_results_errors_and_metrics_cross_the_pipe(tmp_path: Path) -> None:
    log, recorded = tmp_path / "calls", []
    worker = ModelProcess(fake_batcher, (str(log),), 16, lambda *f: recorded.append(f))
    assert worker.facts["pid"] != os.getpid()  # the model runs elsewhere
    slow = worker.submit(Job(GREEDY, ["slow"]))
    time.sleep(0.2)  # the child is in the slow call: the next jobs wait behind it
    futures = [worker.submit(Job(BEAM, ["a", "b"])), worker.submit(Job(BEAM, ["c"]))]
    failing = worker.submit(Job(GREEDY, ["boom"]))
    gone = worker.submit(Job(SearchConfig(beam_size=3), ["gone"]))
    assert gone.cancel()  # its client left while it waited
    heat = worker.submit(Job(GREEDY, ["x"], attention=True))
    worker.close()  # answers every job it has
    assert slow.result() == [[("SLOW", -1.0)]]
    assert [f.result() for f in futures] == [[[("A", -1.0)], [("B", -1.0)]], [[("C", -1.0)]]]
    assert heat.result() == {"translation": "X"}
    with pytest.raises(ValueError, match="boom"):
        failing.result()
    assert ["gone"] not in calls(log)  # dropped without a model call
    assert ["a", "b", "c"] in calls(log)  # batched in the child as before
    assert sorted(recorded) == [(1, 1, 1, 0.0), (3, 1, 1, 0.0)]
    assert worker.batches == 4 and worker.queued == 0
    with pytest.raises(Closed):
        worker.submit(Job(GREEDY, ["late"]))


def test_the_queue_limit_is_the_parents(tmp_path: Path) -> None:
    worker = ModelProcess(fake_batcher, (str(tmp_path / "calls"),), 2)
    first = worker.submit(Job(GREEDY, ["slow"]))
    second = worker.submit(Job(BEAM, ["a"]))
    assert worker.queued == 2
    with pytest.raises(QueueFull):
        worker.submit(Job(GREEDY, ["b"]))
    worker.close()
    assert first.result() == [[("SLOW", -1.0)]] and second.result() == [[("A", -1.0)]]


@pytest.mark.parametrize(("fail", "user_error"), [("user", True), ("crash", False)])
def test_a_model_that_cannot_load_is_one_line(tmp_path: Path, fail: str, user_error: bool) -> None:
    with pytest.raises(StartError) as raised:
        ModelProcess(fake_batcher, (str(tmp_path / "calls"), fail), 4)
    assert raised.value.user_error is user_error
    expected = "-c run: no such checkpoint" if user_error else "RuntimeError: out of memory"
    assert str(raised.value).startswith(expected)


def test_model_processes_started_without_waiting_load_at_once(tmp_path: Path) -> None:
    """serve.py starts every model's process before it waits for the first: each fake model
    here loads only once it sees the other loading (after 60 s alone it fails)."""
    log = str(tmp_path / "calls")
    a = ModelProcess(fake_batcher, (log, f"meet:{tmp_path}:a:b"), 4, wait=False)
    b = ModelProcess(fake_batcher, (log, f"meet:{tmp_path}:b:a"), 4, wait=False)
    assert a.wait()["pid"] != b.wait()["pid"]
    assert a.wait() is a.facts  # once
    done = b.submit(Job(GREEDY, ["x"]))
    for worker in (a, b):
        worker.close()
    assert done.result() == [[("X", -1.0)]]
    never_waited = ModelProcess(fake_batcher, (log,), 4, wait=False)
    never_waited.close()  # a start abandoned (another model failed): closes, no hang


def test_a_dead_model_process_fails_its_jobs_and_refuses_new_ones(tmp_path: Path) -> None:
    worker = ModelProcess(fake_batcher, (str(tmp_path / "calls"),), 4)
    waiting: Future = worker.submit(Job(GREEDY, ["slow"]))
    time.sleep(0.1)
    os.kill(worker.facts["pid"], signal.SIGKILL)
    with pytest.raises(RuntimeError, match="the model process exited"):
        waiting.result(timeout=10)
    deadline = time.monotonic() + 10
    while True:  # the reader marks it closed once it has failed the orphans
        try:
            worker.submit(Job(GREEDY, ["late"]))
        except Closed:
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    worker.close()


class EndlessStream:
    """A greedy stream that never finishes (a decode to a huge budget); logs its steps."""

    def __init__(self, log: str) -> None:
        self.log, self.sentences = log, 0

    def add(self, sentences: list[str]) -> int:
        self.sentences += len(sentences)
        return 0

    def step(self) -> list:
        Path(self.log).touch()  # stepping
        time.sleep(0.01)
        return []

    def cancel(self, handles: list[int]) -> None:
        self.sentences = 0


def endless_batcher(record, log: str) -> tuple[Batcher, dict]:  # noqa: ANN001
    """In the child: greedy jobs go into an endless stream; beam jobs upper-case."""
    translate = fake_batcher(record, log + ".calls")[0]._translate

    def open_stream(cfg: SearchConfig, langs: tuple) -> EndlessStream | None:
        return EndlessStream(log) if cfg.beam_size == 1 else None

    batcher = Batcher(translate, lambda *a: None, 8, 0.0, 16, open_stream=open_stream)
    return batcher, {"pid": os.getpid()}


def test_a_started_job_whose_client_left_is_stopped_between_steps(tmp_path: Path) -> None:
    """Cancelling the parent's future of a job the child is decoding stops its stream at the
    next step: the model process drops the work and serves the next job (was: the stream
    ran on, and every later job waited behind it)."""
    log = tmp_path / "steps"
    worker = ModelProcess(endless_batcher, (str(log),), 16)
    endless = worker.submit(Job(GREEDY, ["forever"]))
    deadline = time.monotonic() + 30
    while not log.exists():  # started: the stream steps
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert endless.cancel()  # the client left
    after = worker.submit(Job(BEAM, ["next"]))
    assert after.result(timeout=30) == [[("NEXT", -1.0)]]
    worker.close()

"""serve.py as users use it: started as a subprocess on 127.0.0.1, called over HTTP.

One server (tiny random model + tiny SentencePiece model, greedy by default) serves most tests;
translations are compared with translate.py's for the same options. The SIGTERM test starts its
own server and holds requests in flight by sending their bodies only after the signal. The
batcher and the option mapping are also tested in-process, where their timing can be scripted.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from attnmt.checkpoint import model_payload, save_checkpoint
from attnmt.decoding.config import SearchConfig
from attnmt.server.batcher import Batcher, Job, QueueFull
from attnmt.server.options import OptionError, apply_options, as_dict
from tests.conftest import make_tiny_model
from tests.helpers_decoding import PAIRS, SEARCH_MODEL, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}  # tiny ops: 1 thread
SOURCES = [src for src, _ in PAIRS]
INPUTS = ["Ein Mann fährt Fahrrad.", "", "Zwei Hunde spielen im Park.", "Die Sonne scheint."]
# The test server's limits (small, so that the error tests stay small).
LIMITS = ["--max-sentences", "8", "--max-chars", "200", "--max-beam", "6"]
LIMITS += ["--max-output-tokens", "64", "--batch-wait-ms", "20"]


# ---------------------------------------------------------------- helpers (shared with the page test)


def make_tiny_run(run_dir: Path) -> Path:
    """A run dir like train.py's: checkpoints/best.pt (tiny model, languages, step) and a
    results.json with BLEU scores."""
    tokenizer = tiny_tokenizer(run_dir / "spm")
    model = make_tiny_model(vocab_size=tokenizer.src_vocab_size, seed=2, **SEARCH_MODEL)
    payload = model_payload(model, tokenizer)
    payload["config"] = {"data": {"src_lang": "de", "tgt_lang": "en"}}
    payload["train_state"] = {"step": 7}
    save_checkpoint(run_dir / "checkpoints" / "best.pt", payload)
    results = {"valid": {"bleu": 1.5}, "test": {"test2016": {"bleu": 2.25}}}
    (run_dir / "results.json").write_text(json.dumps(results))
    return run_dir


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def request(
    url: str, method: str, path: str, body: Any = None, raw: bytes | None = None
) -> tuple[int, Any]:
    """(status, parsed JSON answer) of one HTTP request on a fresh connection."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, path, data, headers)
        response = conn.getresponse()
        payload = response.read()
        ctype = response.getheader("content-type", "")
        return response.status, json.loads(payload) if "json" in ctype else payload
    finally:
        conn.close()


def post(url: str, path: str, body: Any) -> tuple[int, Any]:
    return request(url, "POST", path, body)


@dataclass
class Served:
    url: str
    process: subprocess.Popen


@contextmanager
def serve(run_dir: Path, *flags: str) -> Iterator[Served]:
    """`python serve.py -c RUN_DIR --port P FLAGS` until healthy; SIGTERM at the end."""
    port = free_port()
    cmd = [sys.executable, "serve.py", "-c", str(run_dir), "--port", str(port), *flags]
    process = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.stderr.read()
            try:
                if request(url, "GET", "/health")[0] == 200:
                    break
            except OSError:
                assert time.monotonic() < deadline, "serve.py did not become healthy"
                time.sleep(0.1)
        yield Served(url, process)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
        process.stderr.close()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_run(tmp_path_factory.mktemp("serve_run"))


@pytest.fixture(scope="module")
def server(run_dir: Path) -> Iterator[str]:
    with serve(run_dir, "--beam", "1", *LIMITS) as served:
        yield served.url


def translate_py(run_dir: Path, *flags: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "translate.py", "-c", str(run_dir), *flags, *INPUTS],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


# ---------------------------------------------------------------- the API over HTTP


def test_translations_equal_translate_py(server: str, run_dir: Path) -> None:
    """Greedy (the server's default) and beam 3 with 2-best lists: the same texts and scores
    as translate.py with the same options, in request order (the empty line included)."""
    status, greedy = post(server, "/translate", {"sentences": INPUTS})
    assert status == 200, greedy
    assert greedy["translations"] == translate_py(run_dir, "--beam", "1")
    assert greedy["options"]["beam_size"] == 1 and "nbest" not in greedy
    assert greedy["translations"][1] == ""

    options = {"beam_size": 3, "nbest": 2, "length_penalty": 0.6, "lp_type": "gnmt"}
    status, beam = post(server, "/translate", {"sentences": INPUTS, **options})
    assert status == 200, beam
    flags = ["--beam", "3", "--nbest", "2", "--length-penalty", "0.6", "--lp-type", "gnmt"]
    lines = [line.split(" ||| ") for line in translate_py(run_dir, *flags)]
    expected = [(int(i), text, float(score)) for i, text, score in lines]
    got = [
        (i, hyp["translation"], round(hyp["score"], 4))
        for i, nbest in enumerate(beam["nbest"])
        for hyp in nbest
    ]
    assert got == expected
    assert beam["translations"] == [nbest[0]["translation"] for nbest in beam["nbest"]]
    assert beam["options"] == {**as_dict(SearchConfig(beam_size=1)), **options}
    assert post(server, "/translate", {"sentences": []}) == (
        200, {"translations": [], "scores": [], "options": greedy["options"]}
    )  # fmt: skip


def test_prefixes_equal_translate_py_tab_prefix(server: str, run_dir: Path) -> None:
    """`prefixes` (one per sentence, "" for none) force each translation's start, as
    translate.py --tab-prefix does for the same lines."""
    prefixes = ["A man", "", "Two", ""][: len(INPUTS)]
    status, got = post(server, "/translate", {"sentences": INPUTS, "prefixes": prefixes})
    assert status == 200, got
    lines = "".join(f"{s}\t{p}\n" for s, p in zip(INPUTS, prefixes, strict=True))
    out = subprocess.run(
        [sys.executable, "translate.py", "-c", str(run_dir), "--beam", "1", "--tab-prefix"],
        input=lines, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert got["translations"] == out.stdout.splitlines()
    assert got["translations"][0].startswith("A man")
    status, err = post(server, "/translate", {"sentences": INPUTS, "prefixes": ["x"]})
    assert status == 422 and "prefixes for" in err["error"]


BAD_REQUESTS = [
    # (path, raw body, status, words the error names)
    ("/translate", b'{"sentences": ["a"', 400, ["not valid JSON"]),
    ("/translate", b'["a"]', 400, ["JSON object"]),
    ("/translate", b'{"sentence": ["a"]}', 400, ["'sentences'"]),
    ("/translate", b'{"sentences": ["a", 3]}', 400, ["list of strings"]),
    ("/translate", b'{"sentences": ["a"], "beam": 2}', 422, ["unknown option 'beam'", "beam_size"]),
    ("/translate", b'{"sentences": ["a"], "beam_size": "2"}', 422, ["'beam_size'", "integer"]),
    ("/translate", b'{"sentences": ["a"], "beam_size": 0}', 422, ["beam_size must be >= 1"]),
    ("/translate", b'{"sentences": ["a"], "length_penalty": NaN}', 422, ["'length_penalty'"]),
    ("/translate", b'{"sentences": ["a"], "length_penalty": 3e16}', 422, ["length_penalty must"]),
    ("/translate", b'{"sentences": ["A \\ud800 man"]}', 400, ["lone surrogate"]),
    ("/translate", b'{"q": "A \\udfff", "source": "en", "target": "de"}', 400, ["surrogate"]),
    ("/translate", b'{"sentences": ["a"], "lp_type": "x"}', 422, ["'lp_type'", "gnmt"]),
    ("/translate", b'{"sentences": ["a"], "nbest": 2}', 422, ["nbest", "beam_size=1"]),
    ("/translate", b'{"sentences": ["a"], "batch_size": 2}', 422, ["'batch_size'", "--batch"]),
    ("/translate", b'{"sentences": ["a"], "beam_size": 7}', 422, ["beam_size", "--max-beam"]),
    ("/translate", b'{"sentences": ["a"], "max_len_b": 99}', 422, ["--max-output-tokens"]),
    ("/translate", json.dumps({"sentences": ["a"] * 9}).encode(), 413, ["9 sentences", "8"]),
    ("/translate", json.dumps({"sentences": ["a", "b" * 201]}).encode(), 413, ["sentences[1]"]),
    ("/translate", b"x" * 600_000, 413, ["request body over"]),
    ("/attention", b'{"sentence": "  "}', 422, ["empty"]),
    ("/attention", b'{"sentences": ["a"]}', 400, ["'sentence'"]),
    ("/attention", b'{"sentence": "a", "top": 1}', 422, ["unknown option 'top'"]),
]


@pytest.mark.parametrize(("path", "raw", "status", "words"), BAD_REQUESTS)
def test_bad_requests_get_a_json_error_naming_the_problem(
    server: str, path: str, raw: bytes, status: int, words: list[str]
) -> None:
    got, answer = request(server, "POST", path, raw=raw)
    assert got == status, answer
    assert set(answer) == {"error"}
    for word in words:
        assert word in answer["error"], (word, answer["error"])


def test_unknown_routes_and_methods_are_json_errors_and_the_server_keeps_serving(
    server: str,
) -> None:
    assert request(server, "GET", "/nope") == (404, {"error": "Not Found"})
    assert request(server, "GET", "/translate") == (405, {"error": "Method Not Allowed"})
    assert post(server, "/translate", {"sentences": ["Die Sonne scheint."]})[0] == 200


def test_health_info_and_the_page(server: str) -> None:
    status, health = request(server, "GET", "/health")
    assert status == 200 and health["status"] == "ok" and health["queued"] == 0
    status, info = request(server, "GET", "/info")
    assert status == 200
    assert (info["source_language"], info["target_language"], info["step"]) == ("de", "en", 7)
    assert (info["valid_bleu"], info["test_bleu"]) == (1.5, {"test2016": 2.25})
    assert info["vocab"]["source"] == info["model"]["src_vocab_size"]
    assert info["parameters"] > 0 and info["device"] == "cpu"
    assert info["options"]["beam_size"] == 1 and info["max_sentences"] == 8
    status, page = request(server, "GET", "/")
    assert status == 200 and b'id="heatmap"' in page and b"/static/app.js" in page
    status, script = request(server, "GET", "/static/app.js")
    assert status == 200 and b"/attention" in script
    assert b"http" not in page.replace(b"http-equiv", b"")  # nothing from outside


def test_attention_rows_are_distributions_over_the_source(server: str) -> None:
    sentence = "Zwei Hunde spielen im Park."
    status, attn = post(server, "/attention", {"sentence": sentence, "beam_size": 2})
    assert status == 200, attn
    weights = attn["attention"]  # (L, H, T, S)
    src, tgt = attn["src_pieces"], attn["tgt_pieces"]
    assert (len(weights), len(weights[0])) == (attn["layers"], attn["heads"]) == (2, 4)
    assert src[-1] == tgt[-1] == "</s>"
    for head in (h for layer in weights for h in layer):
        assert len(head) == len(tgt) and all(len(row) == len(src) for row in head)
        assert all(abs(sum(row) - 1) < 1e-3 for row in head)
    _, answer = post(server, "/translate", {"sentences": [sentence], "beam_size": 2})
    assert attn["translation"] == answer["translations"][0]


def test_concurrent_requests_each_get_their_own_answer(server: str) -> None:
    """24 clients at once, mixed options: every answer is its own request's, in order."""
    jobs = [
        ({"sentences": SOURCES[i : i + 1 + i % 3]}, {"beam_size": 1 + i % 2}) for i in range(24)
    ]
    expected = [post(server, "/translate", {**body, **opts})[1] for body, opts in jobs]
    got: list[Any] = [None] * len(jobs)
    barrier = threading.Barrier(len(jobs))

    def client(i: int) -> None:
        barrier.wait()
        got[i] = post(server, "/translate", {**jobs[i][0], **jobs[i][1]})

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [status for status, _ in got] == [200] * len(jobs)
    assert [answer["translations"] for _, answer in got] == [e["translations"] for e in expected]


def test_load_script_finds_every_answer_matches_its_request(server: str, tmp_path: Path) -> None:
    """benchmarks/load_server.py against the running server: consistency, not speed; one
    untimed pass at the most clients before the levels (its model calls are in none)."""
    calls_before = request(server, "GET", "/health")[1]["batches"]
    sentences = tmp_path / "src.txt"
    sentences.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    out = tmp_path / "levels.json"
    cmd = [sys.executable, "-m", "benchmarks.load_server", "--url", server, "--input"]
    cmd += [str(sentences), "--sentences", "24", "--clients", "1,6", "--per-request", "2"]
    cmd += ["--json", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    levels = json.loads(out.read_text())
    assert [level["clients"] for level in levels] == [1, 6]
    for level in levels:
        assert (level["sentences"], level["requests"]) == (24, 12)
        assert (level["mismatched"], level["errors"]) == (0, 0)
    assert "| as started | 6 | 12 |" in done.stdout
    calls = request(server, "GET", "/health")[1]["batches"] - calls_before
    assert calls > 24 + sum(level["batches"] for level in levels)  # 24: the references


def test_load_script_starts_the_server_loses_no_answer_and_sits_beside_offline(
    run_dir: Path, tmp_path: Path
) -> None:
    """load_server with -c (serve.py started by the script, exit 0 on SIGTERM): at 1 and 6
    clients, greedy (the stream) and beam 3, every answer is its sentence's reference, and the
    table sets it beside offline translate.py."""
    sentences = tmp_path / "src.txt"
    sentences.write_text("\n".join(SOURCES[:12]) + "\n", encoding="utf-8")
    out = tmp_path / "levels.json"
    cmd = [sys.executable, "-m", "benchmarks.load_server", "-c", str(run_dir), "--input"]
    cmd += [str(sentences), "--modes", "batching", "--clients", "1,6", "--beam", "1,3"]
    cmd += ["--offline", "--no-warm", "--json", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    levels = json.loads(out.read_text())
    assert [(lv["beam"], lv["clients"]) for lv in levels] == [(1, 1), (1, 6), (3, 1), (3, 6)]
    for level in levels:
        assert (level["sentences"], level["mismatched"], level["errors"]) == (12, 0, 0)
        assert level["mode"].startswith("batching") and level["offline"] > 0
        assert level["batches"] > 0  # the server's own count of model calls
    assert "server against offline translate.py" in done.stdout
    assert "| batching | 3 | 6 |" in done.stdout  # a row per mode, beam and client count
    assert f"code: {ROOT.resolve()} at " in done.stdout  # the tree it timed, for A/Bs


def test_sigterm_answers_the_requests_in_flight_then_exits_0(run_dir: Path) -> None:
    """Seven requests, three of them still sending their bodies when SIGTERM comes (the
    other four queued or answered by then): all seven get their answers, then the server
    exits 0."""
    with serve(run_dir, "--no-batching") as served:
        url, process = served.url, served.process
        host, port = url.removeprefix("http://").split(":")
        bodies = [{"sentences": SOURCES[i : i + 8], "beam_size": 5} for i in range(0, 28, 4)]
        expected = [post(url, "/translate", body)[1]["translations"] for body in bodies]
        results: list[Any] = [None] * len(bodies)

        def send(i: int, hold: threading.Event | None) -> None:
            data = json.dumps(bodies[i]).encode()
            with socket.create_connection((host, int(port)), timeout=120) as sock:
                head = f"POST /translate HTTP/1.1\r\nHost: {host}\r\n"
                head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
                sock.sendall(head.encode() + data[:10])
                if hold is not None:
                    hold.wait()
                sock.sendall(data[10:])
                reply = b""
                while chunk := sock.recv(65536):
                    reply += chunk
            status_line, _, rest = reply.partition(b"\r\n")
            results[i] = (int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2]))

        hold = threading.Event()
        threads = [
            threading.Thread(target=send, args=(i, hold if i < 3 else None))
            for i in range(len(bodies))
        ]
        for thread in threads:
            thread.start()

        def received() -> int:  # requests of the seven in flight or already answered
            health = request(url, "GET", "/health")[1]
            return health["in_flight"] + health["answered"] - answered_before

        answered_before = request(url, "GET", "/health")[1]["answered"]
        deadline = time.monotonic() + 60
        while received() < len(bodies):  # the three held ones stay in flight meanwhile
            assert time.monotonic() < deadline, "requests never arrived"
            time.sleep(0.02)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.3)  # the server is shutting down: bodies still arriving must be read
        hold.set()
        for thread in threads:
            thread.join(timeout=120)
        assert process.wait(timeout=60) == 0
        err = process.stderr.read()
        assert "Traceback" not in err and "stopped after answering" in err, err
        assert [r[0] for r in results] == [200] * len(bodies), results
        assert [r[1]["translations"] for r in results] == expected
        with pytest.raises(ConnectionRefusedError):
            request(url, "GET", "/health")


def half_body(served: Served) -> socket.socket:
    """A connection that sent a request's head and one byte of its 99-byte body, once the
    server counts it in flight."""
    host, port = served.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: 99\r\n\r\n{")
    deadline = time.monotonic() + 60
    while request(served.url, "GET", "/health")[1]["in_flight"] < 1:
        assert time.monotonic() < deadline, "the request never arrived"
        time.sleep(0.02)
    return sock


def test_a_client_that_stops_sending_cannot_keep_the_server_from_stopping(run_dir: Path) -> None:
    """Half a body, then silence: after --shutdown-timeout it gets a 503, the server exits 0."""
    with serve(run_dir, "--shutdown-timeout", "1") as served:
        with half_body(served) as sock:
            served.process.send_signal(signal.SIGTERM)
            assert served.process.wait(timeout=60) == 0
            reply = sock.recv(65536)
        assert reply.startswith(b"HTTP/1.1 503"), reply
        assert b"stopped before this request was complete" in reply
        err = served.process.stderr.read()
        assert "1 request(s) still unanswered after --shutdown-timeout 1 s" in err, err


def test_a_client_gone_mid_body_is_no_error_and_no_shutdown_drop(run_dir: Path) -> None:
    """Half a body, then the connection closed: no traceback in the log (the request is dropped
    as a client gone, not a 500), and the stop says it was the client, not the shutdown."""
    with serve(run_dir) as served:
        deadline = time.monotonic() + 60
        half_body(served).close()
        while request(served.url, "GET", "/health")[1]["in_flight"] > 0:
            assert time.monotonic() < deadline, "the dropped request stayed in flight"
            time.sleep(0.02)
        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(timeout=60) == 0
        err = served.process.stderr.read()
    assert "Traceback" not in err and "Exception in ASGI" not in err, err
    want = "stopped after answering every request it had received (1 dropped: their clients "
    assert want + "closed the connection first)" in err, err


def test_startup_mistakes_are_one_line_errors(run_dir: Path, tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "serve.py", *args],
            cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    missing = run("-c", str(tmp_path / "nope"), "--port", str(free_port()))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = run("-c", str(run_dir), "--port", str(busy.getsockname()[1]))
    bad_flag = run("-c", str(run_dir), "--max-queue", "0")
    # the second is checked while the first model loads: that process goes too (it would keep
    # stderr open, and `run` would time out)
    second_missing = run("-c", str(run_dir), "-c", str(tmp_path / "nope"), "--port", str(free_port()))  # fmt: skip
    for done, words in [
        (missing, ["checkpoint not found", "-c"]),
        (second_missing, ["checkpoint not found", "nope"]),
        (taken, ["cannot listen on 127.0.0.1", "--port"]),
        (bad_flag, ["--max-queue", "less than 1"]),
    ]:
        lines = done.stderr.strip().splitlines()
        assert done.returncode in (1, 2) and len(lines) == 1, done.stderr
        assert lines[0].startswith("serve.py: error: ")
        assert all(word in lines[0] for word in words), lines[0]


# ---------------------------------------------------------------- in-process: batcher, options


class ScriptedModel:
    """The batcher's callables: records each call; the first one waits for `release`."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, list[str]]] = []  # (beam_size, sentences) or (-1, [attn])
        self.started, self.release = threading.Event(), threading.Event()

    def translate(
        self, cfg: SearchConfig, sentences: list[str], prefixes: list[str], langs: tuple
    ) -> list[str]:
        assert len(prefixes) == len(sentences) and len(langs) == 2
        self._record(cfg.beam_size, sentences)
        if "boom" in sentences:
            raise RuntimeError("boom")
        return [s.upper() for s in sentences]

    def attention(self, cfg: SearchConfig, sentence: str, langs: tuple) -> str:
        self._record(-1, [sentence])
        return f"attention of {sentence}"

    def _record(self, beam: int, sentences: list[str]) -> None:
        self.calls.append((beam, sentences))
        if len(self.calls) == 1:
            self.started.set()
            assert self.release.wait(10)


def jobs_behind_a_busy_model(one_request: bool) -> tuple[ScriptedModel, Batcher, list[Future]]:
    """The model busy with a first job while five more queue up, then released."""
    model = ScriptedModel()
    batcher = Batcher(model.translate, model.attention, 4, 0.05, 10, one_request)
    greedy, beam = SearchConfig(beam_size=1), SearchConfig(beam_size=2)
    futures = [batcher.submit(Job(greedy, ["a"]))]
    assert model.started.wait(10)
    for job in [
        Job(greedy, ["b", "c"]),
        Job(beam, ["d"]),
        Job(greedy, ["e"]),
        Job(greedy, ["f", "g"]),  # would make the greedy batch 5 > 4 sentences
        Job(greedy, ["h"], attention=True),
    ]:
        futures.append(batcher.submit(job))
    model.release.set()
    batcher.close()
    return model, batcher, futures


def test_batcher_batches_queued_jobs_with_the_same_options() -> None:
    model, batcher, futures = jobs_behind_a_busy_model(one_request=False)
    assert model.calls == [
        (1, ["a"]),
        (1, ["b", "c", "e"]),  # same options, up to 4 sentences, whole jobs only
        (2, ["d"]),
        (1, ["f", "g"]),
        (-1, ["h"]),  # attention: alone
    ]
    assert [f.result() for f in futures] == [
        ["A"], ["B", "C"], ["D"], ["E"], ["F", "G"], "attention of h"
    ]  # fmt: skip
    assert batcher.batches == 5


def test_batcher_without_batching_runs_one_request_per_call() -> None:
    model, _, futures = jobs_behind_a_busy_model(one_request=True)
    assert [sentences for _, sentences in model.calls] == [
        ["a"], ["b", "c"], ["d"], ["e"], ["f", "g"], ["h"]
    ]  # fmt: skip
    assert futures[1].result() == ["B", "C"]


def test_batcher_limits_its_queue_drops_cancelled_jobs_and_survives_a_failing_batch() -> None:
    model = ScriptedModel()
    batcher = Batcher(model.translate, model.attention, 8, 0.0, 3)
    cfg = SearchConfig(beam_size=1)
    first = batcher.submit(Job(cfg, ["a"]))
    assert model.started.wait(10)
    failing = batcher.submit(Job(cfg, ["boom"]))
    other = batcher.submit(Job(SearchConfig(beam_size=2), ["x"]))
    gone = batcher.submit(Job(SearchConfig(beam_size=3), ["gone"]))
    with pytest.raises(QueueFull):
        batcher.submit(Job(cfg, ["too many"]))
    assert gone.cancel()  # its client left while it waited: no model call, no error
    model.release.set()
    batcher.close()  # finishes what is queued
    assert first.result() == ["A"] and other.result() == ["X"]
    assert ["gone"] not in [sentences for _, sentences in model.calls]
    with pytest.raises(RuntimeError, match="boom"):
        failing.result()


def _new_option(default: Any) -> Any:
    return field(default=default, metadata={"help": "", "min": None, "flag": ""})


@dataclass
class FutureSearchConfig(SearchConfig):
    """SearchConfig with fields of the kinds a later change may add (names of its own, so that
    they stay new whatever SearchConfig gains)."""

    sampling: bool = _new_option(False)
    extra_flag: bool = _new_option(False)
    extra_k: int = _new_option(0)
    extra_scale: float = _new_option(1.0)
    extra_seed: int | None = _new_option(None)
    extra_method: Literal["beam", "sample"] = _new_option("beam")


def test_options_are_the_config_fields_whatever_they_are() -> None:
    defaults = FutureSearchConfig()
    options = {"extra_flag": True, "extra_k": 5, "extra_scale": 1, "extra_seed": 3}
    cfg = apply_options({**options, "extra_method": "sample"}, defaults)
    assert (cfg.extra_flag, cfg.extra_k, cfg.extra_scale, cfg.extra_seed, cfg.extra_method) == (
        True, 5, 1.0, 3, "sample"
    )  # fmt: skip
    assert isinstance(cfg.extra_scale, float)
    assert apply_options({"extra_seed": None}, cfg).extra_seed is None
    assert "extra_scale" in as_dict(cfg) and "batch_size" not in as_dict(cfg)
    for options, words in [
        ({"extra_flag": 1}, ["'extra_flag'", "true or false"]),
        ({"extra_seed": 1.5}, ["'extra_seed'", "an integer or null"]),
        ({"extra_method": "greedy"}, ["'extra_method'", "'sample'"]),
        ({"extra_scale": "hot"}, ["'extra_scale'", "finite number"]),
        ({"no_such_option": 0.9}, ["unknown option 'no_such_option'", "extra_scale"]),
    ]:
        with pytest.raises(OptionError) as error:
            apply_options(options, defaults)
        assert all(word in str(error.value) for word in words), str(error.value)


def test_batcher_gives_a_request_that_samples_a_batch_of_its_own() -> None:
    """Batched, a request's samples would depend on its neighbours: sampling runs alone."""
    model = ScriptedModel()
    batcher = Batcher(model.translate, model.attention, 8, 0.05, 10)
    sample = FutureSearchConfig(beam_size=1, sampling=True)
    greedy = FutureSearchConfig(beam_size=1)
    futures = [batcher.submit(Job(greedy, ["a"]))]
    assert model.started.wait(10)
    for job in [Job(sample, ["b"]), Job(sample, ["c"]), Job(greedy, ["d"]), Job(greedy, ["e"])]:
        futures.append(batcher.submit(job))
    model.release.set()
    batcher.close()
    assert [sentences for _, sentences in model.calls] == [["a"], ["b"], ["c"], ["d", "e"]]
    assert [f.result() for f in futures] == [["A"], ["B"], ["C"], ["D"], ["E"]]


class ScriptedStream:
    """A stream (`server.batcher.Stream`) whose requests take one step per sentence; its
    first step waits for `release`; "boom" makes a step fail."""

    def __init__(self, log: list, release: threading.Event) -> None:
        self.log, self.release, self.running = log, release, {}
        self.sentences = 0

    def add(self, sentences: list[str]) -> int:
        self.log.append(("add", sentences))
        handle = len(self.log)
        self.running[handle] = [sentences, len(sentences)]
        self.sentences += len(sentences)
        return handle

    def step(self) -> list[tuple[int, list[str]]]:
        assert self.release.wait(10)
        self.log.append(("step",))
        if any("boom" in sentences for sentences, _ in self.running.values()):
            raise RuntimeError("boom")
        done = []
        for handle, request in list(self.running.items()):
            request[1] -= 1
            self.sentences -= 1
            if request[1] == 0:
                done.append((handle, [s.upper() for s in request[0]]))
                del self.running[handle]
        return done


def test_batcher_streams_greedy_jobs_that_join_between_steps_in_arrival_order() -> None:
    """Greedy jobs join the running stream between its steps while its sentences fit in 4; a
    job of other options stops the joining, so the greedy job behind it waits for the next
    stream; a failing stream fails the jobs in it only."""
    model, log, release = ScriptedModel(), [], threading.Event()
    model.release.set()

    def open_stream(cfg: SearchConfig, langs: tuple) -> ScriptedStream | None:
        return ScriptedStream(log, release) if cfg.beam_size == 1 else None

    batcher = Batcher(model.translate, model.attention, 4, 0.05, 10, open_stream=open_stream)
    greedy, beam = SearchConfig(beam_size=1), SearchConfig(beam_size=2)
    futures = [batcher.submit(Job(greedy, ["a"]))]
    while not log:  # the stream has taken "a" and waits in its first step
        time.sleep(0.01)
    jobs = [["b", "c"], ["d"], ["e"], ["f", "g"]]
    futures += [batcher.submit(Job(greedy, sentences)) for sentences in jobs]
    futures.append(batcher.submit(Job(beam, ["h"])))
    futures.append(batcher.submit(Job(greedy, ["i"])))
    futures.append(batcher.submit(Job(greedy, ["boom"])))
    release.set()
    batcher.close()
    assert log == [
        ("add", ["a"]), ("step",),  # "a" done
        ("add", ["b", "c"]), ("add", ["d"]), ("add", ["e"]), ("step",),  # 4 sentences; "f g": 6
        ("add", ["f", "g"]), ("step",), ("step",),  # "b c" and "f g" take 2 steps each
        ("add", ["i"]), ("step",), ("add", ["boom"]), ("step",),  # after the beam job's batch
    ]  # fmt: skip
    assert model.calls == [(2, ["h"])]
    assert [f.result() for f in futures[:7]] == [
        ["A"], ["B", "C"], ["D"], ["E"], ["F", "G"], ["H"], ["I"]
    ]  # fmt: skip
    with pytest.raises(RuntimeError, match="boom"):
        futures[7].result()

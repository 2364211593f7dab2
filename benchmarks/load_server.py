"""Load test for serve.py: throughput and latency at 1, 8 and 32 concurrent clients, batching
on against off, and a check that every answer belongs to its request.

    python -m benchmarks.load_server -c RUN_DIR                     # test2016, greedy
    python -m benchmarks.load_server -c RUN_DIR --beam 5 --sentences 200
    python -m benchmarks.load_server --url http://127.0.0.1:8000 --input FILE
    python -m benchmarks.load_server -c RUN_A -c RUN_B --soak 600 --clients 32
    OMP_NUM_THREADS=1 python -m benchmarks.load_server -c RUN_DIR --beam 1,5 --offline \
        --modes batching,batching,batching             # server against offline translate.py

Without --url it starts `serve.py` itself on a free loopback port, once per mode (`batching`:
the defaults; `no-batching`: `--no-batching`; `in-process`: serve.py's model and batcher in
this process, the first model only: the server less its HTTP, JSON and pipe). The reference
translation of every sentence is computed once up front, one sentence per request and one
request at a time; then, at each client count, the clients send all the sentences
(`--per-request` per request) as fast as answers come back (after one untimed pass at the most
clients: `--no-warm` skips it). An answer that differs from its sentence's reference is counted
as a mismatch, and as a swap when it equals another sentence's reference (a lost, duplicated
or swapped translation); the exit status is 1 when any mismatch is found. Bounded: at most
`--sentences` sentences per level and `--max-seconds` per level; loopback only. `--soak` runs
the soak instead (see `run_soak`).
`--offline` times translate.py's own loader and `Translator` on the same sentences, beam and
threads, in its precision (the run's, as translate.py and serve.py both decode, or
`--precision`'s for both; median of 3, model load excluded) before each mode's levels, and ends
with the server / offline table (medians over rounds).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import queue
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlencode, urlsplit

ROOT = Path(__file__).resolve().parents[1]
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class Client:
    """One keep-alive HTTP connection to the server (one per client thread)."""

    def __init__(self, url: str, timeout: float = 300.0) -> None:
        parts = urlsplit(url)
        self.host, self.port, self.timeout = parts.hostname, parts.port or 80, timeout
        self.conn: http.client.HTTPConnection | None = None

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return self.post_raw(path, json.dumps(body).encode("utf-8"), "application/json")

    def post_raw(self, path: str, data: bytes, content_type: str) -> tuple[int, dict[str, Any]]:
        headers = {"Content-Type": content_type}
        for attempt in range(2):  # a keep-alive connection the server closed: reconnect once
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self.conn.request("POST", path, data, headers)
                response = self.conn.getresponse()
                return response.status, json.loads(response.read())
            except (ConnectionError, http.client.RemoteDisconnected):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def get(self, path: str) -> dict[str, Any]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request("GET", path)
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()


class InProcess:
    """serve.py's model and batcher loaded in this process (mode `in-process`): the server
    without HTTP, JSON and the model process's pipe, behind `Client`'s `post` and `get`."""

    def __init__(self, checkpoint: str, flags: list[str]) -> None:
        from attnmt.cli.serve import build_parser, load_batcher, search_config

        args = build_parser().parse_args(["-c", checkpoint, *flags])
        self.batcher, facts = load_batcher(lambda *_: None, args, checkpoint, search_config(args), False)  # fmt: skip
        self.defaults = facts["defaults"]

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        from attnmt.server.batcher import Job
        from attnmt.server.options import apply_options

        cfg = apply_options({"beam_size": body["beam_size"]}, self.defaults)  # as serve.py's
        found = self.batcher.submit(Job(cfg, body["sentences"])).result()
        return 200, {"translations": [nbest[0][0] for nbest in found]}

    def get(self, path: str) -> dict[str, Any]:
        return {"batches": self.batcher.batches, "models": [{"id": ""}]}

    def __enter__(self) -> InProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.batcher.close()


def connect(url: str | InProcess) -> Client | InProcess:
    return url if isinstance(url, InProcess) else Client(url)


class Level(NamedTuple):
    model: str  # the model id the requests named ("" for the default model)
    mode: str
    clients: int
    requests: int
    sentences: int
    seconds: float
    p50_ms: float
    p99_ms: float
    mismatched: int
    swapped: int
    errors: int
    batches: int  # model calls the server made during the level
    beam: int = 1
    offline: float = 0.0  # offline translate.py's sentences/s just before (0: not timed)


def wait_healthy(url: str, process: subprocess.Popen | None, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"serve.py exited with status {process.returncode} while starting")
        try:
            if Client(url, timeout=5).get("/health").get("status") == "ok":
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"no healthy server at {url} after {timeout:.0f} s")


@contextmanager
def started_server(
    checkpoints: list[str], extra: list[str], handle: list | None = None
) -> Iterator[str]:
    """serve.py (one `-c` per checkpoint) on a free loopback port; its URL. Stopped with
    SIGTERM (it must exit 0). `handle`, when given, receives the process."""
    with socket.socket() as sock:  # a free loopback port
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    models = [arg for c in checkpoints for arg in ("-c", c)]
    cmd = [sys.executable, str(ROOT / "serve.py"), *models, "--port", str(port), *extra]
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=log)
        if handle is not None:
            handle.append(process)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, process)
            yield url
        finally:
            process.terminate()
            status = process.wait(timeout=120)
            log.seek(0)
            if status != 0:
                tail = log.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"serve.py exited with status {status}:\n{tail}")


def translation(client: Client, body: dict[str, Any]) -> str:
    """The one translation of a one-sentence request (a reference)."""
    status, answer = client.post("/translate", body)
    if status != 200:
        raise RuntimeError(f"reference request failed ({status}): {answer}")
    return answer["translations"][0]


def percentile(ms: list[float], q: float) -> float:
    ms = sorted(ms) or [0.0]
    return ms[min(len(ms) - 1, round(q * (len(ms) - 1)))]


def run_level(url: str, mode: str, clients: int, sentences: list[str], refs: list[str],
              options: dict[str, Any], per_request: int, max_seconds: float) -> Level:  # fmt: skip
    """All `sentences` sent by `clients` threads, `per_request` per request; the figures."""
    work: queue.Queue[list[int]] = queue.Queue()
    for start in range(0, len(sentences), per_request):
        work.put(list(range(start, min(start + per_request, len(sentences)))))
    by_text: dict[str, set[int]] = {}
    for i, ref in enumerate(refs):
        by_text.setdefault(ref, set()).add(i)
    latencies: list[float] = []
    counts = {"sentences": 0, "mismatched": 0, "swapped": 0, "errors": 0}
    lock = threading.Lock()
    before = connect(url).get("/health")["batches"]
    start_time = time.perf_counter()
    deadline = start_time + max_seconds

    def client_loop() -> None:
        client = connect(url)
        while time.perf_counter() < deadline:
            try:
                indices = work.get_nowait()
            except queue.Empty:
                return
            body = {"sentences": [sentences[i] for i in indices], **options}
            sent = time.perf_counter()
            try:
                status, answer = client.post("/translate", body)
            except OSError:
                status, answer = 0, {}
            took = time.perf_counter() - sent
            with lock:
                if status != 200 or len(answer.get("translations", [])) != len(indices):
                    counts["errors"] += 1
                    continue
                latencies.append(took)
                counts["sentences"] += len(indices)
                for i, text in zip(indices, answer["translations"], strict=True):
                    if text != refs[i]:
                        counts["mismatched"] += 1
                        counts["swapped"] += bool(by_text.get(text, set()) - {i})

    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start_time
    batches = connect(url).get("/health")["batches"] - before
    ms = [t * 1000 for t in latencies]
    return Level(
        options.get("model", ""), mode, clients, len(latencies), counts["sentences"], seconds,
        statistics.median(ms or [0.0]), percentile(ms, 0.99),
        counts["mismatched"], counts["swapped"], counts["errors"], batches, options["beam_size"],
    )  # fmt: skip


def table(levels: list[Level]) -> str:
    head = (
        "| model | mode | clients | requests | sentences/s | p50 ms | p99 ms | model calls | "
        "mismatched (swapped) | errors |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    return head + "".join(
        f"| {lv.model or 'default'} | {lv.mode} | {lv.clients} | {lv.requests} | "
        f"{lv.sentences / lv.seconds if lv.seconds else 0.0:.1f} | {lv.p50_ms:.0f} | {lv.p99_ms:.0f} | {lv.batches} | "
        f"{lv.mismatched} ({lv.swapped}) | {lv.errors} |\n"
        for lv in levels
    )


OFFLINE = """import statistics, sys, time
from attnmt.cli.translate import build_parser, load_translator, runtime_precision, search_config
args = build_parser().parse_args(sys.argv[1:])
translator, lines, took = load_translator(args, search_config(args)), sys.stdin.read().splitlines(), []
with runtime_precision(args, translator):
    translator.translate(lines[:8])
    for _ in range(3):
        start = time.perf_counter()
        translator.translate(lines)
        took.append(time.perf_counter() - start)
print(len(lines) / statistics.median(took))"""


def offline(checkpoint: str, beam: int, sentences: list[str], precision: str = "") -> float:
    """Offline translate.py's sentences/s (its loader and `Translator`; median of 3 runs), in
    `precision` ("": the run's, as translate.py decides)."""
    cmd = [sys.executable, "-c", OFFLINE, "-c", checkpoint, "--beam", str(beam)]
    cmd += ["--precision", precision] if precision else []
    done = subprocess.run(cmd, input="\n".join(sentences), cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"offline translate.py failed: {done.stderr[-2000:]}")
    return float(done.stdout.split()[-1])


def versus_offline(levels: list[Level]) -> str:
    """Per mode, beam and client count, medians over the rounds: the server's sentences/s,
    offline translate.py's, their ratio (per round), p50 and p99 latency."""
    rows: dict[tuple[str, int, int], list[tuple[float, ...]]] = {}
    for lv in levels:
        rate = lv.sentences / lv.seconds
        figures = (rate, lv.offline, rate / lv.offline, lv.p50_ms, lv.p99_ms)
        rows.setdefault((lv.mode.split(",")[0], lv.beam, lv.clients), []).append(figures)
    out = "| mode | beam | clients | server sent/s | offline sent/s | server / offline | p50 ms | p99 ms | rounds |\n"  # fmt: skip
    out += "|---" + "|---:" * 8 + "|\n"
    for (mode, beam, clients), figures in sorted(rows.items()):
        m = [statistics.median(column) for column in zip(*figures, strict=True)]
        out += f"| {mode} | {beam} | {clients} | {m[0]:.1f} | {m[1]:.1f} | {m[2]:.2f} | {m[3]:.0f} | {m[4]:.0f} | {len(figures)} |\n"  # fmt: skip
    return out


def run_levels(args: argparse.Namespace, sentences: list[str]) -> int:
    """Every mode x model x client count; the table; 1 when an answer was wrong or lost."""
    clients, beams = [int(c) for c in args.clients.split(",")], [int(b) for b in args.beam.split(",")]  # fmt: skip
    levels: list[Level] = []
    refs: dict[tuple[str, int], list[str]] = {}
    unchecked = 0  # wrong or failed answers of the untimed passes
    for mode in ["as started"] if args.url else args.modes.split(","):
        if args.url:
            wait_healthy(args.url, None, timeout=30)
            server: Any = contextlib.nullcontext(args.url)
        else:
            flags = args.server_args.split() + (["--no-batching"] if mode == "no-batching" else [])
            flags += ["--precision", args.precision] if args.precision else []
            local = mode == "in-process"  # one model, no HTTP (`InProcess`)
            server = InProcess(args.checkpoint[0], flags) if local else started_server(args.checkpoint, flags)  # fmt: skip
        with server as url:
            ids = [m["id"] for m in connect(url).get("/models")["models"]]
            for model, beam in [(m, b) for m in (ids if len(ids) > 1 else [""]) for b in beams]:
                options: dict[str, Any] = {"beam_size": beam, **({"model": model} if model else {})}  # fmt: skip
                if (model, beam) not in refs:
                    began, client = time.perf_counter(), connect(url)
                    refs[model, beam] = [translation(client, {"sentences": [s], **options}) for s in sentences]  # fmt: skip
                    print(f"references {model} beam {beam}: {len(sentences)} sentences, one at a "
                          f"time, in {time.perf_counter() - began:.1f} s", file=sys.stderr)  # fmt: skip
                speed = offline(args.checkpoint[ids.index(model) if model else 0], beam, sentences, args.precision) if args.offline else 0.0  # fmt: skip
                if args.warm:  # untimed, as offline's first of 3 runs: the server's heap grown
                    warm = run_level(url, mode, max(clients), sentences, refs[model, beam], options, args.per_request, args.max_seconds)  # fmt: skip
                    unchecked += warm.mismatched + warm.errors  # in no level, in the exit status
                for n in clients:
                    level = run_level(url, mode if len(beams) == 1 else f"{mode}, beam {beam}", n, sentences, refs[model, beam], options, args.per_request, args.max_seconds)  # fmt: skip
                    levels.append(level._replace(offline=speed))
                    print(table(levels[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    from benchmarks.peers import code_under_test

    print(f"{len(sentences)} sentences per level, {args.per_request} per request, beam {args.beam}; code: {code_under_test()}")  # fmt: skip
    print(table(levels), end="")
    if args.offline:
        print("\nserver against offline translate.py (medians over rounds)\n" + versus_offline(levels), end="")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps([lv._asdict() for lv in levels], indent=1))
    bad = unchecked + sum(lv.mismatched + lv.errors for lv in levels)
    if bad:
        print(f"load_server: {bad} mismatched or failed answers", file=sys.stderr)
    return 1 if bad else 0


class SoakSettings(NamedTuple):
    seconds: float  # how long the clients send (then SIGTERM)
    clients: int
    warmup: float  # seconds of load before the RSS baseline
    max_requests: int  # the clients stop after this many requests in all
    seed: int


def rss_kib(pid: int) -> int:
    """The process's resident set size (Linux /proc), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


def _html(texts: list[str]) -> str:
    """The texts as one HTML paragraph, each after the first in a nested <b>."""
    escaped = [t.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") for t in texts]
    return "<p>" + " <b>".join(escaped) + "</b>" * (len(texts) - 1) + "</p>"


# Bad requests of the soak: (route, raw body, content type, the status it must get).
BAD_REQUESTS = [
    ("/translate", b'{"sentences": ["a"', "application/json", 400),
    ("/translate", b'{"sentences": ["a"], "beam": 2}', "application/json", 422),
    ("/translate", b'{"sentences": ["a"], "src_lang": "xx", "tgt_lang": "yy"}', "application/json", 422),
    ("/translate", b'{"q": "a", "source": "xx", "target": "yy"}', "application/json", 400),
    ("/translate", b"q=&source=en&target=de", "application/x-www-form-urlencoded", 400),
    ("/translate", b'{"q": "a", "source": "en", "target": "de", "format": "pdf"}', "application/json", 400),
    ("/attention", b'{"sentence": "  "}', "application/json", 422),
]  # fmt: skip
# The kinds of valid requests, with the search options of their references.
SEARCHES = {"greedy": {"beam_size": 1}, "beam": {"beam_size": 4},
            "sample": {"sampling": True, "seed": 7, "topk": 10}}  # fmt: skip


class Soak:
    """The soak's shared state: the served models, the sentences and their references, and
    the figures the client threads record."""

    def __init__(self, url: str, models: list[dict], pool: list[str]) -> None:
        self.url, self.models, self.pool = url, models, pool
        self.refs: dict[tuple, str] = {}  # (model id, search, sentence index) -> translation
        self.stats: dict[str, Any] = {"routes": {}, "codes": {}, "latency": {}}
        self.stats.update(lost=0, wrong=0)
        self.lock = threading.Lock()
        self.sent = 0

    def reference_all(self) -> None:
        client = Client(self.url)
        for model in self.models:
            for search, options in SEARCHES.items():
                for i, sentence in enumerate(self.pool if search != "sample" else self.pool[:10]):
                    body = {"sentences": [sentence], "model": model["id"], **options}
                    self.refs[(model["id"], search, i)] = translation(client, body)

    def record(self, kind: str, status: int, took: float, ok: bool, valid: bool) -> None:
        """One request's outcome: `valid` requests must get 200 and `ok` (their reference);
        an invalid one counts as wrong when not `ok` (its expected 4xx)."""
        with self.lock:
            self.stats["routes"][kind] = self.stats["routes"].get(kind, 0) + 1
            self.stats["codes"][str(status)] = self.stats["codes"].get(str(status), 0) + 1
            self.stats["latency"].setdefault(kind, []).append(took)
            if valid and status != 200:
                self.stats["lost"] += 1
            elif not ok:
                self.stats["wrong"] += 1

    def route(self, model: dict[str, Any]) -> dict[str, str]:
        """How a request names the model: by its pair where that routes to it, else by id."""
        if not self.routes_by_pair(model):
            return {"model": model["id"]}
        return {"src_lang": model["source_languages"][0], "tgt_lang": model["target_languages"][0]}

    def routes_by_pair(self, model: dict[str, Any]) -> bool:
        """Whether the model's first pair routes to it (no earlier model has that pair)."""
        src, tgt = model["source_languages"][:1], model["target_languages"][:1]
        if not (src and tgt):
            return False
        first = next(m for m in self.models
                     if src[0] in m["source_languages"] and tgt[0] in m["target_languages"])  # fmt: skip
        return first is model

    def one(self, rng: random.Random, conn: Client) -> None:
        """One request of a random kind, checked and recorded."""
        model = rng.choice(self.models)
        roll = rng.random()
        idx = rng.sample(range(len(self.pool)), rng.randint(1, 3))
        started = time.perf_counter()
        lt = self.routes_by_pair(model)  # LibreTranslate's requests name a pair
        kinds: list[tuple[float, Callable]] = [(0.47, self.ours)]
        kinds += [(0.82, self.libretranslate)] if lt else []
        kinds += [(0.92, self.bad), (1.0, self.hang_up)]
        request = next(fn for limit, fn in kinds if roll < limit)
        kind, status, ok, valid = request(rng, conn, model, idx, roll)
        self.record(kind, status, time.perf_counter() - started, ok, valid)

    def ours(self, rng: random.Random, conn: Client, model: dict, idx: list[int], roll: float):  # noqa: ANN201
        """Our API: greedy routed by pair (or id), beam 4 by id, seeded sampling by id."""
        mid = model["id"]
        search = "greedy" if roll < 0.25 else "beam" if roll < 0.40 else "sample"
        if search == "sample":
            idx = [rng.randrange(10)]  # a batch of its own
        body = {"sentences": [self.pool[i] for i in idx], **SEARCHES[search]}
        body.update(self.route(model) if search == "greedy" else {"model": mid})
        status, answer = conn.post("/translate", body)
        want = [self.refs[(mid, search, i)] for i in idx]
        kind = {"greedy": "ours greedy", "beam": "ours beam", "sample": "ours sampling"}[search]
        return kind, status, answer.get("translations") == want, True

    def libretranslate(self, rng: random.Random, conn: Client, model: dict, idx: list[int],
                       roll: float):  # noqa: ANN201  # fmt: skip
        """LibreTranslate's API: JSON (`q` a string or a list), a form, or `format: html`."""
        texts = [self.pool[i] for i in idx]
        greedy = [self.refs[(model["id"], "greedy", i)] for i in idx]
        pair = {"source": model["source_languages"][0], "target": model["target_languages"][0]}
        if roll < 0.62:
            many = len(texts) > 1
            status, answer = conn.post("/translate", {"q": texts if many else texts[0], **pair})
            return "LT json", status, answer.get("translatedText") == (greedy if many else greedy[0]), True  # fmt: skip
        if roll < 0.72:
            form = urlencode({"q": texts[0], **pair}).encode()
            status, answer = conn.post_raw("/translate", form, "application/x-www-form-urlencoded")
            return "LT form", status, answer.get("translatedText") == greedy[0], True
        status, answer = conn.post("/translate", {"q": _html(texts), **pair, "format": "html"})
        return "LT html", status, answer.get("translatedText") == _html(greedy), True

    def bad(self, rng: random.Random, conn: Client, model: dict, idx: list[int], roll: float):  # noqa: ANN201
        """A bad request: its 4xx and a JSON error, never a 5xx."""
        route, raw, content_type, expected = rng.choice(BAD_REQUESTS)
        status, answer = conn.post_raw(route, raw, content_type)
        return "bad request", status, status == expected and set(answer) == {"error"}, False

    def hang_up(self, rng: random.Random, conn: Client, model: dict, idx: list[int], roll: float):  # noqa: ANN201
        """A client that hangs up: half a body, or a whole request left unread."""
        parts = urlsplit(self.url)
        body = {"sentences": [self.pool[i] for i in idx], **self.route(model)}
        data = json.dumps(body).encode()
        head = (f"POST /translate HTTP/1.1\r\nHost: {parts.hostname}\r\nContent-Type: "
                f"application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode()  # fmt: skip
        with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
            sock.sendall(head + (data[: len(data) // 2] if rng.random() < 0.5 else data))
        return "disconnect", 0, True, False

    def client_loop(self, number: int, settings: SoakSettings, deadline: float) -> None:
        rng = random.Random(settings.seed * 1000 + number)
        conn = Client(self.url, timeout=120)
        while time.perf_counter() < deadline:
            with self.lock:
                if self.sent >= settings.max_requests:
                    return
                self.sent += 1
            try:
                self.one(rng, conn)
            except (OSError, ValueError) as e:  # no answer at all: lost
                conn = Client(self.url, timeout=120)
                self.record(f"failed {type(e).__name__}", 0, 0.0, False, True)


def soak_load(soak: Soak, settings: SoakSettings, pid: int, rss: dict) -> dict[str, Any]:
    """The clients' load until the deadline, sampling the server's RSS each second into
    `rss` (which holds its "start")."""
    start = time.perf_counter()
    args = (settings, start + settings.seconds)
    threads = [threading.Thread(target=soak.client_loop, args=(n, *args))
               for n in range(settings.clients)]  # fmt: skip
    for thread in threads:
        thread.start()
    samples: list[int] = []
    while any(t.is_alive() for t in threads):
        samples.append(rss_kib(pid))
        if "warm" not in rss and time.perf_counter() - start >= settings.warmup:
            rss["warm"] = samples[-1]
        time.sleep(1.0)
    for thread in threads:
        thread.join()
    rss.setdefault("warm", samples[0] if samples else rss["start"])
    rss["end"] = rss_kib(pid)
    rss["max"] = max(samples, default=rss["end"])
    return {"rss": rss, "seconds": time.perf_counter() - start}


def soak_report(soak: Soak, settings: SoakSettings, figures: dict[str, Any]) -> list[str]:
    """The soak's table: requests and latency per kind, status codes, RSS, lost and wrong."""
    stats, rss = soak.stats, figures["rss"]
    lines = [
        f"soak: {figures['seconds']:.0f} s, {settings.clients} clients, {len(soak.models)} "
        f"models, {sum(stats['routes'].values())} requests",
        "| request kind | requests | p50 ms | p99 ms |",
        "|---|---:|---:|---:|",
    ]
    answered: list[float] = []
    for kind in sorted(stats["routes"]):
        ms = [t * 1000 for t in stats["latency"].get(kind, [0.0])]
        answered += ms if kind != "disconnect" else []
        p50, p99 = statistics.median(ms or [0.0]), percentile(ms, 0.99)
        lines.append(f"| {kind} | {stats['routes'][kind]} | {p50:.0f} | {p99:.0f} |")
    if answered:
        p50, p99 = statistics.median(answered), percentile(answered, 0.99)
        lines.append(f"| all answered | {len(answered)} | {p50:.0f} | {p99:.0f} |")
    codes = ", ".join(f"{code}: {n}" for code, n in sorted(stats["codes"].items()))
    return lines + [
        f"status codes (0 = hung up / no answer): {codes}",
        f"RSS KiB: start {rss['start']}, after warm-up {rss['warm']}, max {rss['max']}, "
        f"end {rss['end']} (growth after warm-up {100 * figures['growth']:+.2f}%)",
        f"lost answers: {stats['lost']}, wrong or swapped answers: {stats['wrong']}, "
        f"serve.py exit status after SIGTERM: {figures['exit_status']}",
    ]


def run_soak(checkpoints: list[str], sentences: list[str], settings: SoakSettings,
             server_args: list[str], json_out: str | None) -> int:  # fmt: skip
    """A soak of `serve.py -c ...`: the served models, both APIs, greedy/beam/sampling, html,
    bad requests and client hang-ups at `settings.clients` clients; every valid answer checked
    against its request's reference (computed up front, one request at a time), every bad
    request against its 4xx; RSS sampled; SIGTERM at the end. Exit 0 only when no valid request
    was lost or answered wrongly, no 5xx came back, RSS grew < 5% after the warm-up and the
    server exited 0."""
    handle: list[subprocess.Popen] = []
    with started_server(checkpoints, ["--beam", "1", *server_args], handle) as url:
        process = handle[0]
        rss = {"start": rss_kib(process.pid)}  # the models loaded
        pool = sentences[: max(8, min(len(sentences), 60))]
        soak = Soak(url, Client(url).get("/models")["models"], pool)
        began = time.perf_counter()
        soak.reference_all()
        print(f"soak: {len(soak.refs)} references in {time.perf_counter() - began:.1f} s; "
              f"{len(soak.models)} models, {settings.clients} clients, {settings.seconds:.0f} s",
              file=sys.stderr, flush=True)  # fmt: skip
        figures = soak_load(soak, settings, process.pid, rss)
        process.send_signal(signal.SIGTERM)
        figures["exit_status"] = process.wait(timeout=300)
    figures["growth"] = (rss["end"] - rss["warm"]) / rss["warm"]
    print("\n".join(soak_report(soak, settings, figures)))
    fivexx = sum(n for code, n in soak.stats["codes"].items() if code.startswith("5"))
    if json_out:
        out = {k: v for k, v in soak.stats.items() if k != "latency"}
        out.update(rss=rss, exit_status=figures["exit_status"], seconds=figures["seconds"])
        Path(json_out).write_text(json.dumps({**out, "fivexx": fivexx}, indent=1))
    failed = soak.stats["lost"] or soak.stats["wrong"] or fivexx or figures["exit_status"]
    return 1 if failed or figures["growth"] >= 0.05 else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.load_server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    # fmt: off
    add("-c", "--checkpoint", action="append",
        help="run dir or .pt: start serve.py with it (needs no --url); repeat it to serve "
        "several models (each measured in turn, all served)")
    add("--url", help="a running server on the loopback (one mode: as it was started)")
    add("--input", default=str(ROOT.parent / "shared/data/multi30k/test2016.en"),
        help="sentences, one per line (default: Multi30k's test2016.en beside the repository)")
    add("--sentences", type=int, default=200, help="sentences per level (default: 200)")
    add("--clients", default="1,8,32", help="client counts (default: 1,8,32)")
    add("--per-request", type=int, default=1, help="sentences per request (default: 1)")
    add("--modes", default="batching,no-batching", help="with -c: server modes to compare (batching, no-batching, in-process)")
    add("--beam", default="1", help="beam_size of every request; a comma list measures each (default: 1)")
    add("--offline", action="store_true", help="with -c: also time offline translate.py (see above)")
    add("--max-seconds", type=float, default=120.0, help="time limit per level (default: 120)")
    add("--no-warm", dest="warm", action="store_false", help="no untimed pass before the levels")
    add("--server-args", default="", help="extra serve.py flags, space-separated")
    add("--precision", choices=("fp32", "bf16"), help="with -c: serve.py (levels, soak) and offline translate.py decode in it (default: the run's)")
    add("--json", help="also write the levels (or the soak's figures) to this JSON file")
    add("--soak", type=float, metavar="SECONDS",
        help="instead of the levels: a soak of this long (at most 3600) at the last --clients "
        "count, mixing the served models, both APIs, greedy/beam/sampling, html, bad requests "
        "and client disconnects; then SIGTERM (see run_soak)")
    add("--warmup", type=float, default=60.0, help="soak: seconds before the RSS baseline")
    add("--max-requests", type=int, default=1_000_000, help="soak: stop after this many")
    add("--seed", type=int, default=1, help="soak: the request mix's random seed")
    # fmt: on
    return parser


def load_sentences(args: argparse.Namespace) -> list[str]:
    path = Path(args.input)
    if not path.is_file():
        raise SystemExit(f"load_server: {path} not found; pass --input FILE")
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if line][: args.sentences]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.url is None) == (args.checkpoint is None):
        parser.error("pass either -c RUN_DIR (start the server) or --url (use a running one)")
    if (args.offline or args.precision) and args.url:
        parser.error("--offline and --precision start serve.py and translate.py: pass -c, no --url")
    if args.url is not None and urlsplit(args.url).hostname not in LOOPBACK:
        parser.error(f"--url {args.url}: loopback only (127.0.0.1, localhost)")
    sentences = load_sentences(args)
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    if not args.soak:
        return run_levels(args, sentences)
    if args.url or not args.checkpoint:
        parser.error("--soak starts serve.py itself: pass -c RUN_DIR (repeatable), no --url")
    settings = SoakSettings(
        seconds=min(args.soak, 3600.0), clients=int(args.clients.split(",")[-1]),
        warmup=args.warmup, max_requests=args.max_requests, seed=args.seed,
    )  # fmt: skip
    server_args = args.server_args.split() + (["--precision", args.precision] if args.precision else [])  # fmt: skip
    return run_soak(args.checkpoint, sentences, settings, server_args, args.json)


if __name__ == "__main__":
    sys.exit(main())

"""Load test for serve.py: throughput and latency per client count and server mode (with -c:
`batching`, `no-batching`), against offline translate.py with `--offline`; exit status 1 when an answer is not its request's reference
(docs/benchmarks.md, "Serving under load"). The soak is the slow test tests/test_soak.py.

    python -m benchmarks.load_server -c RUN_DIR --beam 5 --sentences 200
    python -m benchmarks.load_server --url http://127.0.0.1:8000 --input FILE
    OMP_NUM_THREADS=1 python -m benchmarks.load_server -c RUN_DIR --beam 1,5 --offline \
        --modes batching,batching,batching             # server against offline translate.py
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import queue
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
from urllib.parse import urlsplit

from attnmt.common.errors import UserError
from benchmarks import harness

ROOT = harness.ROOT
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
    """serve.py on a free loopback port, its URL; SIGTERM at the end (it must exit 0)."""
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
    counts = dict.fromkeys(("sentences", "mismatched", "swapped", "errors"), 0)
    lock = threading.Lock()
    before, start_time = Client(url).get("/health")["batches"], time.perf_counter()
    deadline = start_time + max_seconds

    def client_loop() -> None:
        client = Client(url)
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
    [thread.start() for thread in threads], [thread.join() for thread in threads]
    seconds, ms = time.perf_counter() - start_time, [t * 1000 for t in latencies]
    batches = Client(url).get("/health")["batches"] - before
    return Level(options.get("model", ""), mode, clients, len(latencies), counts["sentences"], seconds,
                 statistics.median(ms or [0.0]), percentile(ms, 0.99), counts["mismatched"],
                 counts["swapped"], counts["errors"], batches, options["beam_size"])  # fmt: skip


def table(levels: list[Level]) -> str:
    head = ["model", "mode", "clients", "requests", "sentences/s", "p50 ms", "p99 ms"]
    rows = [[lv.model or "default", lv.mode, lv.clients, lv.requests,
             f"{lv.sentences / lv.seconds if lv.seconds else 0.0:.1f}", f"{lv.p50_ms:.0f}",
             f"{lv.p99_ms:.0f}", lv.batches, f"{lv.mismatched} ({lv.swapped})", lv.errors]
            for lv in levels]  # fmt: skip
    head += ["model calls", "mismatched (swapped)", "errors"]
    return "\n".join(harness.table(head, rows)) + "\n"


OFFLINE = """import statistics, sys, time
from attnmt.common.runtime import autocast
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.stream import translator_of
from attnmt.engine.runs import RuntimeOptions, load_run
checkpoint, beam, precision = sys.argv[1], int(sys.argv[2]), sys.argv[3]
given = frozenset({"beam_size"} | ({"precision"} if precision else set()))
runtime = RuntimeOptions(precision=precision or "fp32", given=given, prog="translate.py")
loaded = load_run(runtime, [checkpoint], SearchConfig(beam_size=beam))
translator, lines, took = translator_of(loaded), sys.stdin.read().splitlines(), []
with autocast(loaded.device, loaded.precision):
    translator.translate(lines[:8])
    for _ in range(3):
        start = time.perf_counter()
        translator.translate(lines)
        took.append(time.perf_counter() - start)
print(len(lines) / statistics.median(took))"""


def offline(checkpoint: str, beam: int, sentences: list[str], precision: str = "") -> float:
    """Offline translate.py's sentences/s (median of 3 runs; "" precision: the run's)."""
    cmd = [sys.executable, "-c", OFFLINE, checkpoint, str(beam), precision or ""]
    done = subprocess.run(cmd, input="\n".join(sentences), cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"offline translate.py failed: {done.stderr[-2000:]}")
    return float(done.stdout.split()[-1])


def versus_offline(levels: list[Level]) -> str:
    """Per mode, beam and client count, medians over the rounds: the server's sentences/s,
    offline translate.py's, their ratio (per round), p50 and p99 latency."""
    rounds: dict[tuple[str, int, int], list[tuple[float, ...]]] = {}
    for lv in levels:
        rate = lv.sentences / lv.seconds
        figures = (rate, lv.offline, rate / lv.offline, lv.p50_ms, lv.p99_ms)
        rounds.setdefault((lv.mode.split(",")[0], lv.beam, lv.clients), []).append(figures)
    rows = []
    for key, figures in sorted(rounds.items()):
        m = [statistics.median(column) for column in zip(*figures, strict=True)]
        rows.append([*key, f"{m[0]:.1f}", f"{m[1]:.1f}", f"{m[2]:.2f}", f"{m[3]:.0f}", f"{m[4]:.0f}", len(figures)])  # fmt: skip
    head = ["mode", "beam", "clients", "server sent/s", "offline sent/s", "server / offline"]
    return "\n".join(harness.table([*head, "p50 ms", "p99 ms", "rounds"], rows)) + "\n"


def run_levels(args: argparse.Namespace, sentences: list[str]) -> tuple[list[dict], int]:
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
            server = started_server(args.checkpoint, flags)
        with server as url:
            ids = [m["id"] for m in Client(url).get("/models")["models"]]
            for model, beam in [(m, b) for m in (ids if len(ids) > 1 else [""]) for b in beams]:
                options: dict[str, Any] = {"beam_size": beam, **({"model": model} if model else {})}  # fmt: skip
                if (model, beam) not in refs:
                    began, client = time.perf_counter(), Client(url)
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
    print(f"{len(sentences)} sentences per level, {args.per_request} per request, beam {args.beam}; code: {harness.code_under_test()}")  # fmt: skip
    print(table(levels), end="")
    if args.offline:
        print("\nserver against offline translate.py (medians over rounds)\n" + versus_offline(levels), end="")  # fmt: skip
    bad = unchecked + sum(lv.mismatched + lv.errors for lv in levels)
    if bad:
        print(f"load_server: {bad} mismatched or failed answers", file=sys.stderr)
    return [lv._asdict() for lv in levels], 1 if bad else 0


def add_flags(add: Callable) -> None:
    # fmt: off
    add("-c", "--checkpoint", action="append",
        help="run dir or .pt: start serve.py with it; repeated: several models, each measured")
    add("--url", help="a running server on the loopback (one mode: as it was started)")
    add("--input", default=str(harness.DATA / "test2016.en"),
        help="sentences, one per line (default: Multi30k's test2016.en beside the repository)")
    add("--sentences", type=int, default=200, help="sentences per level (default: 200)")
    add("--clients", default="1,8,32", help="client counts (default: 1,8,32)")
    add("--per-request", type=int, default=1, help="sentences per request (default: 1)")
    add("--modes", default="batching,no-batching", help="with -c: batching, no-batching")
    add("--beam", default="1", help="beam_size of every request; a comma list measures each")
    add("--offline", action="store_true", help="with -c: also time offline translate.py")
    add("--max-seconds", type=float, default=120.0, help="time limit per level (default: 120)")
    add("--no-warm", dest="warm", action="store_false", help="no untimed pass before the levels")
    add("--server-args", default="", help="extra serve.py flags, space-separated")
    add("--precision", choices=("fp32", "bf16"), help="with -c: serve.py and offline decode in it")
    # fmt: on


def run(args: argparse.Namespace) -> tuple[list[dict], int]:
    if (args.url is None) == (args.checkpoint is None):
        raise UserError("pass either -c RUN_DIR (start the server) or --url (use a running one)")
    if (args.offline or args.precision) and args.url:
        raise UserError("--offline and --precision start serve.py and translate.py: pass -c, no --url")  # fmt: skip
    if args.url is not None and urlsplit(args.url).hostname not in LOOPBACK:
        raise UserError(f"--url {args.url}: loopback only (127.0.0.1, localhost)")
    if bad := [m for m in args.modes.split(",") if m not in ("batching", "no-batching")]:
        raise UserError(f"--modes takes batching and no-batching, got {','.join(bad)}")
    path = Path(args.input)
    if not path.is_file():
        raise UserError(f"{path} not found; pass --input FILE")
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    return run_levels(args, [line for line in lines if line][: args.sentences])


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))

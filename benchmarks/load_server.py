"""Load test for serve.py: throughput and latency at 1, 8 and 32 concurrent clients, batching
on against off, and a check that every answer belongs to its request.

    python -m benchmarks.load_server -c RUN_DIR                     # test2016, greedy
    python -m benchmarks.load_server -c RUN_DIR --beam 5 --sentences 200
    python -m benchmarks.load_server --url http://127.0.0.1:8000 --input FILE

Without --url it starts `serve.py` itself on a free loopback port, once per mode (`batching`:
the defaults; `no-batching`: `--no-batching`). The reference translation of every sentence is
computed once up front, one sentence per request and one request at a time; then, at each
client count, the clients send all the sentences (`--per-request` per request) as fast as
answers come back. An answer that differs from its sentence's reference is counted as a
mismatch, and as a swap when it equals another sentence's reference (a lost, duplicated or
swapped translation); the exit status is 1 when any mismatch is found. Bounded: at most
`--sentences` sentences per level and `--max-seconds` per level; loopback only.
"""

from __future__ import annotations

import argparse
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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class Client:
    """One keep-alive HTTP connection to the server (one per client thread)."""

    def __init__(self, url: str, timeout: float = 300.0) -> None:
        parts = urlsplit(url)
        self.host, self.port, self.timeout = parts.hostname, parts.port or 80, timeout
        self.conn: http.client.HTTPConnection | None = None

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        data = json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json"}
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

    @property
    def throughput(self) -> float:
        return self.sentences / self.seconds if self.seconds else 0.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
def started_server(checkpoint: str, extra: list[str]) -> Iterator[str]:
    """serve.py on a free loopback port; its URL. Stopped with SIGTERM (it must exit 0)."""
    port = free_port()
    cmd = [sys.executable, str(ROOT / "serve.py"), "-c", checkpoint, "--port", str(port), *extra]
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=log)
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


def references(url: str, sentences: list[str], options: dict[str, Any]) -> list[str]:
    """Each sentence's translation alone: one sentence per request, one request at a time."""
    client, found = Client(url), []
    for sentence in sentences:
        status, answer = client.post("/translate", {"sentences": [sentence], **options})
        if status != 200:
            raise RuntimeError(f"reference request failed ({status}): {answer}")
        found.append(answer["translations"][0])
    return found


def run_level(
    url: str,
    mode: str,
    clients: int,
    sentences: list[str],
    refs: list[str],
    options: dict[str, Any],
    per_request: int,
    max_seconds: float,
) -> Level:
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
    before = Client(url).get("/health")["batches"]
    start_time = time.perf_counter()
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
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start_time
    batches = Client(url).get("/health")["batches"] - before
    ms = sorted(t * 1000 for t in latencies) or [0.0]
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return Level(
        mode, clients, len(latencies), counts["sentences"], seconds, statistics.median(ms), p99,
        counts["mismatched"], counts["swapped"], counts["errors"], batches,
    )  # fmt: skip


def load_sentences(args: argparse.Namespace) -> list[str]:
    if args.input is not None:
        path = Path(args.input)
    else:
        path = Path(args.data_dir) / f"{args.split}.{args.src_lang}"
    if not path.is_file():
        raise SystemExit(f"load_server: {path} not found; pass --input FILE or --data-dir")
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if line][: args.sentences]


def table(levels: list[Level]) -> str:
    head = (
        "| mode | clients | requests | sentences/s | p50 ms | p99 ms | model calls | "
        "mismatched (swapped) | errors |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    return head + "".join(
        f"| {lv.mode} | {lv.clients} | {lv.requests} | {lv.throughput:.1f} | {lv.p50_ms:.0f} | "
        f"{lv.p99_ms:.0f} | {lv.batches} | {lv.mismatched} ({lv.swapped}) | {lv.errors} |\n"
        for lv in levels
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.load_server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("-c", "--checkpoint", help="run dir or .pt: start serve.py with it (needs no --url)")
    add("--url", help="a running server on the loopback (one mode: as it was started)")
    add("--input", help="sentences, one per line (default: --data-dir/SPLIT.SRC_LANG)")
    add("--data-dir", default=str(ROOT.parent / "shared/data/multi30k"))
    add("--split", default="test2016")
    add("--src-lang", default="en")
    add("--sentences", type=int, default=200, help="sentences per level (default: 200)")
    add("--clients", default="1,8,32", help="client counts (default: 1,8,32)")
    add("--per-request", type=int, default=1, help="sentences per request (default: 1)")
    add("--modes", default="batching,no-batching", help="with -c: server modes to compare")
    add("--beam", type=int, default=1, help="beam_size of every request (default: 1)")
    add("--max-seconds", type=float, default=120.0, help="time limit per level (default: 120)")
    add("--server-args", default="", help="extra serve.py flags, space-separated")
    add("--json", help="also write the levels to this JSON file")
    args = parser.parse_args(argv)
    if (args.url is None) == (args.checkpoint is None):
        parser.error("pass either -c RUN_DIR (start the server) or --url (use a running one)")
    if args.url is not None and urlsplit(args.url).hostname not in LOOPBACK:
        parser.error(f"--url {args.url}: loopback only (127.0.0.1, localhost)")
    sentences = load_sentences(args)
    clients = [int(c) for c in args.clients.split(",")]
    options = {"beam_size": args.beam}
    modes = ["as started"] if args.url else args.modes.split(",")
    levels: list[Level] = []
    refs: list[str] | None = None
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    for mode in modes:
        if args.url:
            server: Any = nullserver(args.url)
        else:
            flags = args.server_args.split() + (["--no-batching"] if mode == "no-batching" else [])
            server = started_server(args.checkpoint, flags)
        with server as url:
            if refs is None:
                began = time.perf_counter()
                refs = references(url, sentences, options)
                print(f"references: {len(refs)} sentences, one at a time, in "
                      f"{time.perf_counter() - began:.1f} s", file=sys.stderr)  # fmt: skip
            for n in clients:
                level = run_level(
                    url, mode, n, sentences, refs, options, args.per_request, args.max_seconds
                )
                levels.append(level)
                print(table([level]).splitlines()[-1], file=sys.stderr, flush=True)
    print(f"{len(sentences)} sentences per level, {args.per_request} per request, "
          f"beam {args.beam}")  # fmt: skip
    print(table(levels), end="")
    if args.json:
        Path(args.json).write_text(json.dumps([lv._asdict() for lv in levels], indent=1))
    bad = sum(lv.mismatched + lv.errors for lv in levels)
    if bad:
        print(f"load_server: {bad} mismatched or failed answers", file=sys.stderr)
    return 1 if bad else 0


@contextmanager
def nullserver(url: str) -> Iterator[str]:
    wait_healthy(url, None, timeout=30)
    yield url


if __name__ == "__main__":
    sys.exit(main())

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
def started_server(
    checkpoints: list[str], extra: list[str], handle: list | None = None
) -> Iterator[str]:
    """serve.py (one `-c` per checkpoint) on a free loopback port; its URL. Stopped with
    SIGTERM (it must exit 0). `handle`, when given, receives the process."""
    port = free_port()
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
        options.get("model", ""), mode, clients, len(latencies), counts["sentences"], seconds, statistics.median(ms), p99,
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
        "| model | mode | clients | requests | sentences/s | p50 ms | p99 ms | model calls | "
        "mismatched (swapped) | errors |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    return head + "".join(
        f"| {lv.model or 'default'} | {lv.mode} | {lv.clients} | {lv.requests} | {lv.throughput:.1f} | {lv.p50_ms:.0f} | "
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
    add(
        "-c",
        "--checkpoint",
        action="append",
        help="run dir or .pt: start serve.py with it (needs no --url); repeat it to serve "
        "several models (each measured in turn, all served)",
    )
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
    add("--json", help="also write the levels (or the soak's figures) to this JSON file")
    add(
        "--soak",
        type=float,
        metavar="SECONDS",
        help="instead of the levels: a soak of this long (at most 3600) at the last --clients "
        "count, mixing the served models, both APIs, greedy/beam/sampling, html, bad requests "
        "and client disconnects; then SIGTERM (see run_soak)",
    )
    add("--warmup", type=float, default=60.0, help="soak: seconds before the RSS baseline")
    add("--max-requests", type=int, default=1_000_000, help="soak: stop after this many")
    add("--seed", type=int, default=1, help="soak: the request mix's random seed")
    args = parser.parse_args(argv)
    if (args.url is None) == (args.checkpoint is None):
        parser.error("pass either -c RUN_DIR (start the server) or --url (use a running one)")
    if args.url is not None and urlsplit(args.url).hostname not in LOOPBACK:
        parser.error(f"--url {args.url}: loopback only (127.0.0.1, localhost)")
    sentences = load_sentences(args)
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    if args.soak:
        if args.url or not args.checkpoint:
            parser.error("--soak starts serve.py itself: pass -c RUN_DIR (repeatable), no --url")
        settings = SoakSettings(
            seconds=min(args.soak, 3600.0), clients=int(args.clients.split(",")[-1]),
            warmup=args.warmup, max_requests=args.max_requests, seed=args.seed,
        )  # fmt: skip
        return run_soak(args.checkpoint, sentences, settings, args.server_args.split(), args.json)
    clients = [int(c) for c in args.clients.split(",")]
    modes = ["as started"] if args.url else args.modes.split(",")
    levels: list[Level] = []
    refs: dict[str, list[str]] = {}
    for mode in modes:
        if args.url:
            server: Any = nullserver(args.url)
        else:
            flags = args.server_args.split() + (["--no-batching"] if mode == "no-batching" else [])
            server = started_server(args.checkpoint, flags)
        with server as url:
            ids = [m["id"] for m in Client(url).get("/models")["models"]]
            for model in ids if len(ids) > 1 else [""]:
                options: dict[str, Any] = {"beam_size": args.beam}
                if model:
                    options["model"] = model
                if model not in refs:
                    began = time.perf_counter()
                    refs[model] = references(url, sentences, options)
                    print(f"references {model or ''}: {len(sentences)} sentences, one at a time, "
                          f"in {time.perf_counter() - began:.1f} s", file=sys.stderr)  # fmt: skip
                for n in clients:
                    level = run_level(
                        url, mode, n, sentences, refs[model], options, args.per_request,
                        args.max_seconds,
                    )  # fmt: skip
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


# ---------------------------------------------------------------- the soak


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


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


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


def run_soak(
    checkpoints: list[str],
    sentences: list[str],
    settings: SoakSettings,
    server_args: list[str],
    json_out: str | None,
) -> int:
    """A soak of `serve.py -c ...` (see `main`'s --soak): every valid answer is checked against
    its request's reference (computed up front, one request at a time), bad requests must get
    their 4xx, some clients hang up mid-request; RSS is sampled; SIGTERM at the end. Exit 0
    only when no valid request was lost or answered wrongly, no 5xx came back, RSS grew < 5%
    after the warm-up and the server exited 0."""
    import random
    import signal

    handle: list[subprocess.Popen] = []
    stats: dict[str, Any] = {"routes": {}, "codes": {}, "latency": {}, "lost": 0, "wrong": 0}
    lock = threading.Lock()
    rss: dict[str, int] = {}
    with started_server(checkpoints, ["--beam", "1", *server_args], handle) as url:
        process = handle[0]
        rss["start"] = rss_kib(process.pid)
        models = Client(url).get("/models")["models"]
        pool = sentences[: max(8, min(len(sentences), 60))]
        refs: dict[tuple, str] = {}  # (model id, kind, sentence index) -> its translation
        client = Client(url)
        began = time.perf_counter()
        for model in models:
            for kind, options in [
                ("greedy", {"beam_size": 1}),
                ("beam", {"beam_size": 4}),
                ("sample", {"sampling": True, "seed": 7, "topk": 10}),
            ]:
                for i, sentence in enumerate(pool if kind != "sample" else pool[:10]):
                    body = {"sentences": [sentence], "model": model["id"], **options}
                    status, answer = client.post("/translate", body)
                    if status != 200:
                        raise RuntimeError(f"reference request failed ({status}): {answer}")
                    refs[(model["id"], kind, i)] = answer["translations"][0]
        print(f"soak: {len(refs)} references in {time.perf_counter() - began:.1f} s; "
              f"{len(models)} models, {settings.clients} clients, {settings.seconds:.0f} s",
              file=sys.stderr, flush=True)  # fmt: skip
        host, port = urlsplit(url).hostname, urlsplit(url).port
        start = time.perf_counter()
        deadline = start + settings.seconds
        sent = [0]

        def record(kind: str, status: int, took: float, ok: bool, valid: bool) -> None:
            with lock:
                stats["routes"][kind] = stats["routes"].get(kind, 0) + 1
                stats["codes"][str(status)] = stats["codes"].get(str(status), 0) + 1
                stats["latency"].setdefault(kind, []).append(took)
                if valid and status != 200:
                    stats["lost"] += 1
                elif valid and not ok:
                    stats["wrong"] += 1

        def unique(model: dict[str, Any]) -> bool:
            """Whether the model's first pair routes to it (no earlier model has it)."""
            src, tgt = model["source_languages"][:1], model["target_languages"][:1]
            first = next(
                m for m in models
                if src and tgt and src[0] in m["source_languages"]
                and tgt[0] in m["target_languages"]
            ) if src and tgt else None  # fmt: skip
            return first is model

        def one(rng: random.Random, conn: Client) -> None:
            model = rng.choice(models)
            mid, src, tgt = model["id"], model["source_languages"], model["target_languages"]
            pair = {"src_lang": src[0], "tgt_lang": tgt[0]} if unique(model) else {"model": mid}
            roll = rng.random()
            idx = rng.sample(range(len(pool)), rng.randint(1, 3))
            texts = [pool[i] for i in idx]
            greedy = [refs[(mid, "greedy", i)] for i in idx]
            sent_at = time.perf_counter()
            if roll < 0.25:  # ours, greedy, routed by pair
                status, answer = conn.post("/translate", {"sentences": texts, **pair})
                ok = answer.get("translations") == greedy
                record("ours greedy", status, time.perf_counter() - sent_at, ok, True)
            elif roll < 0.40:  # ours, beam 4, by model id
                body = {"sentences": texts, "model": mid, "beam_size": 4}
                status, answer = conn.post("/translate", body)
                ok = answer.get("translations") == [refs[(mid, "beam", i)] for i in idx]
                record("ours beam", status, time.perf_counter() - sent_at, ok, True)
            elif roll < 0.47:  # ours, sampling (a batch of its own)
                i = rng.randrange(10)
                body = {
                    "sentences": [pool[i]],
                    "model": mid,
                    "sampling": True,
                    "seed": 7,
                    "topk": 10,
                }
                status, answer = conn.post("/translate", body)
                ok = answer.get("translations") == [refs[(mid, "sample", i)]]
                record("ours sampling", status, time.perf_counter() - sent_at, ok, True)
            elif roll < 0.62 and unique(model):  # LibreTranslate JSON, q a string or a list
                many = len(texts) > 1
                body = {"q": texts if many else texts[0], "source": src[0], "target": tgt[0]}
                status, answer = conn.post("/translate", body)
                ok = answer.get("translatedText") == (greedy if many else greedy[0])
                record("LT json", status, time.perf_counter() - sent_at, ok, True)
            elif roll < 0.72 and unique(model):  # LibreTranslate form
                from urllib.parse import urlencode

                form = urlencode({"q": texts[0], "source": src[0], "target": tgt[0]}).encode()
                status, answer = conn.post_raw(
                    "/translate", form, "application/x-www-form-urlencoded"
                )
                ok = answer.get("translatedText") == greedy[0]
                record("LT form", status, time.perf_counter() - sent_at, ok, True)
            elif roll < 0.82 and unique(model):  # LibreTranslate html
                html = (
                    "<p>"
                    + " <b>".join(_escape(t) for t in texts)
                    + "</b>" * (len(texts) - 1)
                    + "</p>"
                )
                want = (
                    "<p>"
                    + " <b>".join(_escape(t) for t in greedy)
                    + "</b>" * (len(texts) - 1)
                    + "</p>"
                )
                body = {"q": html, "source": src[0], "target": tgt[0], "format": "html"}
                status, answer = conn.post("/translate", body)
                ok = answer.get("translatedText") == want
                record("LT html", status, time.perf_counter() - sent_at, ok, True)
            elif roll < 0.92:  # a bad request: its 4xx, never a 5xx
                route, raw, kind, expected = rng.choice(BAD_REQUESTS)
                status, answer = conn.post_raw(route, raw, kind)
                ok = status == expected and set(answer) == {"error"}
                record("bad request", status, time.perf_counter() - sent_at, ok, False)
                if not ok:
                    with lock:
                        stats["wrong"] += 1
            else:  # a client that hangs up: half a body, or a whole request unread
                with socket.create_connection((host, port), timeout=30) as sock:
                    data = json.dumps({"sentences": texts, **pair}).encode()
                    head = (f"POST /translate HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
                            f"application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode()  # fmt: skip
                    sock.sendall(head + (data[: len(data) // 2] if rng.random() < 0.5 else data))
                record("disconnect", 0, time.perf_counter() - sent_at, True, False)

        def loop(number: int) -> None:
            rng = random.Random(settings.seed * 1000 + number)
            conn = Client(url, timeout=120)
            while time.perf_counter() < deadline:
                with lock:
                    if sent[0] >= settings.max_requests:
                        return
                    sent[0] += 1
                try:
                    one(rng, conn)
                except (OSError, ValueError) as e:  # no answer at all: lost
                    conn = Client(url, timeout=120)
                    record(f"failed {type(e).__name__}", 0, 0.0, False, True)

        threads = [threading.Thread(target=loop, args=(n,)) for n in range(settings.clients)]
        for thread in threads:
            thread.start()
        samples: list[tuple[float, int]] = []
        while any(t.is_alive() for t in threads):
            now = time.perf_counter() - start
            samples.append((now, rss_kib(process.pid)))
            if "warm" not in rss and now >= settings.warmup:
                rss["warm"] = samples[-1][1]
            time.sleep(1.0)
        for thread in threads:
            thread.join()
        rss.setdefault("warm", samples[0][1] if samples else rss["start"])
        rss["end"] = rss_kib(process.pid)
        rss["max"] = max(kib for _, kib in samples) if samples else rss["end"]
        seconds = time.perf_counter() - start
        process.send_signal(signal.SIGTERM)
        status = process.wait(timeout=300)
    growth = (rss["end"] - rss["warm"]) / rss["warm"]
    all_ms = sorted(
        t * 1000 for kind, ts in stats["latency"].items() for t in ts if kind != "disconnect"
    )
    lines = [
        f"soak: {seconds:.0f} s, {settings.clients} clients, {len(models)} models, "
        f"{sum(stats['routes'].values())} requests",
        "| request kind | requests | p50 ms | p99 ms |",
        "|---|---:|---:|---:|",
    ]
    for kind in sorted(stats["routes"]):
        ms = sorted(t * 1000 for t in stats["latency"].get(kind, [0.0])) or [0.0]
        p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
        lines.append(
            f"| {kind} | {stats['routes'][kind]} | {statistics.median(ms):.0f} | {p99:.0f} |"
        )
    if all_ms:
        p99 = all_ms[min(len(all_ms) - 1, round(0.99 * (len(all_ms) - 1)))]
        lines.append(
            f"| all answered | {len(all_ms)} | {statistics.median(all_ms):.0f} | {p99:.0f} |"
        )
    codes = ", ".join(f"{code}: {n}" for code, n in sorted(stats["codes"].items()))
    lines += [
        f"status codes (0 = hung up / no answer): {codes}",
        f"RSS KiB: start {rss['start']}, after warm-up {rss['warm']}, max {rss['max']}, "
        f"end {rss['end']} (growth after warm-up {100 * growth:+.2f}%)",
        f"lost answers: {stats['lost']}, wrong or swapped answers: {stats['wrong']}, "
        f"serve.py exit status after SIGTERM: {status}",
    ]
    print("\n".join(lines))
    fivexx = sum(n for code, n in stats["codes"].items() if code.startswith("5"))
    if json_out:
        figures = {k: v for k, v in stats.items() if k != "latency"}
        figures.update(rss=rss, exit_status=status, seconds=seconds, fivexx=fivexx)
        Path(json_out).write_text(json.dumps(figures, indent=1))
    bad = stats["lost"] or stats["wrong"] or fivexx or growth >= 0.05 or status != 0
    return 1 if bad else 0


@contextmanager
def nullserver(url: str) -> Iterator[str]:
    wait_healthy(url, None, timeout=30)
    yield url


if __name__ == "__main__":
    sys.exit(main())

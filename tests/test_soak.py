"""The soak: serve.py under a mixed load for a while, every answer checked, then SIGTERM.

Short (20 s, 8 clients, the two tiny models of tests/test_serve_api.py) in the slow tests; the
long soak on real runs is the same test, pointed at them by the environment:

    ATTNMT_SOAK_RUNS=RUN_A,RUN_B ATTNMT_SOAK_SECONDS=600 ATTNMT_SOAK_CLIENTS=32 \
        python -m pytest -m slow tests/test_soak.py -s

(`ATTNMT_SOAK_INPUT`: the sentences, default Multi30k's test2016.en beside the repository;
`ATTNMT_SOAK_ARGS`: extra serve.py flags, e.g. `--precision bf16`; `ATTNMT_SOAK_WARMUP`:
seconds before the RSS baseline, default 60.) It prints requests and p50/p99 latency per
request kind, the status codes, RSS and the lost and wrong answers.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlencode, urlsplit

import pytest

from benchmarks.load_server import Client, percentile, started_server, translation
from tests.helpers_decoding import PAIRS
from tests.test_serve_api import make_run

ROOT = Path(__file__).resolve().parents[1]


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
             server_args: list[str]) -> dict[str, Any]:  # fmt: skip
    """A soak of `serve.py -c ...`: the served models, both APIs, greedy/beam/sampling, html,
    bad requests and client hang-ups at `settings.clients` clients; every valid answer checked
    against its request's reference (computed up front, one request at a time), every bad
    request against its 4xx; RSS sampled; SIGTERM at the end. The figures: lost and wrong
    answers, 5xx, RSS growth after the warm-up and serve.py's exit status."""
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
    out = {k: v for k, v in soak.stats.items() if k != "latency"}
    fivexx = sum(n for code, n in soak.stats["codes"].items() if code.startswith("5"))
    return {**out, **figures, "fivexx": fivexx}


@pytest.mark.slow
def test_a_soak_loses_no_answer_and_ends_with_exit_0(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both APIs, greedy/beam/sampling, html, bad requests (each its own 4xx), disconnects;
    every valid answer its reference, no 5xx, RSS grows < 5% after the warm-up, exit 0."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    named = os.environ.get("ATTNMT_SOAK_RUNS")
    if named:
        runs = named.split(",")
        default = ROOT.parent / "shared" / "data" / "multi30k" / "test2016.en"
        text = Path(os.environ.get("ATTNMT_SOAK_INPUT", default)).read_text(encoding="utf-8")
        sentences = [line.strip() for line in text.splitlines() if line.strip()]
    else:
        base = tmp_path_factory.mktemp("soak")
        runs = [str(make_run(base / "de-en", "de", "en", 2)), str(make_run(base / "en-de", "en", "de", 5))]  # fmt: skip
        sentences = [src for src, _ in PAIRS]
    settings = SoakSettings(
        seconds=min(float(os.environ.get("ATTNMT_SOAK_SECONDS", 20)), 3600.0),
        clients=int(os.environ.get("ATTNMT_SOAK_CLIENTS", 8)),
        warmup=float(os.environ.get("ATTNMT_SOAK_WARMUP", 60 if named else 5)),
        max_requests=1_000_000, seed=1,
    )  # fmt: skip
    figures = run_soak(runs, sentences, settings, os.environ.get("ATTNMT_SOAK_ARGS", "").split())
    (tmp_path_factory.getbasetemp() / "soak.json").write_text(json.dumps(figures, indent=1))
    lost = (figures["lost"], figures["wrong"], figures["fivexx"], figures["exit_status"])
    assert lost == (0, 0, 0, 0), figures
    assert figures["growth"] < 0.05, figures["rss"]
    kinds = set(figures["routes"])
    assert {"ours greedy", "ours beam", "LT json", "LT html", "bad request"} <= kinds, kinds

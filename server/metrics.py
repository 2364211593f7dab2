"""Prometheus metrics of the server (`GET /metrics`, text format 0.0.4, `prometheus_client`).

Names (all with the prefix `attnmt_`):
- `http_requests_total{route, method, status}` and `http_request_duration_seconds{route}`
  (histogram), every request; `route` is the route's path (a route with a parameter: its
  template, `/download_file/{name}`), or `other` for unknown paths (so that random paths
  cannot grow the label set);
- `translate_requests_total{model, api}`: translation requests routed to a model (`api`:
  `attnmt` or `libretranslate`);
- `batch_sentences{model}` (histogram): sentences per model call; `batch_duration_seconds{model}`;
- `queue_depth{model}`: requests sent to the model and not yet answered (read at scrape time);
- `in_flight`: requests received and not yet answered;
- `sentences_translated_total{model}`, `tokens_translated_total{model, side}` (`side`:
  `source` or `target` subwords, the target's best hypothesis without EOS).
Every server has its own registry, so that several apps in one process do not clash.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import generate_latest

PREFIX = "attnmt"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
METHODS = {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"}
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class Metrics:
    """The server's metrics; `queues` maps each model id to its queue length."""

    def __init__(self, queues: dict[str, Callable[[], int]], in_flight: Callable[[], int]):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            f"{PREFIX}_http_requests", "HTTP requests", ["route", "method", "status"], registry=r
        )
        self.latency = Histogram(
            f"{PREFIX}_http_request_duration_seconds",
            "time from the request's arrival to its response's start",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.routed = Counter(
            f"{PREFIX}_translate_requests", "translation requests", ["model", "api"], registry=r
        )
        self.batch_sentences = Histogram(
            f"{PREFIX}_batch_sentences",
            "sentences per model call",
            ["model"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.batch_seconds = Histogram(
            f"{PREFIX}_batch_duration_seconds",
            "time of one model call",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.sentences = Counter(
            f"{PREFIX}_sentences_translated", "sentences translated", ["model"], registry=r
        )
        self.tokens = Counter(
            f"{PREFIX}_tokens_translated",
            "subwords translated (source read, target written)",
            ["model", "side"],
            registry=r,
        )
        r.register(_Gauges(queues, in_flight))

    def batch(self, model: str, sentences: int, src_tokens: int, tgt_tokens: int, seconds: float):
        """One model call of `model` (called on the thread that reads its process's replies)."""
        self.batch_sentences.labels(model).observe(sentences)
        self.batch_seconds.labels(model).observe(seconds)
        self.sentences.labels(model).inc(sentences)
        self.tokens.labels(model, "source").inc(src_tokens)
        self.tokens.labels(model, "target").inc(tgt_tokens)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _Gauges:
    def __init__(self, queues: dict[str, Callable[[], int]], in_flight: Callable[[], int]):
        self.queues, self.in_flight = queues, in_flight

    def collect(self) -> Iterable[GaugeMetricFamily]:
        depth = GaugeMetricFamily(
            f"{PREFIX}_queue_depth",
            "requests sent to the model and not yet answered",
            labels=["model"],
        )
        for model, queued in self.queues.items():
            depth.add_metric([model], queued())
        yield depth
        yield GaugeMetricFamily(
            f"{PREFIX}_in_flight", "requests received, not yet answered", value=self.in_flight()
        )

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return []


class Middleware:
    """ASGI middleware counting every HTTP request by route, method and status, and timing it
    (to the start of the response)."""

    def __init__(self, app, metrics: Metrics, routes: set[str]) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes
        # A route with a parameter (`/download_file/{name}`) is labelled by its template.
        self.templates = {r.split("{")[0]: r for r in routes if "{" in r}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        route = (
            path if path in self.routes else "/static" if path.startswith("/static/") else "other"
        )
        for prefix, template in self.templates.items():
            if route == "other" and path.startswith(prefix) and "/" not in path[len(prefix) :]:
                route = template
        began = time.perf_counter()
        method = scope.get("method", "")
        method = method if method in METHODS else "other"
        counted = False

        def count(status: int) -> None:  # once, when the response starts (before the client
            nonlocal counted  # can read it, so that a scrape after an answer includes it)
            if not counted:
                counted = True
                self.metrics.latency.labels(route).observe(time.perf_counter() - began)
                self.metrics.requests.labels(route, method, str(status)).inc()

        async def sending(message) -> None:
            if message["type"] == "http.response.start":
                count(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            count(500)  # no response started: the server failed it

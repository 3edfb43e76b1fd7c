"""The gateway's Prometheus metrics, on a registry per app (so tests can run several)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from embedfleet.gateway.balancer import Balancer

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class _WorkerCollector(Collector):
    """Per-worker state read at scrape time, so removed workers leave no stale series; with
    several models, each series also names the model its workers serve."""

    def __init__(
        self,
        balancer: Callable[[], Balancer],
        models: Callable[[], Mapping[str, Balancer]] | None = None,
    ) -> None:
        self._balancer = balancer
        self._models = models

    def collect(self) -> Iterator[GaugeMetricFamily]:
        by_model = self._models() if self._models else {"": self._balancer()}
        extra = ["model"] if self._models else []
        outstanding = GaugeMetricFamily(
            "embedfleet_gateway_worker_outstanding_tokens",
            "Tokens sent to a worker by this gateway and not yet answered.",
            labels=["worker", *extra],
        )
        state = GaugeMetricFamily(
            "embedfleet_gateway_workers",
            "Known workers by state (ready: taking traffic; ejected: failing; unready).",
            labels=["state", *extra],
        )
        for model, balancer in by_model.items():
            named = [model] if self._models else []
            usable = {e.address for e in balancer.usable()}
            counts = {"ready": 0, "ejected": 0, "unready": 0}
            for e in balancer.endpoints.values():
                outstanding.add_metric([e.address, *named], e.outstanding_tokens)
                key = "ready" if e.address in usable else ("ejected" if e.ready else "unready")
                counts[key] += 1
            for key, value in counts.items():
                state.add_metric([key, *named], value)
        yield outstanding
        yield state


#: the families that carry a `model` label in a gateway of several models (`Metrics.for_model`
#: binds it); the served names are the only values, so the series stay few
MODEL_LABELLED = (
    "tokenize_seconds",
    "upstream_seconds",
    "input_tokens",
    "chunks_per_request",
    "retries",
    "shed",
    "queued_seconds",
    "delivered_ratio",
    "ejections",
    "cancelled_calls",
    "split_inputs",
    "held_requests",
    "held_tokens",
    "hold_seconds",
)
#: the gateway's own stages of a request, besides tokenize and upstream (their own histograms):
#: parse: the body read, JSON decoded and validated; respond: the answer's JSON encoded and sent
STAGES = ("parse", "respond")
_STAGE_SECONDS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                  0.01, 0.025, 0.05, 0.1, 0.25, 1.0)  # fmt: skip


class Metrics:
    """With `models` (a gateway of several models: served name to balancer), the families of
    MODEL_LABELLED and the request counts and durations carry a `model` label; without, no
    family has one and the series are those of a one-model gateway."""

    def __init__(
        self,
        balancer: Callable[[], Balancer],
        models: Callable[[], Mapping[str, Balancer]] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.per_model = models is not None
        m = ["model"] if self.per_model else []
        r = self.registry
        self.requests = Counter(
            "embedfleet_gateway_requests",
            "HTTP requests by route and status code.",
            ["route", "code", *m],
            registry=r,
        )
        self.request_seconds = Histogram(
            "embedfleet_gateway_request_seconds",
            "Time from request start to the response being sent, by route.",
            ["route", *m],
            buckets=_LATENCY,
            registry=r,
        )
        self.tokenize_seconds = Histogram(
            "embedfleet_gateway_tokenize_seconds",
            "Time tokenizing one request (including the hop to the tokenizer threads).",
            buckets=_LATENCY,
            labelnames=m,
            registry=r,
        )
        self.upstream_seconds = Histogram(
            "embedfleet_gateway_upstream_seconds",
            "Time of one chunk's call to a worker (queueing there plus compute), per attempt.",
            buckets=_LATENCY,
            labelnames=m,
            registry=r,
        )
        self.stage_seconds = Histogram(
            "embedfleet_gateway_stage_seconds",
            "Time of one request in a gateway stage: parse (body read, JSON decoded, validated) or "
            "respond (answer JSON-encoded and sent); tokenize and upstream have their own.",
            ["stage"],
            buckets=_STAGE_SECONDS,
            registry=r,
        )
        # Children resolved once: observing one is then a lock and two adds, no label lookup.
        self.parse_stage = self.stage_seconds.labels("parse")
        self.respond_stage = self.stage_seconds.labels("respond")
        self.input_tokens = Counter(
            "embedfleet_gateway_input_tokens",
            "Tokens of accepted requests.",
            labelnames=m,
            registry=r,
        )
        self.chunks_per_request = Histogram(
            "embedfleet_gateway_chunks_per_request",
            "Chunks a request was split into.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            labelnames=m,
            registry=r,
        )
        self.retries = Counter(
            "embedfleet_gateway_retries",
            "Chunks retried on another worker.",
            labelnames=m,
            registry=r,
        )
        self.shed = Counter(
            "embedfleet_gateway_shed_requests",
            "Requests answered 429 before tokenization: the work queued ahead was past "
            "--max-queue-seconds.",
            labelnames=m,
            registry=r,
        )
        self.queued_seconds = Gauge(
            "embedfleet_gateway_queued_work_seconds",
            "Seconds of work queued ahead of a request arriving now, at the usable workers' "
            "measured capacity (what admission compares with --max-queue-seconds).",
            labelnames=m,
            registry=r,
        )
        self.delivered_ratio = Gauge(
            "embedfleet_gateway_delivered_capacity_ratio",
            "Tokens/s the fleet answered while this gateway's queue was deep, over the capacity "
            "its workers report (1 until learned); admission's capacity is that figure times "
            "this.",
            labelnames=m,
            registry=r,
        )
        self.inflight = Gauge(
            "embedfleet_gateway_inflight_requests", "Requests being served now.", registry=r
        )
        self.ejections = Counter(
            "embedfleet_gateway_worker_ejections",
            "Times a failing worker was taken out of rotation.",
            labelnames=m,
            registry=r,
        )
        self.cancelled = Counter(
            "embedfleet_gateway_cancelled_requests",
            "Requests whose client disconnected before the answer; their chunks were cancelled.",
            registry=r,
        )
        self.cancelled_calls = Counter(
            "embedfleet_gateway_cancelled_calls",
            "Chunk calls to workers the gateway cancelled: the client went away, or another chunk "
            "of the same request failed. A worker may never see one sent just before.",
            labelnames=m,
            registry=r,
        )
        self.split_inputs = Counter(
            "embedfleet_gateway_split_inputs",
            "Inputs over the model's limit embedded as windows (split_long_inputs).",
            labelnames=m,
            registry=r,
        )
        self.key_requests = Counter(
            "embedfleet_gateway_key_requests",
            "Authorized requests per API key (only with --api-key-metrics), by route; `key` is "
            "the first 12 hex digits of the key's sha256, never the key.",
            ["key", "route"],
            registry=r,
        )
        # Scale from zero (hold.py): the autoscaler reads these as demand while no worker is up.
        self.held_requests = Gauge(
            "embedfleet_gateway_held_requests",
            "Requests waiting for a worker to become ready (the fleet is at zero or starting).",
            labelnames=m,
            registry=r,
        )
        self.held_tokens = Gauge(
            "embedfleet_gateway_held_tokens",
            "Tokens of the requests waiting for a worker to become ready.",
            labelnames=m,
            registry=r,
        )
        self.hold_seconds = Histogram(
            "embedfleet_gateway_hold_seconds",
            "Time a request waited for a worker to become ready (held requests only).",
            buckets=(0.1, 0.5, 1, 2.5, 5, 10, 20, 30, 45, 60, 90, 120, 300),
            labelnames=m,
            registry=r,
        )
        self.hold_refused = Counter(
            "embedfleet_gateway_hold_refused",
            "Requests answered 503 while waiting for a worker: the hold was full, or timed out.",
            ["reason"],
            registry=r,
        )
        r.register(_WorkerCollector(balancer, models))

    def for_model(self, name: str) -> Metrics:
        """These metrics as one model's parts see them: MODEL_LABELLED bound to `model=name`
        (the same object when there is one model)."""
        if not self.per_model:
            return self
        view = copy.copy(self)
        for attr in MODEL_LABELLED:
            setattr(view, attr, getattr(self, attr).labels(model=name))
        return view

    def model_labels(self, name: str) -> tuple[str, ...]:
        """The trailing label values of the request counts and durations for a request that
        model `name` served ("" when none did: a bad body, an unknown model, a GET)."""
        return (name,) if self.per_model else ()

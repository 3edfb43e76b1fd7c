"""The Rust front's /metrics: the Python front's `WorkerMetrics` under the same names, served
from a Python thread by prometheus-client.

What only the extension knows is read from its `Server.stats()` at scrape time: the live
gauges (queue, in flight, bytes held, streams, ready, draining) and the counts it keeps of each
call's outcome and time and of the requests it drops unrun, its own refusals included. The
rest (queue wait, batch size, compute, tokens, stages) is observed by `rust_front.Batches` in
the one Python call each batch makes, so no request costs a call of its own.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from embedfleet.worker.metrics import WorkerMetrics

#: what the extension's `Server.stats()` returns (worker-front/src/lib.rs says each key)
ReadStats = Callable[[], dict[str, Any]]
#: gRPC status codes by number, named as requests_total's `code` label names them
_CODES = {code.value[0]: code.name for code in grpc.StatusCode}
#: the request-time histogram's bounds: the extension counts calls into them
REQUEST_SECONDS_BUCKETS = WorkerMetrics.request.buckets
#: the series the Python front has from the start (at 0), so rate() sees them at once
_FROM_START = (("Embed", "OK"), ("Score", "OK"), ("Info", "OK"))


class _Counted(Collector):
    """requests_total, request_seconds and dropped_requests_total as the extension counts them."""

    def __init__(self, stats: ReadStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        counts = dict.fromkeys(_FROM_START, 0)
        for method, code, count in stats["requests"]:
            counts[(method, _CODES.get(code, str(code)))] = count
        requests = WorkerMetrics.requests.family()
        for labels, count in counts.items():
            requests.add_metric(labels, count)
        yield requests
        seconds = WorkerMetrics.request.histogram_family()
        cumulative = itertools.accumulate(stats["request_seconds_buckets"])
        bounds = map(floatToGoString, (*REQUEST_SECONDS_BUCKETS, math.inf))
        buckets = list(zip(bounds, cumulative, strict=True))
        seconds.add_metric([], buckets, stats["request_seconds_sum"])
        yield seconds
        dropped = WorkerMetrics.dropped.family()
        dropped.add_metric(("cancelled",), stats["dropped_cancelled"])
        dropped.add_metric(("deadline",), stats["dropped_deadline"])
        yield dropped


def _reading(stats: ReadStats, key: str) -> Callable[[], float]:
    return lambda: float(stats()[key])


def watch(metrics: WorkerMetrics, stats: ReadStats) -> None:
    """Point `metrics` at the extension's figures: its counts replace the Python front's request,
    request-time and drop metrics, and the live gauges read `stats` at scrape time."""
    registry = metrics.registry
    for counted in (metrics.requests, metrics.request, metrics.dropped):
        registry.unregister(counted)
    registry.register(_Counted(stats))
    gauges = (
        (metrics.queued_requests, "queued_requests"),
        (metrics.queued_tokens, "queued_tokens"),
        (metrics.inflight, "inflight"),
        (metrics.request_bytes, "inflight_bytes"),
        (metrics.streams, "streams"),
        (metrics.draining, "draining"),
        (metrics.saturated, "saturated_tokens_per_second"),
    )
    for gauge, key in gauges:
        gauge.set_function(_reading(stats, key))

    def ready() -> float:
        now = stats()
        return float(now["listening"] and not now["draining"])

    metrics.ready.set_function(ready)

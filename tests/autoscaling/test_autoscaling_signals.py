"""Signals against real exposition: the worker's own registry, the gateway's families by name
(tests/gateway/test_metrics.py reads the gateway binary's own /metrics with these signals), and
real processes serving them over HTTP."""

from __future__ import annotations

import asyncio
import math
import random
import re
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from embedfleet.operator.autoscaling import signals
from embedfleet.operator.autoscaling.signals import Scrape
from embedfleet.testing.stub_worker import StubWorker, start_stub
from embedfleet.worker.metrics import WorkerMetrics


class GatewayMetrics:
    """The gateway's families the operator reads, by their names."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.input_tokens = Counter("embedfleet_gateway_input_tokens", "", registry=r)
        self.request_seconds = Histogram(
            "embedfleet_gateway_request_seconds", "", ["route"], registry=r
        )
        self.held_requests = Gauge("embedfleet_gateway_held_requests", "", registry=r)
        self.held_tokens = Gauge("embedfleet_gateway_held_tokens", "", registry=r)


def exposition(metrics: WorkerMetrics | GatewayMetrics) -> str:
    return generate_latest(metrics.registry).decode()


def gateway_metrics() -> GatewayMetrics:
    return GatewayMetrics()


def test_parses_the_worker_registry() -> None:
    m = WorkerMetrics()
    m.tokens.inc(12_345)
    for latency in (0.003, 0.02, 0.02, 0.3):
        m.request.observe(latency)
    m.queued_tokens.set(777)
    m.capacity.set(9_500)
    s = signals.parse_worker(exposition(m), 10.0)
    assert s.tokens == 12_345
    assert s.queued_tokens == 777
    assert s.capacity_tokens_per_second == 9_500
    assert s.buckets[math.inf] == 4
    assert s.buckets[0.005] == 1
    assert s.buckets[0.025] == 3


def test_parses_the_gateway_registry_summing_routes() -> None:
    m = gateway_metrics()
    m.input_tokens.inc(500)
    m.request_seconds.labels("embeddings").observe(0.04)
    m.request_seconds.labels("rerank").observe(0.2)
    s = signals.parse_gateway(exposition(m), 1.0)
    assert s.tokens == 500
    assert s.buckets[math.inf] == 2
    assert s.buckets[0.05] == 1


@pytest.mark.parametrize("seed", range(10))
def test_p99_matches_the_observations(seed: int) -> None:
    """Interpolated p99 of bucket deltas lies in the bucket of the true p99 of that interval."""
    rng = random.Random(seed)
    m = WorkerMetrics()
    for _ in range(500):  # an earlier interval, subtracted out
        m.request.observe(rng.uniform(0, 0.01))
    before = signals.parse_worker(exposition(m), 0.0)
    latencies = [rng.lognormvariate(math.log(0.05), 1.0) for _ in range(2000)]
    for latency in latencies:
        m.request.observe(latency)
    after = signals.parse_worker(exposition(m), 5.0)
    p99 = signals.histogram_quantile(0.99, signals.bucket_deltas(before.buckets, after.buckets))
    true = sorted(latencies)[int(0.99 * len(latencies)) - 1]
    bounds = sorted(b for b in after.buckets if not math.isinf(b))
    upper = next((b for b in bounds if b >= true), bounds[-1])
    lower = max((b for b in bounds if b < true), default=0.0)
    assert p99 is not None
    assert lower <= p99 <= upper


def test_quantile_edge_cases() -> None:
    assert signals.histogram_quantile(0.99, {}) is None
    assert signals.histogram_quantile(0.99, {0.1: 0, math.inf: 0}) is None
    # Everything beyond the last bound: Prometheus answers that bound.
    assert signals.histogram_quantile(0.99, {0.1: 0, 1.0: 0, math.inf: 5}) == 1.0
    # Linear in the bucket; the first bucket starts at 0.
    assert signals.histogram_quantile(0.5, {1.0: 10, math.inf: 10}) == pytest.approx(0.5)
    # Non-monotone deltas (pods scraped at slightly different times) are repaired.
    buckets = {1.0: 10, 2.0: 8, 4.0: 20, math.inf: 20}
    assert signals.histogram_quantile(0.75, buckets) == pytest.approx(3.0)


def test_counter_reset_counts_from_zero() -> None:
    assert signals.counter_delta(100, 150) == 50
    assert signals.counter_delta(1_000, 30) == 30


def test_rates_sum_pods_seen_twice_only() -> None:
    previous = {"a": Scrape(0.0, 1_000, {math.inf: 0}), "gone": Scrape(0.0, 5, {})}
    current = {
        "a": Scrape(5.0, 6_000, {math.inf: 10}),
        "new": Scrape(5.0, 99_999, {math.inf: 99}),  # no baseline yet
    }
    r = signals.rates(previous, current)
    assert r is not None
    assert r.tokens_per_second == 1_000
    assert r.buckets == {math.inf: 10}
    assert r.pods == 1
    assert signals.rates({}, current) is None


def test_observe_prefers_gateway_load_and_latency() -> None:
    workers = (
        {"w": Scrape(0.0, 0, {0.1: 0, math.inf: 0})},
        {"w": Scrape(10.0, 50_000, {0.1: 100, math.inf: 100}, 300, 9_000)},
    )
    gateways = (
        {"g": Scrape(0.0, 0, {1.0: 0, math.inf: 0})},
        {"g": Scrape(10.0, 80_000, {1.0: 0, math.inf: 10})},
    )
    o = signals.observe(workers, gateways, ready_replicas=3)
    assert o is not None
    assert o.tokens_per_second == 8_000  # offered, not computed: the fleet is saturated
    assert o.p99_seconds == 1.0  # the client's view
    assert (o.queued_tokens, o.capacity_tokens_per_second, o.ready_replicas) == (300, 9_000, 3)
    only_workers = signals.observe(workers, ({}, {}), ready_replicas=3)
    assert only_workers is not None
    assert only_workers.tokens_per_second == 5_000
    assert only_workers.p99_seconds is not None
    assert only_workers.p99_seconds <= 0.1
    assert signals.observe(({}, workers[1]), ({}, gateways[1]), 3) is None
    # Scaled to zero: the gateways' accepted tokens still say there is work.
    no_workers = signals.observe(({}, {}), gateways, ready_replicas=0)
    assert no_workers is not None
    assert no_workers.tokens_per_second == 8_000
    assert no_workers.capacity_tokens_per_second is None


def test_held_requests_at_the_gateways_are_seen_from_the_first_scrape() -> None:
    m = gateway_metrics()
    m.held_requests.inc(3)
    m.held_tokens.inc(42)
    text = exposition(m)
    s = signals.parse_gateway(text, 1.0)
    assert (s.held_requests, s.held_tokens) == (3, 42)
    # A gauge needs no earlier round: the operator's first look at a fleet at zero sees them.
    o = signals.observe(({}, {}), ({}, {"a": s, "b": signals.parse_gateway(text, 1.0)}), 0)
    assert o is not None
    assert (o.held_requests, o.held_tokens, o.tokens_per_second) == (6, 84, 0)
    values = {"held_requests": 2.0, "held_tokens": 20.0}
    from_prometheus = signals.observation_from_prometheus(values, 0)
    assert from_prometheus is not None
    assert (from_prometheus.held_requests, from_prometheus.held_tokens) == (2, 20)
    queries = signals.prometheus_queries("1m", "ns", "g")
    pods = '"(g)-gateway-[a-z0-9]+-[a-z0-9]+"'
    assert queries["held_requests"] == (
        "sum by (namespace, fleet) (label_replace(embedfleet_gateway_held_requests"
        f'{{pod=~{pods},namespace="ns"}}, "fleet", "$1", "pod", {pods}))'
    )


def test_prometheus_answers_are_read_by_fleet() -> None:
    body = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {"metric": {"namespace": "a", "fleet": "f"}, "value": [1.0, "12.5"]},
                {"metric": {"namespace": "b", "fleet": "f"}, "value": [1.0, "7"]},
                {"metric": {"namespace": "a", "fleet": "g"}, "value": [1.0, "NaN"]},
                {"metric": {"namespace": "a"}, "value": [1.0, "3"]},  # no fleet: not ours
            ],
        },
    }
    vectors = {"worker_tokens": signals.by_fleet(body)}
    assert vectors["worker_tokens"] == {("a", "f"): 12.5, ("b", "f"): 7.0}
    assert signals.values_of(vectors, ("a", "g")) == {"worker_tokens": None}
    with pytest.raises(ValueError, match="bad_data"):
        signals.by_fleet({"status": "error", "error": "bad_data"})


def test_a_fleet_named_like_another_fleets_pods_is_told_apart() -> None:
    # Fleet "web" and fleet "web-worker-a": the pod pattern has two dash-free tails, so neither
    # fleet's queries read the other's pods, and the capture names the right one.
    pattern = re.compile(signals.pods_pattern("worker", ""))
    for pod, fleet in (
        ("web-worker-5d4f8b7c9-x2k4p", "web"),
        ("web-worker-a-worker-7c9d-p4x2k", "web-worker-a"),
    ):
        found = pattern.fullmatch(pod)
        assert found is not None
        assert found.group(1) == fleet
    only_web = re.compile(signals.pods_pattern("worker", "web"))
    assert only_web.fullmatch("web-worker-5d4f8b7c9-x2k4p")
    assert not only_web.fullmatch("web-worker-a-worker-7c9d-p4x2k")
    assert not re.fullmatch(signals.pods_pattern("worker", "a.b"), "axb-worker-1-2")


def test_capacity_ignores_workers_still_warming_up() -> None:
    previous = {"a": Scrape(0, 0, {}), "b": Scrape(0, 0, {})}
    current = {"a": Scrape(1, 10, {}, 0, 8_000), "b": Scrape(1, 10, {}, 0, 0)}
    o = signals.observe((previous, current), ({}, {}), 2)
    assert o is not None
    assert o.capacity_tokens_per_second == 8_000
    none_ready = {"a": Scrape(1, 10, {}), "b": Scrape(1, 10, {})}
    o = signals.observe((previous, none_ready), ({}, {}), 2)
    assert o is not None
    assert o.capacity_tokens_per_second is None


def pod(
    ip: str = "10.0.0.1",
    phase: str = "Running",
    annotation: str | None = None,
    port: int | None = None,
    deleting: bool = False,
) -> dict[str, object]:
    meta: dict[str, object] = {"name": "p", "annotations": {}}
    if annotation:
        meta["annotations"] = {signals.METRICS_URL_ANNOTATION: annotation}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    ports = [{"name": "grpc", "containerPort": 50051}]
    if port:
        ports.append({"name": "metrics", "containerPort": port})
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": "worker", "ports": ports}]},
        "status": {"phase": phase, "podIP": ip},
    }


def test_pod_metrics_urls() -> None:
    pods = [
        pod("10.0.0.1"),
        pod("10.0.0.2", port=9400),
        pod("fd00::5", port=9400),
        pod("10.0.0.3", annotation="http://127.0.0.1:7000/metrics"),
        pod("10.0.0.4", phase="Pending"),
        pod("10.0.0.5", deleting=True),
        pod(""),
    ]
    assert signals.pod_metrics_urls(pods, "metrics", 9090) == [
        "http://10.0.0.1:9090/metrics",
        "http://10.0.0.2:9400/metrics",
        "http://127.0.0.1:7000/metrics",
        "http://[fd00::5]:9400/metrics",
    ]


async def scrape_twice(
    scraper: signals.Scraper, urls: list[str], gap: float
) -> tuple[dict[str, Scrape], dict[str, Scrape]]:
    async with aiohttp.ClientSession() as session:
        await scraper.round(session, "ns/x/worker", urls, gateway=False, now=time.time())
        await asyncio.sleep(gap)
        return await scraper.round(session, "ns/x/worker", urls, gateway=False, now=time.time())


def test_scraper_measures_real_processes(stub_workers: list[StubWorker], tmp_path: Path) -> None:
    a = start_stub(stub_workers, tmp_path, tokens_per_second=20_000, latency_seconds=0.3,
                   capacity=10_000)  # fmt: skip
    b = start_stub(stub_workers, tmp_path, tokens_per_second=10_000, latency_seconds=0.02,
                   capacity=12_000, queued_tokens=500)  # fmt: skip
    dead = "http://127.0.0.1:9/metrics"  # refused: left out, not fatal
    scraper = signals.Scraper(timeout=1.0)
    rounds = asyncio.run(scrape_twice(scraper, [a.url, b.url, dead], gap=2.0))
    assert set(rounds[1]) == {a.url, b.url}
    o = signals.observe(rounds, ({}, {}), ready_replicas=2)
    assert o is not None
    # 30,000 tokens/s in total; the stubs tick every 100 ms, so allow a tick's worth per second.
    assert o.tokens_per_second == pytest.approx(30_000, rel=0.1)
    # 2/3 of requests take 0.3 s: p99 lies in the (0.25, 0.5] bucket.
    assert o.p99_seconds is not None
    assert 0.25 < o.p99_seconds <= 0.5
    assert o.capacity_tokens_per_second == pytest.approx(11_000)
    assert o.queued_tokens == 500


def test_scraper_survives_a_restarted_pod(stub_workers: list[StubWorker], tmp_path: Path) -> None:
    a = start_stub(stub_workers, tmp_path, tokens_per_second=50_000, capacity=10_000)
    scraper = signals.Scraper(timeout=1.0)
    asyncio.run(scrape_twice(scraper, [a.url], gap=1.5))
    a.stop()
    a.set_load(tokens_per_second=1_000, capacity=10_000)
    a.start()  # same port, counters from zero
    rounds = asyncio.run(scrape_twice(scraper, [a.url], gap=1.0))
    o = signals.observe(rounds, ({}, {}), 1)
    assert o is not None
    # Rate between the two rounds after the restart; never negative.
    assert 0 <= o.tokens_per_second < 5_000

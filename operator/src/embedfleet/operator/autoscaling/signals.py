"""Fleet measurements for the policy: scrape the pods' /metrics, or ask a Prometheus server.

Scraping (the default, no extra components): counters become rates from the deltas between two
scrapes of the same pod (a smaller value means the pod restarted: the new value is the delta), and
p99 comes from the summed histogram bucket deltas, interpolated within the bucket as Prometheus's
`histogram_quantile` does. The gateways' accepted tokens are the offered load; the workers' own
token counter stands in when no gateway is scraped, and their queued tokens add the backlog.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from embedfleet.operator.autoscaling.policy import Observation

WORKER_TOKENS = "embedfleet_worker_tokens_total"
WORKER_LATENCY = "embedfleet_worker_request_seconds"
WORKER_QUEUED = "embedfleet_worker_queued_tokens"
WORKER_CAPACITY = "embedfleet_worker_capacity_tokens_per_second"
GATEWAY_TOKENS = "embedfleet_gateway_input_tokens_total"
GATEWAY_LATENCY = "embedfleet_gateway_request_seconds"
GATEWAY_HELD_REQUESTS = "embedfleet_gateway_held_requests"
GATEWAY_HELD_TOKENS = "embedfleet_gateway_held_tokens"

#: Pod annotation naming the full metrics URL, for pods whose metrics are not at podIP:port
#: (port-forwarded development clusters, proxies, and KWOK test fleets whose pods are fake).
METRICS_URL_ANNOTATION = "embedfleet.dev/metrics-url"
QUANTILE = 0.99


@dataclass(frozen=True, slots=True)
class Scrape:
    """The metrics of one pod that the autoscaler uses, at one time."""

    time: float
    tokens: float
    #: cumulative request counts by upper bound (seconds), +Inf included
    buckets: Mapping[float, float]
    queued_tokens: float = 0.0
    capacity_tokens_per_second: float = 0.0
    #: a gateway's requests waiting for a ready worker (scale from zero), and their tokens
    held_requests: float = 0.0
    held_tokens: float = 0.0


def parse_worker(text: str, time: float) -> Scrape:
    return _parse(text, time, WORKER_TOKENS, WORKER_LATENCY)


def parse_gateway(text: str, time: float) -> Scrape:
    return _parse(text, time, GATEWAY_TOKENS, GATEWAY_LATENCY)


def _parse(text: str, time: float, tokens_name: str, latency_name: str) -> Scrape:
    tokens = queued = capacity = held_requests = held_tokens = 0.0
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == tokens_name:
                tokens += sample.value
            elif sample.name == latency_name + "_bucket":
                # Summed over every other label (the gateway's route, for one).
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
            elif sample.name == WORKER_QUEUED:
                queued += sample.value
            elif sample.name == WORKER_CAPACITY:
                capacity = max(capacity, sample.value)
            elif sample.name == GATEWAY_HELD_REQUESTS:
                held_requests += sample.value
            elif sample.name == GATEWAY_HELD_TOKENS:
                held_tokens += sample.value
    return Scrape(time, tokens, buckets, queued, capacity, held_requests, held_tokens)


def counter_delta(previous: float, current: float) -> float:
    # A counter only falls when its process restarted; it then counted from zero.
    return current - previous if current >= previous else current


def bucket_deltas(
    previous: Mapping[float, float], current: Mapping[float, float]
) -> dict[float, float]:
    return {le: counter_delta(previous.get(le, 0.0), n) for le, n in current.items()}


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """The q-quantile of cumulative bucket counts, or None without observations.

    Linear within the bucket holding the rank; the lowest bucket starts at 0; a rank in the +Inf
    bucket answers the highest finite bound (what Prometheus does).
    """
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    # Deltas of cumulative counts from pods scraped at slightly different times can dip; the
    # running maximum restores monotonicity.
    counts: list[float] = []
    for le in bounds:
        counts.append(max(buckets[le], counts[-1] if counts else 0.0))
    total = counts[-1]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for le, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if math.isinf(le):
                finite = [b for b in bounds if not math.isinf(b)]
                return finite[-1] if finite else None
            if count == lower_count:
                return le
            return lower_bound + (le - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = le, count
    return None


@dataclass(frozen=True, slots=True)
class Rates:
    tokens_per_second: float
    #: summed bucket increments over the interval
    buckets: Mapping[float, float]
    pods: int


def rates(previous: Mapping[str, Scrape], current: Mapping[str, Scrape]) -> Rates | None:
    """Summed per-pod rates between two scrape rounds; None when no pod was seen in both."""
    tokens = 0.0
    buckets: dict[float, float] = {}
    pods = 0
    for target, now in current.items():
        before = previous.get(target)
        if before is None or now.time <= before.time:
            continue
        pods += 1
        tokens += counter_delta(before.tokens, now.tokens) / (now.time - before.time)
        for le, n in bucket_deltas(before.buckets, now.buckets).items():
            buckets[le] = buckets.get(le, 0.0) + n
    if pods == 0:
        return None
    return Rates(tokens, buckets, pods)


def observe(
    workers: tuple[Mapping[str, Scrape], Mapping[str, Scrape]],
    gateways: tuple[Mapping[str, Scrape], Mapping[str, Scrape]],
    ready_replicas: int,
) -> Observation | None:
    """One Observation from (previous, current) scrape rounds of the workers and gateways."""
    worker = rates(*workers)
    gateway = rates(*gateways)
    held = gateways[1].values()
    held_requests = sum(s.held_requests for s in held)
    if worker is None and gateway is None and not held_requests:
        return None
    tokens = 0.0 if worker is None else worker.tokens_per_second
    latency: Mapping[float, float] = {} if worker is None else worker.buckets
    if gateway is not None:
        # Accepted tokens are the offered load (a saturated fleet computes less than it is
        # offered, a fleet scaled to zero nothing); the client sees the gateway's latency.
        tokens = max(tokens, gateway.tokens_per_second)
        if histogram_quantile(QUANTILE, gateway.buckets) is not None:
            latency = gateway.buckets
    current = workers[1].values()
    capacities = [s.capacity_tokens_per_second for s in current if s.capacity_tokens_per_second > 0]
    return Observation(
        tokens_per_second=tokens,
        p99_seconds=histogram_quantile(QUANTILE, latency),
        capacity_tokens_per_second=sum(capacities) / len(capacities) if capacities else None,
        queued_tokens=sum(s.queued_tokens for s in current),
        ready_replicas=ready_replicas,
        held_requests=held_requests,
        held_tokens=sum(s.held_tokens for s in held),
    )


def pod_metrics_urls(
    pods: Iterable[Mapping[str, Any]], port_name: str, default_port: int
) -> list[str]:
    """Metrics URLs of running pods: the annotation if set, else http://podIP:port/metrics with
    the container port named `port_name` (`default_port` when no container has one)."""
    urls = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        if meta.get("deletionTimestamp") or status.get("phase") != "Running":
            continue
        annotated = (meta.get("annotations") or {}).get(METRICS_URL_ANNOTATION)
        if annotated:
            urls.append(str(annotated))
        elif status.get("podIP"):
            port = _container_port(pod.get("spec") or {}, port_name, default_port)
            urls.append(f"http://{_host(str(status['podIP']))}:{port}/metrics")
    return sorted(urls)


def _container_port(spec: Mapping[str, Any], name: str, default: int) -> int:
    for container in spec.get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == name and port.get("containerPort"):
                return int(port["containerPort"])
    return default


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


@dataclass
class Scraper:
    """Keeps each fleet's last scrape round between autoscaler ticks (in the operator's memory only:
    after a restart the first round yields no rates and the policy holds)."""

    timeout: float = 2.0
    rounds: dict[str, dict[str, Scrape]] = field(default_factory=dict)

    async def round(
        self,
        session: aiohttp.ClientSession,
        key: str,
        urls: Sequence[str],
        gateway: bool,
        now: float,
    ) -> tuple[dict[str, Scrape], dict[str, Scrape]]:
        """(previous, current) scrapes of `urls`; unreachable pods are left out of both."""
        parse = parse_gateway if gateway else parse_worker
        texts = await asyncio.gather(*(self._fetch(session, url) for url in urls))
        current = {url: parse(text, now) for url, text in zip(urls, texts, strict=True) if text}
        previous = self.rounds.get(key, {})
        self.rounds[key] = current
        return previous, current

    def forget(self, key_prefix: str) -> None:
        for key in [k for k in self.rounds if k.startswith(key_prefix)]:
            del self.rounds[key]

    async def _fetch(self, session: aiohttp.ClientSession, url: str) -> str | None:
        try:
            timeout = aiohttp.ClientTimeout(total=self.timeout)
            async with session.get(url, timeout=timeout) as response:
                if response.status != 200:
                    return None
                return await response.text()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None


FleetKey = tuple[str, str]
"""(namespace, name) of an EmbeddingDeployment, as the Prometheus queries label their series."""
Answers = Mapping[str, Mapping[FleetKey, float]]
"""Every fleet's value of each query, from one Prometheus (`query_prometheus`)."""


def pods_pattern(component: str, fleet: str) -> str:
    """RE2 matching the pods of a fleet's `component` Deployment, `<fleet>-<component>-<pod
    template hash>-<suffix>`, capturing the fleet: any fleet when `fleet` is empty. The two
    dash-free tails keep fleet `a` from claiming the pods of fleet `a-worker-b`."""
    name = fleet.replace(".", "[.]") if fleet else ".+"  # DNS names: only '.' is special
    return f"({name})-{component}-[a-z0-9]+-[a-z0-9]+"


def prometheus_queries(window: str, namespace: str = "", fleet: str = "") -> dict[str, str]:
    """PromQL for each signal, one series per fleet (labels `namespace` and `fleet`), from the
    `namespace` and `pod` labels a ServiceMonitor attaches: one query per signal for every fleet
    on one Prometheus, not one per fleet. `namespace`/`fleet` narrow it (a single fleet's wake)."""

    def series(metric: str, component: str) -> str:
        where = [f'pod=~"{pods_pattern(component, fleet)}"']
        if namespace:
            where.append(f'namespace="{namespace}"')
        return f"{metric}{{{','.join(where)}}}"

    def by_fleet(expr: str, component: str) -> str:
        return f'label_replace({expr}, "fleet", "$1", "pod", "{pods_pattern(component, fleet)}")'

    def total(expr: str, component: str, by: str = "namespace, fleet", op: str = "sum") -> str:
        return f"{op} by ({by}) ({by_fleet(expr, component)})"

    def p99(metric: str, component: str) -> str:
        rate = f"rate({series(metric + '_bucket', component)}[{window}])"
        return f"histogram_quantile({QUANTILE}, {total(rate, component, 'namespace, fleet, le')})"

    return {
        "worker_tokens": total(f"rate({series(WORKER_TOKENS, 'worker')}[{window}])", "worker"),
        "gateway_tokens": total(f"rate({series(GATEWAY_TOKENS, 'gateway')}[{window}])", "gateway"),
        "gateway_p99": p99(GATEWAY_LATENCY, "gateway"),
        "worker_p99": p99(WORKER_LATENCY, "worker"),
        "queued": total(series(WORKER_QUEUED, "worker"), "worker"),
        "capacity": total(f"{series(WORKER_CAPACITY, 'worker')} > 0", "worker", op="avg"),
        "held_requests": total(series(GATEWAY_HELD_REQUESTS, "gateway"), "gateway"),
        "held_tokens": total(series(GATEWAY_HELD_TOKENS, "gateway"), "gateway"),
    }


async def query_prometheus(
    session: aiohttp.ClientSession, base_url: str, queries: Mapping[str, str], timeout: float = 5.0
) -> Answers:
    """Each query's value per fleet (NaN and series without a fleet are left out). Raises
    aiohttp errors, and ValueError for a query Prometheus refused."""
    results: dict[str, dict[FleetKey, float]] = {}
    url = base_url.rstrip("/") + "/api/v1/query"
    for name, promql in queries.items():
        async with session.get(
            url, params={"query": promql}, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as response:
            response.raise_for_status()
            body = await response.json()
        results[name] = by_fleet(body)
    return results


def by_fleet(body: Mapping[str, Any]) -> dict[FleetKey, float]:
    """An instant-vector answer's finite values by (namespace, fleet)."""
    if body.get("status") != "success":
        raise ValueError(f"Prometheus query failed: {body.get('error', body)}")
    values: dict[FleetKey, float] = {}
    for item in body.get("data", {}).get("result", []):
        labels = item.get("metric") or {}
        fleet = labels.get("fleet", "")
        value = float(item["value"][1])
        if fleet and math.isfinite(value):
            values[(labels.get("namespace", ""), fleet)] = value
    return values


def values_of(vectors: Answers, key: FleetKey) -> dict[str, float | None]:
    """One fleet's value of each query (None: no series)."""
    return {name: vector.get(key) for name, vector in vectors.items()}


def observation_from_prometheus(
    values: Mapping[str, float | None], ready_replicas: int
) -> Observation | None:
    worker = values.get("worker_tokens")
    gateway = values.get("gateway_tokens")
    held_requests = values.get("held_requests") or 0.0
    if worker is None and gateway is None and not held_requests:
        return None
    p99 = values.get("gateway_p99")
    if p99 is None:
        p99 = values.get("worker_p99")
    return Observation(
        tokens_per_second=max(worker or 0.0, gateway or 0.0),
        p99_seconds=p99,
        capacity_tokens_per_second=values.get("capacity"),
        queued_tokens=values.get("queued") or 0.0,
        ready_replicas=ready_replicas,
        held_requests=held_requests,
        held_tokens=values.get("held_tokens") or 0.0,
    )

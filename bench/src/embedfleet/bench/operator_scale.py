"""`python -m embedfleet.bench.operator_scale`: one operator, N EmbeddingDeployments, the real
control plane (etcd, kube-apiserver, controller-manager, scheduler) and KWOK's fake pods.

Per N (a fresh cluster each): create N fleets of `--replicas` workers and one gateway, wait until
every one is Available and rolled out; stay idle for `--idle-seconds`; change the spec (the worker
CPU request: a rollout) of `--change-fraction` of them; delete them all. Measured: create / spec
change -> children applied and -> status Available (p50/p99, seconds from the client's request),
the operator's peak RSS and CPU per phase, the API server's requests by verb per minute (its own
apiserver_request_total: every client), the operator's own requests (its
embedfleet_operator_api_requests_total), and the writes per minute while nothing changes.
`--kill N`: a second cluster where the operator is SIGKILLed halfway through creating N fleets and
a successor takes over; measured: kill -> every fleet converged, and the children counted for
duplicates and orphans. Figures go to results.json/.md and operator_scale.png in `--out`.

The latency figures are only as good as the machine: on a shared one, read them with its load.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import math
import os
import re
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from embedfleet.common.net import free_ports
from embedfleet.operator.autoscaling import signals
from embedfleet.operator.manifests import MANAGER
from embedfleet.testing import apimetrics, process, procfs
from embedfleet.testing.apiclient import ApiClient, ApiError
from embedfleet.testing.cluster import Cluster, ClusterConfig
from embedfleet.testing.components import ClientRate
from embedfleet.testing.nodes import NodeShape
from embedfleet.testing.polling import WaitTimeoutError, wait_for

REPO = Path(__file__).resolve().parents[4]
CRD = REPO / "crds" / "embedfleet.dev_embeddingdeployments.yaml"
DEFAULT_OUT = REPO / "docs" / "benchmarks" / "operator_scale"
OPERATOR = Path(sys.executable).parent / "embedfleet-operator"
NAMESPACE = "scale"
EMB = f"/apis/embedfleet.dev/v1alpha1/namespaces/{NAMESPACE}/embeddingdeployments"
OWNER_LABEL = "embedfleet.dev/deployment"
OURS = "app.kubernetes.io/managed-by=embedfleet-operator"
PODS_PER_NODE = 1000
CPU, CHANGED_CPU = "10m", "11m"
#: Children per fleet by collection (no ServiceMonitor: its CRD is not installed).
CHILDREN = {
    "/api/v1/namespaces/scale/configmaps": 1,
    "/api/v1/namespaces/scale/services": 2,
    "/api/v1/namespaces/scale/serviceaccounts": 1,
    "/apis/apps/v1/namespaces/scale/deployments": 2,
    "/apis/rbac.authorization.k8s.io/v1/namespaces/scale/roles": 1,
    "/apis/rbac.authorization.k8s.io/v1/namespaces/scale/rolebindings": 1,
    "/apis/policy/v1/namespaces/scale/poddisruptionbudgets": 2,
}
WRITES = ("POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION")
OPERATOR_RESOURCES = (
    "embeddingdeployments", "configmaps", "services", "serviceaccounts", "deployments", "roles",
    "rolebindings", "poddisruptionbudgets",
)  # fmt: skip
#: The controller-manager's and scheduler's client limit in this benchmark: their defaults (20/s
#: and 50/s) made the ReplicaSet controller, not the operator or the API server, the bound on
#: N=1,000's 6,000 pods (3 to 4 pods a second). High enough that the API server limits instead.
CONTROL_PLANE_RATE = ClientRate(qps=500, burst=1000)
#: With the client limit lifted, the Deployment controller's 5 syncs at once (each waiting on
#: the loaded API server) made 1,272 of N=1,000's 2,000 ReplicaSets in 12 minutes.
CONTROLLER_SYNCS = 50
TARGETS = {
    "change_applied_p99_s": 2.0,
    "operator_rss_peak_mb": 500.0,
    "idle_operator_writes_per_min": 0.0,
    "kill_convergence_s": 60.0,
}


def fleet(name: str, replicas: int, prometheus: str = "") -> dict[str, Any]:
    """A fleet of fake pods: tiny requests (KWOK runs nothing), no GPUs, no model download.
    With `prometheus`, autoscaled from that Prometheus API (pinned at `replicas`)."""
    body: dict[str, Any] = {
        "apiVersion": "embedfleet.dev/v1alpha1",
        "kind": "EmbeddingDeployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "model": {"source": "file:///models/m", "servedModelName": "m"},
            "worker": {
                "replicas": replicas,
                "resources": {"requests": {"cpu": CPU, "memory": "16Mi"}},
            },
            "gateway": {
                "replicas": 1,
                "resources": {"requests": {"cpu": CPU, "memory": "16Mi"}},
            },
        },
    }
    if prometheus:
        body["spec"]["autoscaling"] = {
            "enabled": True,
            "minReplicas": replicas,
            "maxReplicas": replicas,
            "prometheusURL": prometheus,
        }
    return body


class FakePrometheus:
    """A MOCK of Prometheus's query API (this benchmark measures the control plane, not
    Prometheus): it answers a query for one fleet (`pod=~"<fleet>-worker-..."`, as an operator
    before grouped queries asked) with that fleet's value, and a query for every fleet (`by
    (namespace, fleet)`) with one series per fleet of `fleets`. The load moves by up to 5 % from
    one tick to the next, as a real fleet's does, so the measured figures change every tick.
    It records when each query came and which fleet it named ("" for every fleet)."""

    def __init__(self, fleets: Sequence[str] = ()) -> None:
        self.queries: list[tuple[float, str, str]] = []
        """(monotonic time, fleet named or "", the signal's metric name)."""
        self.fleets = list(fleets)
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                promql = (query.get("query") or [""])[0]
                found = re.search(r'pod=~"\(?(f\d+)\)?-', promql)
                metric = re.search(r"(embedfleet_[a-z_]+)", promql)
                with outer.lock:
                    outer.queries.append(
                        (
                            time.monotonic(),
                            found.group(1) if found else "",
                            metric.group(1) if metric else "",
                        )
                    )
                value = outer.value(promql)
                if "by (namespace, fleet" in promql:
                    result = [
                        {"metric": {"namespace": NAMESPACE, "fleet": name}, "value": [0, value]}
                        for name in outer.fleets
                    ]
                else:
                    result = [{"metric": {}, "value": [0, value]}]
                body = json.dumps(
                    {"status": "success", "data": {"resultType": "vector", "result": result}}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    @staticmethod
    def value(promql: str) -> str:
        if "histogram_quantile" in promql:
            return "0.05"
        if "capacity" in promql:
            return "1000"
        if "tokens_total" in promql:  # the load: a new value every 5 s tick
            return f"{100 * (1 + 0.05 * math.sin(time.time() // 5)):.3f}"
        return "0"  # nothing queued, nothing held

    def between(self, began: float, ended: float) -> list[tuple[float, str, str]]:
        with self.lock:
            return [q for q in self.queries if began <= q[0] <= ended]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def latencies(starts: Mapping[str, float], ends: Mapping[str, float]) -> dict[str, Any]:
    values = [ends[k] - starts[k] for k in starts if k in ends]
    return {
        "count": len(values),
        "missing": len(starts) - len(values),
        "p50_s": _round(percentile(values, 50)),
        "p99_s": _round(percentile(values, 99)),
        "max_s": _round(max(values) if values else None),
    }


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def rolled_out(obj: Mapping[str, Any]) -> bool:
    """Available, for the current generation, with the rollout complete."""
    status = obj.get("status") or {}
    if status.get("observedGeneration") != obj["metadata"].get("generation"):
        return False
    conds = {c.get("type"): c for c in status.get("conditions") or ()}
    available = conds.get("Available", {}).get("status") == "True"
    return available and bool(conds.get("Progressing", {}).get("reason") == "RolloutComplete")


# -- what the cluster shows, as it shows it ------------------------------------------------------


@dataclass
class Timeline:
    """Monotonic times of what happened to each fleet, by name (first sight only)."""

    created: dict[str, float] = field(default_factory=dict)
    applied: dict[str, float] = field(default_factory=dict)
    available: dict[str, float] = field(default_factory=dict)
    changed: dict[str, float] = field(default_factory=dict)
    change_applied: dict[str, float] = field(default_factory=dict)
    #: wall-clock times: the spec change sent, and the operator's apply of the changed worker
    #: Deployment as the API server recorded it (its managedFields entry, 1 s resolution), so
    #: the operator's own delay can be told from this watcher's lag in seeing it
    changed_wall: dict[str, float] = field(default_factory=dict)
    change_applied_server: dict[str, float] = field(default_factory=dict)
    change_available: dict[str, float] = field(default_factory=dict)


class Watcher:
    """Watches fleets, worker Deployments and gateway PDBs; records first sights in a Timeline."""

    def __init__(self, api: ApiClient, timeline: Timeline) -> None:
        self.api = api
        self.t = timeline
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def start(self) -> None:
        selector = f"labelSelector={OURS}"
        for path, query, handle in (
            (EMB, "", self._fleet),
            (CHILD_PATHS["deployments"], selector, self._deployment),
            (CHILD_PATHS["poddisruptionbudgets"], selector, self._pdb),
        ):
            threading.Thread(target=self._run, args=(path, query, handle), daemon=True).start()

    def _run(self, path: str, query: str, handle: Callable[[dict[str, Any]], None]) -> None:
        # No resourceVersion: the server first replays every object as ADDED, so a reconnect
        # misses nothing (first sights are kept, repeats ignored).
        while not self.stopped.is_set():
            try:
                for event in self.api.watch(path, query, timeout_seconds=120):
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        handle(event["object"])
            except (OSError, ApiError, ValueError):
                self.stopped.wait(0.5)

    def _fleet(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if not rolled_out(obj):
            return
        now = time.monotonic()
        with self.lock:
            if obj["metadata"].get("generation") == 1:
                self.t.available.setdefault(name, now)
            elif name in self.t.changed:
                self.t.available.setdefault(name, now)
                self.t.change_available.setdefault(name, now)

    def _deployment(self, obj: dict[str, Any]) -> None:
        owner = (obj["metadata"].get("labels") or {}).get(OWNER_LABEL, "")
        if not obj["metadata"]["name"].endswith("-worker"):
            return
        containers = obj["spec"]["template"]["spec"]["containers"]
        cpu = ((containers[0].get("resources") or {}).get("requests") or {}).get("cpu")
        if cpu == CHANGED_CPU:
            applied = applied_at(obj)
            with self.lock:
                self.t.change_applied.setdefault(owner, time.monotonic())
                if applied is not None:
                    self.t.change_applied_server.setdefault(owner, applied)

    def _pdb(self, obj: dict[str, Any]) -> None:
        # The gateway's PDB is the last child a reconcile applies (manifests.children).
        owner = (obj["metadata"].get("labels") or {}).get(OWNER_LABEL, "")
        if obj["metadata"]["name"].endswith("-gateway"):
            with self.lock:
                self.t.applied.setdefault(owner, time.monotonic())


def applied_at(obj: Mapping[str, Any]) -> float | None:
    """Wall-clock time of the operator's last server-side apply to `obj`, from its managedFields
    (whole seconds: the API server truncates, so it reads up to 1 s early)."""
    for entry in obj["metadata"].get("managedFields") or ():
        if entry.get("manager") == MANAGER and entry.get("operation") == "Apply":
            stamp = entry.get("time")
            if stamp and not entry.get("subresource"):
                return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return None


CHILD_PATHS = {path.rsplit("/", 1)[1]: path for path in CHILDREN}


# -- the operator process ------------------------------------------------------------------------


@dataclass
class Sample:
    time: float
    rss_mb: float
    cpu_s: float


class Operator:
    """The operator as a local process with the admin kubeconfig; its RSS and CPU sampled."""

    def __init__(self, cluster: Cluster, run_dir: Path, pythonpath: str, lease_seconds: float):
        self.cluster = cluster
        self.log = run_dir / "operator.log"
        self.pythonpath = pythonpath
        self.lease_seconds = lease_seconds
        self.records: list[process.ProcessRecord] = []
        self.children: list[Any] = []
        self.samples: list[Sample] = []
        self.cpu_before = 0.0  # CPU seconds of operators that ran before the current one
        self._stop = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    @property
    def record(self) -> process.ProcessRecord:
        return self.records[-1]

    def start(self) -> str:
        (self.metrics_port,) = free_ports(1)
        identity = f"bench-operator-{len(self.records)}"
        env = {
            **os.environ,
            "KUBECONFIG": str(self.cluster.kubeconfig),
            "EMBEDFLEET_OPERATOR_LEASE_NAMESPACE": "default",
            "EMBEDFLEET_OPERATOR_LEASE_SECONDS": str(self.lease_seconds),
            "EMBEDFLEET_OPERATOR_IDENTITY": identity,
            "EMBEDFLEET_OPERATOR_METRICS_PORT": str(self.metrics_port),
            "EMBEDFLEET_OPERATOR_HEALTH_PORT": "0",
            "EMBEDFLEET_OPERATOR_LOG_LEVEL": "warning",
            "EMBEDFLEET_OPERATOR_WORKER_IMAGE": "example.invalid/worker:scale",
            "EMBEDFLEET_OPERATOR_GATEWAY_IMAGE": "example.invalid/gateway:scale",
        }
        if self.pythonpath:
            env["PYTHONPATH"] = self.pythonpath
        child, record = process.spawn("operator", [str(OPERATOR)], self.log, env)
        self.children.append(child)
        self.records.append(record)
        return identity

    def wait_leading(self, identity: str, timeout: float) -> float:
        began = time.monotonic()
        path = "/apis/coordination.k8s.io/v1/namespaces/default/leases/embedfleet-operator"

        def leads() -> bool:
            if not process.is_running(self.record):
                raise RuntimeError(process.died(self.record))
            status, text = self.cluster.api.request("GET", path)
            return status == 200 and json.loads(text)["spec"].get("holderIdentity") == identity

        wait_for(f"{identity} to lead", leads, timeout=timeout, interval=0.2)
        return time.monotonic() - began

    def kill(self) -> None:
        self.cpu_before += procfs.cpu_seconds(self.record.pid) or 0.0
        process.stop([self.record], self.children, grace_seconds=0.0)

    def stop(self) -> None:
        self._stop.set()
        left = process.stop(self.records, self.children)
        if left:
            raise RuntimeError(f"could not stop the operator (pid {left[0].pid})")

    def _samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """The samples named `name` on the current operator's /metrics (none if unreachable)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                text = response.read().decode()
        except OSError:
            return []
        return [
            (s.labels, s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == name
        ]

    def requests(self) -> dict[tuple[str, str], float]:
        """The operator's own embedfleet_operator_api_requests_total by (verb, resource)."""
        return {
            (labels["verb"], labels["resource"]): value
            for labels, value in self._samples("embedfleet_operator_api_requests_total")
        }

    def histogram(self, name: str, label: str = "") -> dict[str, tuple[float, float]]:
        """One of the operator's histograms: (sum, count) by `label`'s value ("" unlabelled)."""
        found: dict[str, list[float]] = {}
        for suffix, at in (("_sum", 0), ("_count", 1)):
            for labels, value in self._samples(name + suffix):
                found.setdefault(labels.get(label, ""), [0.0, 0.0])[at] += value
        return {k: (v[0], v[1]) for k, v in found.items()}

    def labelled(self, name: str, label: str) -> dict[str, float]:
        """One of the operator's counters by `label`'s value (empty when it has none)."""
        found: dict[str, float] = {}
        for labels, value in self._samples(name):
            found[labels.get(label, "")] = found.get(labels.get(label, ""), 0.0) + value
        return found

    def buckets(self, name: str, label: str = "") -> dict[str, dict[float, float]]:
        """One of the operator's histograms: cumulative counts by bound, by `label`'s value."""
        found: dict[str, dict[float, float]] = {}
        for labels, value in self._samples(name + "_bucket"):
            by_bound = found.setdefault(labels.get(label, ""), {})
            le = float(labels["le"])
            by_bound[le] = by_bound.get(le, 0.0) + value
        return found

    def counter(self, name: str) -> float:
        """One of the operator's counters, summed over its labels."""
        return sum(value for _, value in self._samples(name))

    def _sample(self) -> None:
        while not self._stop.wait(1.0):
            if not self.records or not process.is_running(self.record):
                continue
            pid = self.record.pid
            rss, cpu = procfs.rss_mb(pid), procfs.cpu_seconds(pid)
            if rss is not None and cpu is not None:
                self.samples.append(Sample(time.monotonic(), rss, self.cpu_before + cpu))


# -- phases --------------------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    seconds: float
    apiserver_per_min: dict[str, float]
    """Every client's requests per minute by verb."""
    operator_per_min: dict[str, float]
    """The operator's own requests per minute by verb (kopf's watch and Events aside)."""
    operator_writes_per_min: dict[str, float]
    """The operator's writes per minute by "VERB resource"."""
    apiserver_writes_per_min: dict[str, float]
    """Writes per minute on the operator's kinds by "VERB resource[/subresource]", any client."""
    operator_cpu_cores: float | None
    operator_rss_peak_mb: float | None
    apiserver_latency_ms: dict[str, float] = field(default_factory=dict)
    """The API server's mean request duration by verb (every client; watches aside)."""
    etcd_latency_ms: dict[str, float] = field(default_factory=dict)
    """The API server's mean etcd request duration by operation."""
    operator_queue_wait_ms: dict[str, float] = field(default_factory=dict)
    """The operator's mean wait in its work queue by lane (fleet, child, resync): trigger to run."""
    operator_reconcile_ms: float | None = None
    """The operator's mean reconcile duration (applies and status write)."""
    operator_queue_wait_p99_ms: dict[str, float] = field(default_factory=dict)
    """The same waits' p99 by lane, interpolated in the histogram's buckets."""
    operator_reconcile_p99_ms: float | None = None


@dataclass(frozen=True)
class Reading:
    """One scrape of the API server's /metrics: requests, request and etcd latencies."""

    counts: apimetrics.Counts
    latency: apimetrics.Totals
    etcd: apimetrics.Totals

    @classmethod
    def of(cls, cluster: Cluster) -> Reading:
        text = apimetrics.scrape(cluster.api)
        return cls(
            apimetrics.parse_requests(text),
            apimetrics.histogram_totals(text, "apiserver_request_duration_seconds", "verb"),
            apimetrics.histogram_totals(text, "etcd_request_duration_seconds", "operation"),
        )


def _ms(means: Mapping[str, float]) -> dict[str, float]:
    return {k: round(v * 1000, 1) for k, v in sorted(means.items())}


class Meter:
    """Counters at the start of a phase; `end` turns their growth into a Phase."""

    def __init__(self, cluster: Cluster, op: Operator, name: str) -> None:
        self.cluster, self.op, self.name = cluster, op, name
        self.began = time.monotonic()
        self.reading = Reading.of(cluster)
        self.own = op.requests()
        self.waits = op.histogram(QUEUE_WAIT, "lane")
        self.reconciles = op.histogram(RECONCILE)
        self.wait_buckets = op.buckets(QUEUE_WAIT, "lane")
        self.reconcile_buckets = op.buckets(RECONCILE)

    def end(self) -> Phase:
        now = time.monotonic()
        minutes = max(now - self.began, 1e-9) / 60
        reading = Reading.of(self.cluster)
        mean = apimetrics.mean_seconds
        api = apimetrics.delta(reading.counts, self.reading.counts)
        own_now = self.op.requests()
        own = {k: v - self.own.get(k, 0.0) for k, v in own_now.items() if v > self.own.get(k, 0.0)}
        by_verb: dict[str, float] = {}
        for (verb, _, _), n in api.items():
            by_verb[verb] = by_verb.get(verb, 0.0) + n
        own_verb: dict[str, float] = {}
        for (verb, _), n in own.items():
            own_verb[verb] = own_verb.get(verb, 0.0) + n
        writes = {
            f"{verb} {res}": n for (verb, res), n in own.items() if verb in ("POST", "PUT", "PATCH")
        }
        ours = apimetrics.writes(api, OPERATOR_RESOURCES, WRITES)
        api_writes = {f"{v} {r}{'/' + s if s else ''}": n for (v, r, s), n in ours.items()}
        window = [s for s in self.op.samples if self.began <= s.time <= now]
        cores = None
        if len(window) >= 2 and window[-1].time > window[0].time:
            cores = (window[-1].cpu_s - window[0].cpu_s) / (window[-1].time - window[0].time)
        return Phase(
            name=self.name,
            seconds=round(now - self.began, 1),
            apiserver_per_min=_per_min(by_verb, minutes),
            operator_per_min=_per_min(own_verb, minutes),
            operator_writes_per_min=_per_min(writes, minutes),
            apiserver_writes_per_min=_per_min(api_writes, minutes),
            operator_cpu_cores=_round(cores),
            operator_rss_peak_mb=_round(max((s.rss_mb for s in window), default=None), 1),
            apiserver_latency_ms=_ms(mean(reading.latency, self.reading.latency)),
            etcd_latency_ms=_ms(mean(reading.etcd, self.reading.etcd)),
            operator_queue_wait_ms=_ms(_means(self.op.histogram(QUEUE_WAIT, "lane"), self.waits)),
            operator_reconcile_ms=_ms(_means(self.op.histogram(RECONCILE), self.reconciles)).get(
                ""
            ),
            operator_queue_wait_p99_ms=_ms(
                p99s(self.op.buckets(QUEUE_WAIT, "lane"), self.wait_buckets)
            ),
            operator_reconcile_p99_ms=_ms(
                p99s(self.op.buckets(RECONCILE), self.reconcile_buckets)
            ).get(""),
        )


def p99s(
    now: Mapping[str, Mapping[float, float]], before: Mapping[str, Mapping[float, float]]
) -> dict[str, float]:
    """p99 of what a histogram observed between two reads, by label value (none observed: left
    out); linear within a bucket, as Prometheus's histogram_quantile."""
    found: dict[str, float] = {}
    for key, buckets in now.items():
        grown = signals.bucket_deltas(before.get(key, {}), buckets)
        if (p99 := signals.histogram_quantile(0.99, grown)) is not None:
            found[key] = p99
    return found


QUEUE_WAIT = "embedfleet_operator_queue_wait_seconds"
RECONCILE = "embedfleet_operator_reconcile_seconds"


def _means(
    now: Mapping[str, tuple[float, float]], before: Mapping[str, tuple[float, float]]
) -> dict[str, float]:
    """Mean seconds per label between two histogram readings (those with observations)."""
    out = {}
    for key, (total, count) in now.items():
        total0, count0 = before.get(key, (0.0, 0.0))
        if count > count0:
            out[key] = (total - total0) / (count - count0)
    return out


def _per_min(counts: Mapping[str, float], minutes: float) -> dict[str, float]:
    return {k: round(v / minutes, 1) for k, v in sorted(counts.items())}


def _boot(n: int, replicas: int, rate: ClientRate | None, syncs: int | None) -> Cluster:
    pods = n * (replicas + 1)
    nodes = max(1, math.ceil(pods * 1.2 / PODS_PER_NODE))
    shape = NodeShape(cpu="4000", memory="16Ti", pods=PODS_PER_NODE)
    config = ClusterConfig(
        gpu_nodes=nodes, node_shape=shape, build=False, client_rate=rate, controller_syncs=syncs
    )
    cluster = Cluster.start(config)
    try:
        cluster.kubectl("apply", "--server-side", "-f", str(CRD))
        cluster.wait_established("embeddingdeployments.embedfleet.dev")
        cluster.create_namespace(NAMESPACE)
    except BaseException:
        cluster.stop()
        raise
    return cluster


#: The bench's own writes retried on these (an overloaded etcd answers 500 "request timed out").
RETRIED = (429, 500, 503, 504)
RETRIES = 5
BENCH_RETRIES = [0]
"""How many of the bench's own writes were retried (reported: a sign of an overloaded etcd)."""


def _write(call: Callable[[], Any]) -> Any:
    """One write of the benchmark's client, retried a few times on an overloaded API server
    (the benchmark measures the operator; its own requests must land)."""
    for attempt in range(RETRIES):
        try:
            return call()
        except ApiError as err:
            if err.status not in RETRIED or attempt == RETRIES - 1:
                raise
        except TimeoutError:
            # No answer in time (at N=1,000 a DELETE during the garbage collector's cascade):
            # the request may or may not have landed, so only idempotent calls may pass here.
            if attempt == RETRIES - 1:
                raise
        BENCH_RETRIES[0] += 1
        time.sleep(1.0 + attempt)
    return None


def _delete(api: ApiClient, path: str) -> None:
    """A delete that may be retried: gone already (an earlier try landed) is done."""

    def once() -> None:
        try:
            api.delete(path)
        except ApiError as err:
            if err.status != 404:
                raise

    _write(once)


def _create(
    api: ApiClient, names: Iterable[str], replicas: int, t: Timeline, prometheus: str = ""
) -> None:
    def one(name: str) -> None:
        t.created[name] = time.monotonic()

        def once() -> None:
            try:
                api.create(EMB, fleet(name, replicas, prometheus))
            except ApiError as err:
                if err.status != 409:  # names are unique: 409 means an earlier try landed
                    raise

        _write(once)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, names))


def _wait_all(what: str, done: Callable[[], int], total: int, timeout: float) -> bool:
    """Waits until done() reaches total; False (not an exception) when time runs out."""
    try:
        wait_for(f"{what} ({total})", lambda: done() >= total, timeout=timeout, interval=0.5)
    except WaitTimeoutError:
        print(f"  timed out: {what}: {done()}/{total}", flush=True)
        return False
    return True


def _count(api: ApiClient, path: str, selector: str = "") -> int:
    query = f"?labelSelector={selector}&limit=1" if selector else "?limit=1"
    found = api.get(path + query)
    meta = found.get("metadata") or {}
    return len(found.get("items") or ()) + int(meta.get("remainingItemCount") or 0)


@dataclass
class Scenario:
    """One scenario's cluster, leading operator and fleet timeline."""

    names: list[str]
    timeout: float
    cluster: Cluster
    op: Operator
    t: Timeline
    watcher: Watcher


@contextlib.contextmanager
def scenario(n: int, args: argparse.Namespace) -> Iterator[Scenario]:
    """A fresh cluster sized for n fleets, the operator leading, the watcher recording; all of
    it stopped (processes by pid) however the scenario ends."""
    rate = (
        ClientRate(args.control_plane_qps, args.control_plane_burst)
        if args.control_plane_qps
        else None
    )
    cluster = _boot(n, args.replicas, rate, args.controller_syncs or None)
    op: Operator | None = None
    try:
        op = Operator(cluster, cluster.layout.run_dir, args.operator_pythonpath, args.lease_seconds)
        op.wait_leading(op.start(), timeout=120)
        t = Timeline()
        watcher = Watcher(cluster.api, t)
        watcher.start()
        names = [f"f{i:04d}" for i in range(n)]
        timeout = max(120.0, n * args.seconds_per_fleet)
        try:
            yield Scenario(names, timeout, cluster, op, t, watcher)
        finally:
            watcher.stopped.set()
    finally:
        if op is not None:
            op.stop()
        cluster.stop()


def run_size(n: int, args: argparse.Namespace) -> dict[str, Any]:
    with scenario(n, args) as sc:
        cluster, op, t, names, timeout = sc.cluster, sc.op, sc.t, sc.names, sc.timeout
        phases = []
        print(f"N={n}: creating", flush=True)
        meter = Meter(cluster, op, "create")
        _create(cluster.api, names, args.replicas, t)
        _wait_all("fleets available", lambda: len(t.available), n, timeout)
        phases.append(meter.end())
        create = {
            "applied": latencies(t.created, t.applied),
            "available": latencies(t.created, t.available),
        }

        print(f"N={n}: idle {args.idle_seconds:.0f} s", flush=True)
        time.sleep(args.settle_seconds)
        meter = Meter(cluster, op, "idle")
        time.sleep(args.idle_seconds)
        phases.append(meter.end())

        changed = names[:: max(1, round(1 / args.change_fraction))]
        print(f"N={n}: changing {len(changed)}", flush=True)
        meter = Meter(cluster, op, "change")
        patch = {"spec": {"worker": {"resources": {"requests": {"cpu": CHANGED_CPU}}}}}
        for name in changed:
            t.changed[name] = time.monotonic()
            t.changed_wall[name] = time.time()
            _write(functools.partial(cluster.api.patch, f"{EMB}/{name}", patch))
        _wait_all("changes rolled out", lambda: len(t.change_available), len(changed), timeout)
        phases.append(meter.end())
        starts = {k: t.changed[k] for k in changed}
        change = {
            "applied": latencies(starts, t.change_applied),
            "applied_server": latencies(
                {k: t.changed_wall[k] for k in changed}, t.change_applied_server
            ),
            "available": latencies(starts, t.change_available),
        }

        print(f"N={n}: deleting", flush=True)
        meter = Meter(cluster, op, "delete")
        began = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda name: _delete(cluster.api, f"{EMB}/{name}"), names))
        gone = _wait_all(
            "children gone",
            lambda: n - min(n, _count(cluster.api, CHILD_PATHS["deployments"], OURS) // 2),
            n,
            timeout,
        )
        delete_seconds = time.monotonic() - began
        phases.append(meter.end())
        return {
            "n": n,
            "replicas": args.replicas,
            "pods": n * (args.replicas + 1),
            "create": create,
            "change": {"fleets": len(changed), **change},
            "delete": {"all_children_gone_s": round(delete_seconds, 1), "complete": gone},
            "phases": [asdict(p) for p in phases],
            "operator_rss_peak_mb": _peak_rss(op),
        }


def _peak_rss(op: Operator) -> float | None:
    return _round(max((s.rss_mb for s in op.samples), default=None), 1)


def run_kill(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Kills the operator halfway through creating n fleets; the successor must converge all."""
    with scenario(n, args) as sc:
        cluster, op, t, names, timeout = sc.cluster, sc.op, sc.t, sc.names, sc.timeout
        print(f"kill at N={n}: creating", flush=True)
        creating = threading.Thread(target=_create, args=(cluster.api, names, args.replicas, t))
        creating.start()
        _wait_all("half the fleets applied", lambda: len(t.applied), n // 2, timeout)
        killed = time.monotonic()
        applied_at_kill = len(t.applied)
        op.kill()
        print(f"  killed with {applied_at_kill}/{n} applied; starting a successor", flush=True)
        op.wait_leading(op.start(), timeout=120)
        leading = time.monotonic()
        meter = Meter(cluster, op, "after the kill")
        creating.join()
        all_applied = _wait_all("fleets applied after the kill", lambda: len(t.applied), n, timeout)
        applied_after = time.monotonic() - killed
        converged = _wait_all(
            "fleets available after the kill", lambda: len(t.available), n, timeout
        )
        convergence = time.monotonic() - killed
        phase = meter.end()
        skipped = op.counter("embedfleet_operator_skipped_applies_total")
        time.sleep(5)  # anything a double reconcile would add shows now
        audit = _audit(cluster.api, names, args.replicas)
        after = sorted(v - leading for v in t.applied.values() if v > leading)
        # The successor at rest: its CPU and writes once everything converged (resyncs only).
        print(f"  converged; idle {args.idle_seconds:.0f} s", flush=True)
        resting = Meter(cluster, op, "idle after the kill")
        time.sleep(args.idle_seconds)
        idle = resting.end()
        return {
            "n": n,
            "applied_at_kill": applied_at_kill,
            "available_at_kill": sum(1 for v in t.available.values() if v <= killed),
            "successor_leading_after_s": round(leading - killed, 1),
            "first_applied_after_leading_s": _round(after[0] if after else None, 1),
            "fleets_applied_by_successor": len(after),
            "all_applied_after_kill_s": round(applied_after, 1) if all_applied else None,
            "kill_convergence_s": round(convergence, 1),
            "converged": converged,
            "lease_seconds": args.lease_seconds,
            "successor_skipped_applies": skipped,
            "phase": asdict(phase),
            "idle_phase": asdict(idle),
            "audit": audit,
            "operator_rss_peak_mb": _peak_rss(op),
        }


def run_prometheus(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """n autoscaled fleets in Prometheus mode at a steady, slightly moving load: how often the
    autoscaler decides for each fleet, what it asks of Prometheus and what it writes."""
    prometheus = FakePrometheus()
    try:
        with scenario(n, args) as sc:
            cluster, op, t, names, timeout = sc.cluster, sc.op, sc.t, sc.names, sc.timeout
            prometheus.fleets = list(names)
            print(f"Prometheus mode at N={n}: creating", flush=True)
            _create(cluster.api, names, args.replicas, t, prometheus.url)
            converged = _wait_all("fleets available", lambda: len(t.available), n, timeout)
            time.sleep(args.settle_seconds)
            decisions, writes = op.counter(DECISIONS), op.labelled(STATUS_WRITES, "kind")
            ticks = op.histogram(TICK)
            meter = Meter(cluster, op, "autoscaled")
            time.sleep(args.idle_seconds)
            phase = meter.end()
            decided = op.counter(DECISIONS) - decisions
            written = {
                k: v - writes.get(k, 0.0) for k, v in op.labelled(STATUS_WRITES, "kind").items()
            }
            tick_ms = _ms(_means(op.histogram(TICK), ticks)).get("")
    finally:
        prometheus.stop()
    asked = prometheus.between(meter.began, meter.began + phase.seconds)
    minutes = phase.seconds / 60
    if decided:  # the operator counts its decisions
        per_fleet = [decided / n / minutes] * n
        source = "the operator's decisions counter"
    else:  # an operator of before that counter: one worker-tokens query per fleet per tick
        counts: dict[str, int] = {}
        for _, name, metric in asked:
            if metric == "embedfleet_worker_tokens_total":
                counts[name] = counts.get(name, 0) + 1
        per_fleet = [counts.get(name, 0) / minutes for name in names]
        source = "one worker-tokens query per fleet per decision"
    return {
        "n": n,
        "converged": converged,
        "prometheus_queries_per_s": round(len(asked) / phase.seconds, 1),
        "prometheus_queries_per_fleet_decision": _round(
            len(asked) / max(sum(per_fleet) * minutes, 1e-9), 3
        ),
        "decisions_per_fleet_per_min": {
            "min": _round(min(per_fleet), 1),
            "p50": _round(percentile(per_fleet, 50), 1),
            "ideal": round(60 / 5.0, 1),
            "source": source,
        },
        "status_writes_per_decision": (
            {k: _round(v / decided, 3) for k, v in sorted(written.items())} if decided else None
        ),
        "autoscaler_tick_ms": tick_ms,
        "phase": asdict(phase),
    }


DECISIONS = "embedfleet_operator_autoscaler_decisions_total"
TICK = "embedfleet_operator_autoscaler_tick_seconds"
STATUS_WRITES = "embedfleet_operator_autoscaler_status_writes_total"


def _audit(api: ApiClient, names: Sequence[str], replicas: int) -> dict[str, Any]:
    """Children by kind against what N fleets should have; duplicates and orphans counted."""
    fleets = {o["metadata"]["name"]: o["metadata"]["uid"] for o in api.get(EMB)["items"]}
    by_kind: dict[str, Any] = {}
    orphans = 0
    for path, per_fleet in CHILDREN.items():
        items = api.get(f"{path}?labelSelector={OURS}")["items"]
        owners: dict[str, int] = {}
        for obj in items:
            owner = obj["metadata"]["labels"].get(OWNER_LABEL, "")
            refs = obj["metadata"].get("ownerReferences") or []
            if owner not in fleets or not any(r.get("uid") == fleets[owner] for r in refs):
                orphans += 1
            owners[owner] = owners.get(owner, 0) + 1
        kind = path.rsplit("/", 1)[1]
        by_kind[kind] = {
            "found": len(items),
            "expected": per_fleet * len(names),
            "fleets_with_other_count": sum(1 for name in names if owners.get(name) != per_fleet),
        }
    rs = api.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/replicasets")["items"]
    pods = [
        p
        for p in api.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
        if not p["metadata"].get("deletionTimestamp")
    ]
    duplicates = sum(max(0, k["found"] - k["expected"]) for k in by_kind.values())
    return {
        "fleets": len(fleets),
        "children": by_kind,
        "duplicates": duplicates,
        "orphans": orphans,
        "replicasets": {"found": len(rs), "expected": 2 * len(names)},
        "pods": {"found": len(pods), "expected": (replicas + 1) * len(names)},
    }


# -- report --------------------------------------------------------------------------------------


#: Writes on the operator's kinds that other controllers make (rollout and disruption status).
CONTROLLER_WRITES = ("deployments/status", "poddisruptionbudgets/status")


def operator_kind_writes(phase: Mapping[str, Any]) -> float:
    """Writes per minute on the operator's kinds, as the API server counted them, less the
    controllers' status writes: at idle nobody but the operator writes these."""
    writes: Mapping[str, float] = phase["apiserver_writes_per_min"]
    return round(
        sum(n for key, n in writes.items() if key.split(" ", 1)[1] not in CONTROLLER_WRITES), 1
    )


def change_applied_p99(change: Mapping[str, Any]) -> float | None:
    """The operator's spec change -> children applied p99: by the API server's record of its
    applies, plus the 1 s that record can read early (whole seconds), so the figure never flatters;
    the benchmark's watch saw them up to tens of seconds later at N = 1,000 (its own lag). The
    watch's figure where there is no record (runs before it was read)."""
    server = (change.get("applied_server") or {}).get("p99_s")
    if server is not None:
        return round(float(server) + 1.0, 3)
    value: float | None = change["applied"]["p99_s"]
    return value


def check_targets(sizes: Sequence[dict[str, Any]], kill: dict[str, Any] | None) -> dict[str, Any]:
    """Each target at the largest N: the figure, the limit, whether it holds."""
    out: dict[str, Any] = {}
    if sizes:
        top = max(sizes, key=lambda s: s["n"])
        idle = next(p for p in top["phases"] if p["name"] == "idle")
        own = sum(n for k, n in idle["operator_writes_per_min"].items() if "leases" not in k)
        figures = {
            "change_applied_p99_s": change_applied_p99(top["change"]),
            "operator_rss_peak_mb": top["operator_rss_peak_mb"],
            # Both counts: the operator's own, and the API server's (which sees kopf too).
            "idle_operator_writes_per_min": max(round(own, 1), operator_kind_writes(idle)),
        }
        for key, value in figures.items():
            limit = TARGETS[key]
            holds = value is not None and (value <= limit if limit == 0 else value < limit)
            out[key] = {"n": top["n"], "value": value, "limit": limit, "holds": holds}
    if kill is not None:
        value = kill["kill_convergence_s"]
        audit = kill["audit"]
        clean = audit["duplicates"] == 0 and audit["orphans"] == 0 and kill["converged"]
        out["kill_convergence_s"] = {
            "n": kill["n"],
            "value": value,
            "limit": TARGETS["kill_convergence_s"],
            "holds": clean and value < TARGETS["kill_convergence_s"],
        }
    return out


def prometheus_paragraph(p: Mapping[str, Any]) -> str:
    """The autoscaler's figures in Prometheus mode, as one paragraph."""
    ph = p["phase"]
    return (
        f"Autoscaler in Prometheus mode at N={p['n']} (steady load moving by up to 5 %, "
        f"replicas pinned): decisions per fleet per minute "
        f"min {p['decisions_per_fleet_per_min']['min']} / "
        f"p50 {p['decisions_per_fleet_per_min']['p50']}"
        f" (ideal {p['decisions_per_fleet_per_min']['ideal']}; from "
        f"{p['decisions_per_fleet_per_min']['source']}), mean tick "
        f"{p['autoscaler_tick_ms']} ms, {p['prometheus_queries_per_s']} Prometheus queries/s "
        f"({p['prometheus_queries_per_fleet_decision']} per fleet decision), status writes "
        f"per decision {p['status_writes_per_decision']}, operator writes/min "
        f"{ph['operator_writes_per_min']}, API server requests/min "
        f"{ph['apiserver_per_min']}, operator CPU {ph['operator_cpu_cores']} cores, "
        f"RSS peak {ph['operator_rss_peak_mb']} MB."
    )


def kill_paragraph(k: Mapping[str, Any]) -> str:
    """The leader's SIGKILL and its successor's convergence, as one paragraph."""
    a = k["audit"]
    return (
        f"Kill at N={k['n']}: SIGKILL with {k['applied_at_kill']} fleets applied "
        f"({k['available_at_kill']} Available); the successor led after "
        f"{k['successor_leading_after_s']} s (Lease {k['lease_seconds']} s), every fleet's "
        f"children were applied {k['all_applied_after_kill_s']} s and every fleet "
        f"Available {k['kill_convergence_s']} s after "
        f"the kill (converged: {k['converged']}); duplicates {a['duplicates']}, orphans "
        f"{a['orphans']}, ReplicaSets {a['replicasets']['found']}/"
        f"{a['replicasets']['expected']}, pods {a['pods']['found']}/{a['pods']['expected']}."
    )


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Operator at scale",
        "",
        f"`{result['command']}` on {result['machine']}."
        + (
            f" Sizes from an earlier run: `{result['previous']['command']}`."
            if result.get("previous")
            else ""
        ),
        "",
        "| N | pods | create→applied p50/p99 s | create→Available p50/p99 s | "
        "change→applied p50/p99 s | change→Available p50/p99 s | RSS peak MB | "
        "CPU cores create/idle/change | apiserver req/min create (all clients) | "
        "operator req/min create | operator writes/min idle (own count) | writes/min idle on "
        "the operator's kinds (API server) | delete→children gone s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in result["sizes"]:
        ph = {p["name"]: p for p in s["phases"]}

        def pair(d: Mapping[str, Any]) -> str:
            miss = f" ({d['missing']} missing)" if d["missing"] else ""
            return f"{d['p50_s']} / {d['p99_s']}{miss}"

        def verbs(d: Mapping[str, float]) -> str:
            return ", ".join(f"{k} {v:g}" for k, v in d.items()) or "0"

        cores = " / ".join(str(ph[k]["operator_cpu_cores"]) for k in ("create", "idle", "change"))
        lines.append(
            f"| {s['n']} | {s['pods']} | {pair(s['create']['applied'])} | "
            f"{pair(s['create']['available'])} | {pair(s['change']['applied'])} | "
            f"{pair(s['change']['available'])} | {s['operator_rss_peak_mb']} | {cores} | "
            f"{verbs(ph['create']['apiserver_per_min'])} | "
            f"{verbs(ph['create']['operator_per_min'])} | "
            f"{verbs(ph['idle']['operator_writes_per_min'])} | "
            f"{operator_kind_writes(ph['idle'])} | "
            f"{s['delete']['all_children_gone_s']} |"
        )
    for s in result["sizes"]:
        change = {p["name"]: p for p in s["phases"]}["change"]
        if change.get("operator_queue_wait_ms"):
            lines += ["", change_breakdown(s["n"], change, s["change"])]
    if result.get("prometheus"):
        lines += ["", prometheus_paragraph(result["prometheus"])]
    if result.get("kill"):
        lines += ["", kill_paragraph(result["kill"])]
        if result["kill"].get("phase"):
            lines += ["", kill_breakdown(result["kill"])]
    lines += ["", "| target | N | value | limit | holds |", "|---|---|---|---|---|"]
    for key, t in result["targets"].items():
        lines.append(f"| {key} | {t['n']} | {t['value']} | {t['limit']} | {t['holds']} |")
    return "\n".join(lines) + "\n"


def _ms_list(ms: Mapping[str, float]) -> str:
    return ", ".join(f"{key} {value:g} ms" for key, value in ms.items())


def _api_latency(ph: Mapping[str, Any]) -> str:
    return _ms_list({k: v for k, v in ph["apiserver_latency_ms"].items() if k != "WATCH"})


def change_breakdown(n: int, ph: Mapping[str, Any], change: Mapping[str, Any]) -> str:
    """Where a spec change's time went: the operator's queue, its reconcile, the API server."""
    server = change.get("applied_server")
    recorded = (
        f"change→applied as the API server recorded the operator's apply (managedFields, 1 s "
        f"resolution) p50/p99 {server['p50_s']} / {server['p99_s']} s, max {server['max_s']} "
        f"s ({server['missing']} missing), against {change['applied']['p50_s']} / "
        f"{change['applied']['p99_s']} s as the benchmark's watch saw it; "
        if server
        else ""
    )
    return (
        f"Spec change at N={n}: {recorded}the operator's mean wait in its work queue by lane "
        f"{_ms_list(ph['operator_queue_wait_ms'])} (p99 "
        f"{_ms_list(ph.get('operator_queue_wait_p99_ms') or {})}); its "
        f"mean reconcile {ph.get('operator_reconcile_ms')} ms (p99 "
        f"{ph.get('operator_reconcile_p99_ms')} ms); the API server's mean "
        + _api_latency(ph)
        + "."
    )


def kill_breakdown(k: Mapping[str, Any]) -> str:
    """Where the time after a kill went: the Lease, the successor's applies, the rollouts."""
    ph = k["phase"]
    lead, applied, available = (
        k["successor_leading_after_s"],
        k["all_applied_after_kill_s"],
        k["kill_convergence_s"],
    )
    applies = sum(n for key, n in ph["apiserver_writes_per_min"].items() if key.startswith("APPLY"))
    applies_done = round(applies * ph["seconds"] / 60)
    work = "" if applied is None else f"{round(applied - lead, 1)} s of applies, then "
    rollouts = "" if applied is None else f"{round(available - applied, 1)} s of rollouts"
    return (
        f"Breakdown: {lead} s waiting for the Lease (its {k['lease_seconds']} s expiry, counted "
        f"from the successor's first look, plus the successor's start), {work}{rollouts} to "
        f"Available. The successor applied about {applies_done} children of "
        f"{k['fleets_applied_by_successor']} fleets and skipped {k['successor_skipped_applies']:g} "
        f"applies of children already as desired; the API server's mean latency meanwhile: "
        + _api_latency(ph)
        + "; etcd's: "
        + _ms_list(ph["etcd_latency_ms"])
        + f"; the successor's CPU {ph['operator_cpu_cores']} cores"
        + (
            "; its mean wait in the work queue by lane: "
            + _ms_list(ph["operator_queue_wait_ms"])
            + f", its mean reconcile {ph.get('operator_reconcile_ms')} ms"
            if ph.get("operator_queue_wait_ms")
            else ""
        )
        + "."
        + _resting(k.get("idle_phase"))
    )


def _resting(idle: Mapping[str, Any] | None) -> str:
    if not idle:
        return ""
    writes = sum(n for key, n in idle["operator_writes_per_min"].items() if "leases" not in key)
    return (
        f" Then, idle for {idle['seconds']} s: the successor's CPU {idle['operator_cpu_cores']} "
        f"cores, its writes {round(writes, 1)}/min besides its Lease, its requests "
        + ", ".join(f"{verb} {n:g}" for verb, n in idle["operator_per_min"].items())
        + " per minute."
    )


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(result["sizes"], key=lambda s: s["n"])
    if not sizes:
        return
    ns = [s["n"] for s in sizes]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    for phase, what, style in (
        ("create", "applied", "-o"),
        ("create", "available", "-s"),
        ("change", "applied", "--o"),
        ("change", "available", "--s"),
    ):
        ax.plot(
            ns, [s[phase][what]["p99_s"] or 0 for s in sizes], style, label=f"{phase}→{what} p99"
        )
    ax.axhline(TARGETS["change_applied_p99_s"], color="grey", lw=0.8, ls=":")
    ax.set(xscale="log", yscale="log", xlabel="EmbeddingDeployments", ylabel="seconds")
    ax.set_title("latency p99")
    ax.legend(fontsize=7)
    ax = axes[1]
    ax.plot(ns, [s["operator_rss_peak_mb"] or 0 for s in sizes], "-o", label="RSS peak MB")
    ax.axhline(TARGETS["operator_rss_peak_mb"], color="grey", lw=0.8, ls=":")
    ax.set(xscale="log", xlabel="EmbeddingDeployments", ylabel="MB")
    ax2 = ax.twinx()
    cores = [
        next(p for p in s["phases"] if p["name"] == "create")["operator_cpu_cores"] or 0
        for s in sizes
    ]
    ax2.plot(ns, cores, "--s", color="C1", label="CPU cores (create)")
    ax2.set_ylabel("cores")
    ax.set_title("operator RSS and CPU")
    ax.legend(loc="upper left", fontsize=7)
    ax2.legend(loc="lower right", fontsize=7)
    ax = axes[2]
    verbs = sorted({v for s in sizes for p in s["phases"] for v in p["apiserver_per_min"]})
    create = [next(p for p in s["phases"] if p["name"] == "create") for s in sizes]
    for verb in verbs:
        ax.plot(ns, [p["apiserver_per_min"].get(verb, 0) for p in create], "-o", label=verb)
    idle = [next(p for p in s["phases"] if p["name"] == "idle") for s in sizes]
    ax.plot(
        ns,
        [
            sum(v for k, v in p["operator_writes_per_min"].items() if "leases" not in k)
            for p in idle
        ],
        "k--x",
        label="operator writes idle",
    )
    ax.set(xscale="log", yscale="symlog", xlabel="EmbeddingDeployments", ylabel="requests/min")
    ax.set_title("API server requests/min during create (all clients)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedfleet.bench.operator_scale")
    parser.add_argument("--sizes", default="10,100,1000", help="fleet counts, comma-separated")
    parser.add_argument("--replicas", type=int, default=5, help="worker replicas per fleet")
    parser.add_argument("--change-fraction", type=float, default=0.1)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--settle-seconds", type=float, default=15.0)
    parser.add_argument("--kill", type=int, default=0, help="N for the kill test; 0 skips it")
    parser.add_argument(
        "--prometheus", type=int, default=0, help="N for the Prometheus-mode autoscaler run"
    )
    parser.add_argument("--lease-seconds", type=float, default=15.0)
    parser.add_argument(
        "--control-plane-qps",
        type=float,
        default=CONTROL_PLANE_RATE.qps,
        help="client QPS of the controller-manager and scheduler (0: their defaults, 20 and 50)",
    )
    parser.add_argument("--control-plane-burst", type=int, default=CONTROL_PLANE_RATE.burst)
    parser.add_argument(
        "--controller-syncs",
        type=int,
        default=CONTROLLER_SYNCS,
        help="Deployments and ReplicaSets the controller-manager syncs at once (0: its 5)",
    )
    parser.add_argument(
        "--seconds-per-fleet",
        type=float,
        default=0.6,
        help="bound on each wait: this many seconds per fleet (at least 120)",
    )
    parser.add_argument(
        "--operator-pythonpath",
        default="",
        help="PYTHONPATH for the operator process (another tree's sources, for a baseline)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--previous",
        type=Path,
        default=None,
        help="a results.json whose sizes (not run again) join this run's table and plot",
    )
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.sizes.split(",") if n.strip() and int(n) > 0]
    result: dict[str, Any] = {
        "command": "python -m embedfleet.bench.operator_scale " + " ".join(argv or sys.argv[1:]),
        "machine": f"{os.cpu_count()} cores, shared (load {os.getloadavg()[0]:.1f} at start)",
        "sizes": [],
        "kill": None,
        "prometheus": None,
    }
    if args.previous is not None:
        earlier = json.loads(args.previous.read_text())
        result["sizes"] = [s for s in earlier["sizes"] if s["n"] not in sizes]
        result["previous"] = {"file": str(args.previous), "command": earlier["command"]}
    args.out.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        result["bench_write_retries"] = BENCH_RETRIES[0]
        # After every size: a run cut short keeps what it measured.
        result["targets"] = check_targets(result["sizes"], result["kill"])
        (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
        (args.out / "results.md").write_text(markdown(result))
        plot(result, args.out / "operator_scale.png")

    for n in sizes:
        result["sizes"].append(run_size(n, args))
        print(json.dumps(result["sizes"][-1]["create"]), json.dumps(result["sizes"][-1]["change"]))
        write()
    if args.prometheus:
        result["prometheus"] = run_prometheus(args.prometheus, args)
        write()
    if args.kill:
        result["kill"] = run_kill(args.kill, args)
        write()
    print(markdown(result))
    return 0 if all(t["holds"] for t in result["targets"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""The operator's own Prometheus metrics."""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter(
    "embedfleet_operator_reconciles_total",
    "Reconciles of an EmbeddingDeployment, by result (ok, error).",
    ["result"],
)
RECONCILE_ERRORS = Counter(
    "embedfleet_operator_reconcile_errors_total",
    "Reconciles that failed (an API call refused or unreachable).",
)
RECONCILE_SECONDS = Histogram(
    "embedfleet_operator_reconcile_seconds",
    "Duration of one reconcile: apply every child and write status.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
QUEUE_WAIT_SECONDS = Histogram(
    "embedfleet_operator_queue_wait_seconds",
    "From a fleet's first trigger to the start of its reconcile, by the work queue's lane "
    "(fleet: its spec or status changed; child: a child changed; resync).",
    ["lane"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
API_REQUESTS = Counter(
    "embedfleet_operator_api_requests_total",
    "Requests the operator's own client sent to the API server (kopf's watch of "
    "EmbeddingDeployments and its Events aside), by HTTP verb and resource.",
    ["verb", "resource"],
)
RECONCILES_UNCHANGED = Counter(
    "embedfleet_operator_reconciles_unchanged_total",
    "Reconciles that found nothing they read changed since the fleet's last clean reconcile "
    "(its body, its children's versions), so rendered nothing (reconciler.py).",
)
RECONCILE_SKIPPED_APPLIES = Counter(
    "embedfleet_operator_skipped_applies_total",
    "Children not applied because they already matched the desired state (desired.py).",
)
LEADER = Gauge(
    "embedfleet_operator_leader",
    "1 while this replica holds the leader Lease (or leader election is off), 0 on a standby.",
)
DESIRED_REPLICAS = Gauge(
    "embedfleet_operator_desired_replicas",
    "Worker replicas the operator asks for, per EmbeddingDeployment.",
    ["namespace", "deployment"],
)
READY_REPLICAS = Gauge(
    "embedfleet_operator_ready_replicas",
    "Worker replicas ready, per EmbeddingDeployment.",
    ["namespace", "deployment"],
)


def forget(namespace: str, name: str) -> None:
    """Drops a deleted EmbeddingDeployment's series."""
    for gauge in (DESIRED_REPLICAS, READY_REPLICAS):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, name)

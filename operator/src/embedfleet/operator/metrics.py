"""The operator's own Prometheus metrics, the autoscaler's included: each declared once, here,
as data (embedfleet.common.metrics), and built into the process's default registry."""

from __future__ import annotations

import contextlib

from prometheus_client import REGISTRY

from embedfleet.common.metrics import Table, counter, gauge, histogram

TABLE = Table(REGISTRY)
_RECONCILE_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

RECONCILES = TABLE.build(
    counter(
        "embedfleet_operator_reconciles_total",
        "Reconciles of an EmbeddingDeployment, by result (ok, error).",
        ("result",),
    )
)
RECONCILE_ERRORS = TABLE.build(
    counter(
        "embedfleet_operator_reconcile_errors_total",
        "Reconciles that failed (an API call refused or unreachable).",
    )
)
RECONCILE_SECONDS = TABLE.build(
    histogram(
        "embedfleet_operator_reconcile_seconds",
        "Duration of one reconcile: apply every child and write status.",
        buckets=_RECONCILE_SECONDS,
    )
)
QUEUE_WAIT_SECONDS = TABLE.build(
    histogram(
        "embedfleet_operator_queue_wait_seconds",
        "From a fleet's first trigger to the start of its reconcile, by the work queue's lane "
        "(fleet: its spec or status changed; child: a child changed; resync).",
        ("lane",),
        buckets=(*_RECONCILE_SECONDS, 30.0, 60.0),
    )
)
API_REQUESTS = TABLE.build(
    counter(
        "embedfleet_operator_api_requests_total",
        "Requests the operator's own client sent to the API server (kopf's watch of "
        "EmbeddingDeployments and its Events aside), by HTTP verb and resource.",
        ("verb", "resource"),
    )
)
RECONCILES_UNCHANGED = TABLE.build(
    counter(
        "embedfleet_operator_reconciles_unchanged_total",
        "Reconciles that found nothing they read changed since the fleet's last clean "
        "reconcile (its body, its children's versions), so rendered nothing (reconciler.py).",
    )
)
RECONCILE_SKIPPED_APPLIES = TABLE.build(
    counter(
        "embedfleet_operator_skipped_applies_total",
        "Children not applied because they already matched the desired state (desired.py).",
    )
)
LEADER = TABLE.build(
    gauge(
        "embedfleet_operator_leader",
        "1 while this replica holds the leader Lease (or leader election is off), 0 on a standby.",
    )
)
DESIRED_REPLICAS = TABLE.build(
    gauge(
        "embedfleet_operator_desired_replicas",
        "Worker replicas the operator asks for, per EmbeddingDeployment.",
        ("namespace", "deployment"),
    )
)
READY_REPLICAS = TABLE.build(
    gauge(
        "embedfleet_operator_ready_replicas",
        "Worker replicas ready, per EmbeddingDeployment.",
        ("namespace", "deployment"),
    )
)

# The autoscaler's (docs/autoscaling.md).
SCALE_DECISIONS = TABLE.build(
    counter(
        "embedfleet_operator_scale_decisions_total",
        "Autoscaler decisions that changed the worker replica count, by reason.",
        ("namespace", "deployment", "reason"),
    )
)
DECISIONS = TABLE.build(
    counter(
        "embedfleet_operator_autoscaler_decisions_total",
        "Autoscaler decisions made: one per autoscaled fleet per tick, and one per wake.",
    )
)
TICK_SECONDS = TABLE.build(
    histogram(
        "embedfleet_operator_autoscaler_tick_seconds",
        "Duration of one autoscaler tick over every autoscaled fleet (a tick starts every 5 s; "
        "one longer than that delays the next).",
        buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    )
)
STATUS_WRITES = TABLE.build(
    counter(
        "embedfleet_operator_autoscaler_status_writes_total",
        "status.autoscaling writes the autoscaler made, by kind (decision: a new replica count, "
        "reason or scale time; refresh: measurements only) and result (ok, error).",
        ("kind", "result"),
    )
)


def forget(namespace: str, name: str) -> None:
    """Drops a deleted EmbeddingDeployment's series."""
    for gauge_ in (DESIRED_REPLICAS, READY_REPLICAS):
        with contextlib.suppress(KeyError):
            gauge_.remove(namespace, name)

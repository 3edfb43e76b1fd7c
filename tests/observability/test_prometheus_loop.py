"""Every query of every dashboard panel returns data from a real Prometheus scraping a real fleet.

The fleet: `embedfleet.fleet.supervisor.Fleet` (the code behind `embedfleet serve`: the gateway
and two MiniLM workers on 127.0.0.1) under load from two clients, plus the operator (run locally
against the test control plane) reconciling examples/minilm.yaml, whose pods are KWOK fakes.
Prometheus (Debian's package) scrapes all of them every second and also loads the alert rules,
which must evaluate without errors. A failing query is reported by dashboard and panel title.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from embedfleet.common.net import free_ports
from embedfleet.testing.cluster import Cluster
from embedfleet.testing.polling import WaitTimeoutError, wait_for
from embedfleet.testing.process import log_tail, spawn, stop

from .helpers import (
    CPU_GAPS,
    REPO_ROOT,
    Load,
    Prometheus,
    finite_points,
    missing_data,
    start_prometheus,
)

EXAMPLE = REPO_ROOT / "examples" / "minilm.yaml"
WINDOW_SECONDS = 30.0


def gaps() -> dict[str, str]:
    """The local fleet's workers pick CUDA where there is one (--device auto)."""
    import torch

    return {} if torch.cuda.is_available() else CPU_GAPS


@pytest.fixture(scope="module")
def operator_target(
    k8s_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The operator's metrics host:port, after it reconciled the MiniLM example once."""
    namespace = f"observability-{os.getpid()}"
    k8s_cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(REPO_ROOT / "crds")
    )
    k8s_cluster.wait_established("embeddingdeployments.embedfleet.dev")
    k8s_cluster.create_namespace(namespace)
    metrics_port, health_port = free_ports(2)
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    env = {
        **os.environ,
        "KUBECONFIG": str(k8s_cluster.kubeconfig),
        "EMBEDFLEET_OPERATOR_NAMESPACE": namespace,
        "EMBEDFLEET_OPERATOR_LEASE_NAMESPACE": namespace,
        "EMBEDFLEET_OPERATOR_METRICS_PORT": str(metrics_port),
        "EMBEDFLEET_OPERATOR_HEALTH_PORT": str(health_port),
        "EMBEDFLEET_OPERATOR_RESYNC_SECONDS": "5",
    }
    operator = Path(sys.executable).with_name("embedfleet-operator")
    process, record = spawn("operator", [str(operator)], log, env)
    try:
        k8s_cluster.kubectl("apply", "-n", namespace, "-f", str(EXAMPLE))
        yield f"127.0.0.1:{metrics_port}"
    finally:
        stop([record], [process], grace_seconds=20)
        k8s_cluster.delete_namespace(namespace)
    assert process.returncode in (0, -15), log_tail(log)


@pytest.fixture(scope="module")
def prometheus(
    fleet_jobs: dict[str, list[str]],
    operator_target: str,
    load: Load,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Prometheus]:
    jobs = {**fleet_jobs, "embedfleet-operator": [operator_target]}
    prom = start_prometheus(tmp_path_factory.mktemp("prometheus"), jobs)
    try:
        yield prom
    finally:
        prom.stop()


def test_every_panel_query_returns_data(prometheus: Prometheus, load: Load) -> None:
    wait_for(
        "all scrape targets up",
        lambda: all(prometheus.targets_up().values()) or None,
        timeout=60,
    )
    failures: dict[str, str] = {}

    def settled() -> bool:
        nonlocal failures
        failures = missing_data(prometheus, WINDOW_SECONDS, gaps())
        return not failures and sum(load.codes.values()) > 20

    # Rates need two scrapes inside the window and the operator a reconcile: poll, then report.
    with contextlib.suppress(WaitTimeoutError):
        wait_for("every panel to have data", settled, timeout=120, interval=3)
    assert not failures, "panels without data:\n" + "\n".join(
        f"  {k}: {v}" for k, v in sorted(failures.items())
    )
    assert load.codes[200] > 0, load.codes
    assert any(400 <= c < 500 for c in load.codes), load.codes
    assert not load.codes.get(0), load.codes
    assert not any(c >= 500 for c in load.codes), load.codes


def test_alert_rules_evaluate_cleanly(prometheus: Prometheus) -> None:
    def rules() -> list[dict[str, Any]] | None:
        groups = prometheus.api("rules")["groups"]
        found = [r for g in groups for r in g["rules"]]
        # Evaluated at least once (1s interval) once lastEvaluation is set.
        done = found and all(not r["lastEvaluation"].startswith("0001") for r in found)
        return found if done else None

    found = wait_for("alert rules evaluated", rules, timeout=30)
    assert len(found) == 13
    bad = {r["name"]: r.get("lastError") for r in found if r["health"] != "ok"}
    assert not bad, bad
    # A healthy fleet under load fires nothing (the alerts' `for` would not have passed anyway).
    firing = [r["name"] for r in found if r.get("state") == "firing"]
    assert not firing
    ratio = prometheus.query_range("embedfleet:gateway_error_ratio:rate5m", 10)
    assert finite_points(ratio) > 0, "the SLO recording rule has no data"

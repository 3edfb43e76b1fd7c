"""SIGTERM ends the operator at once, however busy it is (issue 14).

A pod that outlives SIGTERM costs the full termination grace period on every rollout, and a test
teardown that waits for it fails. So the operator is stopped again and again while every loop is
mid-call: reconciles of several fleets, the autoscaler's ticks (scraping pods that never answer),
the leader lease's renewals. Its API server is slow: every reply comes LATENCY seconds late (a
proxy in between), as on a loaded machine, so at any moment some calls are in flight.
"""

from __future__ import annotations

import json
import signal
import socket
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from embedfleet.operator.autoscaling.signals import METRICS_URL_ANNOTATION
from embedfleet.testing.cluster import Cluster

from .helpers import LatencyProxy, OperatorProcess, operator_kubeconfig, wait_until

FLEETS = 4
LATENCY = 0.4
#: Exit must come far below Kubernetes' default grace period (30 s); releasing the lease (two
#: round trips) and kopf's own teardown fit well within it.
BOUND_SECONDS = 5.0
#: The SIGTERMs land at different moments of the loops' cycles.
RUN_SECONDS = (1.0, 1.7, 2.5, 3.2)
#: Every moment twice, ~8 s a try (a start, the watch check, the run, the exit). The p99 below is
#: the slowest exit at any count up to 50, so more tries only repeat moments already covered.
TRIES = 2 * len(RUN_SECONDS)


def fleet(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "embedfleet.dev/v1alpha1",
        "kind": "EmbeddingDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"source": "file:///opt/embedfleet/models/all-MiniLM-L6-v2"},
            "worker": {"replicas": 1},
        },
    }


def watching(cluster: Cluster, namespace: str, fleet_name: str, op: OperatorProcess) -> None:
    """Returns once the operator's watches are live: a deleted child is back (resync is off)."""
    config = f"configmap/{fleet_name}-config"
    cluster.kubectl("delete", "-n", namespace, config, "--wait=true")

    def back() -> bool:
        return cluster.kubectl("get", "-n", namespace, config, check=False).returncode == 0

    wait_until(f"{config} repaired", back, op)


def reconciled(cluster: Cluster, namespace: str, count: int) -> bool:
    found = json.loads(cluster.kubectl("get", "emb", "-n", namespace, "-o", "json").stdout)
    done = [e for e in found["items"] if (e.get("status") or {}).get("observedGeneration")]
    return len(done) == count


@pytest.fixture
def silent_metrics() -> Iterator[str]:
    """A metrics URL whose server accepts connections and never answers: scrapes stay in flight."""
    with socket.create_server(("127.0.0.1", 0), backlog=128) as listener:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/metrics"


def create_fleets(cluster: Cluster, namespace: str) -> Callable[[], bool]:
    """FLEETS EmbeddingDeployments; returns a probe: are all their (KWOK) pods running?"""
    for i in range(FLEETS):
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(fleet(f"f{i}")))

    def pods_running() -> bool:
        found = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)
        running = [p for p in found["items"] if p["status"].get("phase") == "Running"]
        return len(running) == 2 * FLEETS  # one worker and one gateway each

    return pods_running


@pytest.fixture
def proxy(operator_rbac: Cluster) -> Iterator[LatencyProxy]:
    server = urlsplit(operator_rbac.server)
    slow = LatencyProxy((str(server.hostname), int(server.port or 443)), LATENCY)
    try:
        yield slow
    finally:
        slow.close()


@pytest.fixture
def proxied_kubeconfig(operator_rbac: Cluster, proxy: LatencyProxy, tmp_path: Path) -> Path:
    return operator_kubeconfig(
        operator_rbac, tmp_path / "kubeconfig", f"https://127.0.0.1:{proxy.port}"
    )


def test_sigterm_exits_promptly_while_every_loop_is_busy(
    operator_rbac: Cluster,
    k8s_namespace: str,
    proxied_kubeconfig: Path,
    silent_metrics: str,
    tmp_path: Path,
) -> None:
    cluster = operator_rbac
    op = OperatorProcess(
        cluster,
        proxied_kubeconfig,
        tmp_path / "log",
        lease_name=f"shutdown-{k8s_namespace[-6:]}",
        extra_env={
            "EMBEDFLEET_OPERATOR_NAMESPACE": k8s_namespace,
            # Only watch events trigger reconciles (see watching() below); the autoscaler's
            # status writes and the repaired children make plenty.
            "EMBEDFLEET_OPERATOR_RESYNC_SECONDS": "600",
            "EMBEDFLEET_OPERATOR_LEASE_SECONDS": "2",
        },
    )
    pods_running = create_fleets(cluster, k8s_namespace)
    op.start()
    try:
        wait_until(f"{2 * FLEETS} pods running", pods_running, op, timeout=120)
        # A fleet the autoscaler leaves alone: only kopf's watch can repair its children, and
        # kopf starts watching only after its start-up scan of the API (the autoscaler's own
        # reconciles of the f* fleets can repair theirs earlier). That scan runs in tasks of
        # kopf's own, which kopf gives 5 s after the cleanup, so SIGTERM must land after it.
        watched = json.dumps(fleet("watched"))
        cluster.kubectl("apply", "-n", k8s_namespace, "-f", "-", input=watched)
        wait_until(
            "the watched fleet reconciled",
            lambda: reconciled(cluster, k8s_namespace, FLEETS + 1),
            op,
        )
        # Autoscaling goes on only once every pod points its metrics at the silent server, so no
        # scrape ever goes to a fake pod IP.
        cluster.kubectl(
            "annotate", "pods", "--all", "-n", k8s_namespace, "--overwrite",
            f"{METRICS_URL_ANNOTATION}={silent_metrics}",
        )  # fmt: skip
        for i in range(FLEETS):
            cluster.kubectl(
                "patch", "emb", f"f{i}", "-n", k8s_namespace, "--type=merge",
                "-p", '{"spec":{"autoscaling":{"enabled":true,"maxReplicas":1}}}',
            )  # fmt: skip
    finally:
        op.stop()

    seconds: list[float] = []
    codes: list[int | None] = []
    try:
        for i in range(TRIES):
            op.start()
            watching(cluster, k8s_namespace, "watched", op)
            time.sleep(RUN_SECONDS[i % len(RUN_SECONDS)])
            assert op.proc is not None
            sent = time.monotonic()
            op.proc.send_signal(signal.SIGTERM)
            try:
                codes.append(op.proc.wait(timeout=30))
            except subprocess.TimeoutExpired:
                op.proc.kill()
                op.proc.wait()
                codes.append(None)
            seconds.append(time.monotonic() - sent)
    finally:
        op.stop()  # after a failed wait: no operator outlives the test
    ranked = sorted(seconds)
    p50 = statistics.median(ranked)
    p99 = ranked[min(len(ranked) - 1, round(0.99 * (len(ranked) - 1)))]
    print(
        f"SIGTERM to exit over {TRIES} tries, API latency {LATENCY} s: "
        f"p50 {p50:.2f} s, p99 {p99:.2f} s, max {ranked[-1]:.2f} s; exit codes {set(codes)}"
    )
    assert codes == [0] * TRIES, f"{codes}\n{op.tail()}"
    assert p99 <= BOUND_SECONDS, f"{[round(s, 2) for s in seconds]}\n{op.tail()}"


def test_sigterm_exits_promptly_when_the_api_server_hangs(
    operator_rbac: Cluster,
    k8s_namespace: str,
    proxy: LatencyProxy,
    proxied_kubeconfig: Path,
    tmp_path: Path,
) -> None:
    """No reply at all (an overloaded or partitioned control plane): the Lease cannot be handed
    back, and the exit must not wait for it (it expires on its own)."""
    op = OperatorProcess(
        operator_rbac,
        proxied_kubeconfig,
        tmp_path / "log",
        lease_name=f"hang-{k8s_namespace[-6:]}",
        extra_env={"EMBEDFLEET_OPERATOR_NAMESPACE": k8s_namespace},
    )
    cluster = operator_rbac
    for i in range(2):
        cluster.kubectl("apply", "-n", k8s_namespace, "-f", "-", input=json.dumps(fleet(f"h{i}")))
    op.start()
    try:
        # Once kopf's own start-up (its scan of the API's resources) is done: that scan's tasks
        # are kopf's, and kopf gives them 5 s after the cleanup.
        wait_until("both fleets reconciled", lambda: reconciled(cluster, k8s_namespace, 2), op)
        proxy.delay = 600.0  # from now on nothing the API server says arrives
        time.sleep(3.0)  # renewals, resyncs and autoscaler ticks are all waiting on it
        assert op.proc is not None
        sent = time.monotonic()
        op.proc.send_signal(signal.SIGTERM)
        code = op.proc.wait(timeout=30)
        took = time.monotonic() - sent
    finally:
        proxy.delay = 0.0
        op.stop()
    print(f"SIGTERM to exit with the API server silent: {took:.2f} s")
    assert code == 0, op.tail()
    assert took <= BOUND_SECONDS, op.tail()

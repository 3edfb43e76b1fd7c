"""Robustness of the operator process: killed halfway through a reconcile it converges after a
restart, and while it is down deleting an EmbeddingDeployment is never blocked."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from embedfleet.testing.cluster import Cluster
from embedfleet.testing.workers import metric_value, scrape

from .helpers import (
    EXAMPLES,
    OPERATOR_NAMESPACE,
    OperatorProcess,
    available,
    child_objects,
    get_json,
    wait_until,
)

EXPECTED = 10  # children of an EmbeddingDeployment without a ServiceMonitor


def test_killed_mid_reconcile_converges_and_deletion_never_waits(
    operator: OperatorProcess, k8s_cluster: Cluster, k8s_namespace: str
) -> None:
    cluster, ns, op = k8s_cluster, k8s_namespace, operator
    try:
        # SIGKILL the moment the first child (the ConfigMap, applied first) shows up on a watch:
        # the operator is then in the middle of applying the rest.
        watch = subprocess.Popen(
            [
                str(cluster.tools.path("kubectl")), f"--kubeconfig={cluster.kubeconfig}",
                "get", "configmaps", "-n", ns, "-l", "embedfleet.dev/deployment=reranker",
                "--watch", "-o", "name",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            time.sleep(1.0)  # the watch is established
            cluster.kubectl("apply", "-n", ns, "-f", str(EXAMPLES / "reranker.yaml"))
            assert watch.stdout is not None
            assert watch.stdout.readline().strip() == "configmap/reranker-config"
            op.kill()
        finally:
            watch.kill()
            watch.wait()
        partial = len(child_objects(cluster, ns, "reranker"))
        print(f"children when killed: {partial} of {EXPECTED}")
        assert 1 <= partial < EXPECTED, op.tail()

        # While it is down: a spec change and a hand-deleted child.
        patch = {"spec": {"gateway": {"replicas": 2}}}
        cluster.kubectl("patch", "-n", ns, "emb/reranker", "--type=merge", "-p", json.dumps(patch))
        cluster.kubectl("delete", "-n", ns, "configmap/reranker-config", "--ignore-not-found")

        op.start()  # waits for the killed holder's Lease to expire, then leads

        def converged() -> Any:
            kids = child_objects(cluster, ns, "reranker")
            emb = available(cluster, ns, "reranker")
            gateway = kids.get("Deployment/reranker-gateway", {}).get("spec", {})
            ok = len(kids) == EXPECTED and emb is not None and gateway.get("replicas") == 2
            return ok and emb

        emb = wait_until("convergence after the restart", converged, op, timeout=90)
        assert emb["status"]["readyReplicas"] == 2
        worker = get_json(cluster, ns, "deployment", "reranker-worker")
        limits = worker["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "1"
        assert worker["spec"]["template"]["metadata"]["labels"]["embedfleet.dev/task"] == "score"
        scaling = next(c for c in emb["status"]["conditions"] if c["type"] == "ScalingActive")
        assert scaling["reason"] == "External"

        # Operator down (clean stop releases the Lease): deletion still completes, GC cleans up.
        assert op.stop() == 0
        cluster.kubectl("delete", "-n", ns, "emb/reranker", "--timeout=20s")
        wait_until(
            "children garbage-collected", lambda: not child_objects(cluster, ns, "reranker"), op
        )
    finally:
        if op.proc is None or op.proc.poll() is not None:
            op.start()


def test_a_standby_replica_waits_and_takes_over_on_release(
    operator: OperatorProcess, k8s_cluster: Cluster, tmp_path: Path
) -> None:
    """Two operator processes: only the Lease holder acts; a clean stop hands over at once."""
    standby = OperatorProcess(
        k8s_cluster,
        operator.kubeconfig,
        tmp_path / "standby.log",
        extra_env={"EMBEDFLEET_OPERATOR_IDENTITY": "test-standby"},
    )
    try:
        standby.start(wait=False)
        wait_until(
            "the standby to wait for the lease",
            lambda: "waiting for the leader lease" in standby.log.read_text(),
            standby,
        )
        time.sleep(3 * 3)  # three lease durations: the holder keeps renewing, the standby waits
        assert operator.leads()
        assert not standby.leads()
        assert "acquired the leader lease" not in standby.log.read_text()
        # The waiting standby is alive and scraped (its probes pass; it is not restarted).
        assert standby.health() == {"leader": False}
        assert operator.health() == {"leader": True}
        assert metric_value(scrape(standby.metrics_port), "embedfleet_operator_leader") == 0
        assert metric_value(scrape(operator.metrics_port), "embedfleet_operator_leader") == 1

        assert operator.stop() == 0
        # A clean stop released the Lease (or the standby already took it): no wait for expiry.
        lease = json.loads(
            k8s_cluster.kubectl(
                "get", "lease", "embedfleet-operator", "-n", OPERATOR_NAMESPACE, "-o", "json"
            ).stdout
        )
        assert lease["spec"].get("holderIdentity") in (None, "", "test-standby")
        standby.wait_leading(timeout=10)
        wait_until("the standby to say it leads", lambda: standby.health()["leader"], standby)
        assert metric_value(scrape(standby.metrics_port), "embedfleet_operator_leader") == 1
    finally:
        standby.stop()
        if operator.proc is None or operator.proc.poll() is not None:
            operator.start()

"""The operator's half of the autoscaling contract on a real cluster: with autoscaling enabled,
status.autoscaling.desiredReplicas (written here the way the autoscaler writes it) sets the worker
Deployment, clamped to [minReplicas, maxReplicas]; spec.worker.replicas does not."""

from __future__ import annotations

import json
from typing import Any

from embedfleet.testing.cluster import Cluster
from embedfleet.testing.polling import wait_for

from .helpers import EXAMPLES, OperatorProcess, child_objects, get_json, wait_until


def _worker_replicas(cluster: Cluster, ns: str) -> int | None:
    dep = get_json(cluster, ns, "deployment", "qwen3-embedding-worker")
    return None if dep is None else int(dep["spec"]["replicas"])


def _decide(cluster: Cluster, ns: str, op: OperatorProcess, decided: int, expected: int) -> None:
    """Writes a decision into status.autoscaling as the autoscaler would, and waits for the worker
    Deployment to follow. The real autoscaler (embedfleet.operator.autoscaling) runs in the same
    operator process; seeing no metrics from KWOK pods it holds the current count, and a tick of it
    that lands between this write and the reconcile overwrites the write: then write again."""
    status = json.dumps({"status": {"autoscaling": {"desiredReplicas": decided}}})
    for _ in range(3):
        cluster.kubectl(
            "patch", "-n", ns, "emb/qwen3-embedding", "--subresource=status", "--type=merge",
            "-p", status,
        )  # fmt: skip
        try:
            wait_for(
                f"worker replicas {expected} for a decision of {decided}",
                lambda: _worker_replicas(cluster, ns) == expected,
                timeout=15,
                interval=0.2,
            )
            return
        except TimeoutError:
            emb = get_json(cluster, ns, "emb", "qwen3-embedding")
            if emb["status"]["autoscaling"].get("desiredReplicas") == decided:
                raise AssertionError(f"decision {decided} not applied:\n{op.tail()}") from None
    raise AssertionError(f"decision {decided} overwritten three times:\n{op.tail()}")


def test_gpu_example_follows_the_autoscaler_decision(
    operator: OperatorProcess, k8s_cluster: Cluster, k8s_namespace: str
) -> None:
    cluster, ns, op = k8s_cluster, k8s_namespace, operator
    cluster.kubectl("apply", "-n", ns, "-f", str(EXAMPLES / "qwen3-embedding-gpu.yaml"))
    kids = wait_until(
        "children", lambda: len(k := child_objects(cluster, ns, "qwen3-embedding")) == 10 and k, op
    )
    pod = kids["Deployment/qwen3-embedding-worker"]["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["command"][:3] == [
        "hf",
        "download",
        "Qwen/Qwen3-Embedding-0.6B",
    ]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # No prometheus-operator CRD in this cluster: no ServiceMonitor, and no error for it.
    assert get_json(cluster, ns, "emb", "qwen3-embedding")["status"]["conditions"]

    for decided, expected in ((6, 6), (20, 8), (0, 1)):
        _decide(cluster, ns, op, decided, expected)
    # The user's replica count is ignored while the built-in autoscaler drives: the Deployment
    # keeps following status.autoscaling (which the running autoscaler may move meanwhile, so
    # compare one consistent reading).
    cluster.kubectl("scale", "-n", ns, "emb/qwen3-embedding", "--replicas=5")

    def consistent() -> dict[str, Any] | None:
        emb = get_json(cluster, ns, "emb", "qwen3-embedding")
        status, replicas = emb["status"], _worker_replicas(cluster, ns)
        decided = status["autoscaling"]["desiredReplicas"]
        again = get_json(cluster, ns, "emb", "qwen3-embedding")["status"]["autoscaling"]
        ok = (
            status.get("observedGeneration") == emb["metadata"]["generation"]
            and emb["spec"]["worker"]["replicas"] == 5
            and again["desiredReplicas"] == decided
            and replicas == status["desiredReplicas"] == max(1, min(8, decided))
        )
        return emb if ok else None

    emb = wait_until("the Deployment following the autoscaler, not spec", consistent, op)
    scaling = next(c for c in emb["status"]["conditions"] if c["type"] == "ScalingActive")
    assert scaling["status"] == "True"

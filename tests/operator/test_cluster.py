"""The operator against the real control plane: kubectl apply -> a fleet whose status tells the
truth, refused mistakes, self-healing children, garbage collection and restarts."""

from __future__ import annotations

import json
import urllib.request

from embedfleet.testing.cluster import Cluster

from .helpers import (
    EXAMPLES,
    MINILM_CHILDREN,
    OperatorProcess,
    available,
    child_objects,
    condition,
    get_json,
    wait_until,
)

CONFIG_HASH = "embedfleet.dev/config-hash"


def _template_hash(cluster: Cluster, ns: str, name: str) -> str:
    dep = get_json(cluster, ns, "deployment", name)
    return str(dep["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH])


def _worker_pods_hashes(cluster: Cluster, ns: str, owner: str) -> list[tuple[str, bool]]:
    pods = get_json(
        cluster,
        ns,
        "pods",
        "-l",
        f"app.kubernetes.io/instance={owner},app.kubernetes.io/component=worker",
    )
    out = []
    for pod in pods["items"]:
        if pod["metadata"].get("deletionTimestamp"):
            out.append(("terminating", False))
            continue
        ready = condition(pod, "Ready").get("status") == "True"
        out.append((pod["metadata"]["annotations"][CONFIG_HASH], ready))
    return out


def test_minilm_example_end_to_end(
    operator: OperatorProcess, k8s_cluster: Cluster, k8s_namespace: str
) -> None:
    cluster, ns, op = k8s_cluster, k8s_namespace, operator
    cluster.kubectl("apply", "-n", ns, "-f", str(EXAMPLES / "minilm.yaml"))
    emb = get_json(cluster, ns, "emb", "minilm")
    uid = emb["metadata"]["uid"]

    # Every child, owned by the EmbeddingDeployment and applied by our field manager.
    kids = wait_until(
        "all children",
        lambda: (k := child_objects(cluster, ns, "minilm")).keys() >= MINILM_CHILDREN and k,
        op,
    )
    assert set(kids) == MINILM_CHILDREN
    for key, obj in kids.items():
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
            "EmbeddingDeployment", "minilm", uid, True,
        ), key  # fmt: skip
        managers = {(m["manager"], m["operation"]) for m in obj["metadata"]["managedFields"]}
        assert ("embedfleet-operator", "Apply") in managers, key
    worker = kids["Deployment/minilm-worker"]
    assert worker["spec"]["replicas"] == 2
    container = worker["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["embedfleet-worker"]
    assert container["image"] == "example.invalid/worker:test"
    assert container["readinessProbe"]["grpc"]["port"] == 50051
    assert container["resources"]["requests"] == {"cpu": "250m", "memory": "768Mi"}
    cm = kids["ConfigMap/minilm-config"]["data"]
    assert cm["EMBEDFLEET_WORKER_MODEL"] == "/opt/embedfleet/models/all-MiniLM-L6-v2"
    assert cm["EMBEDFLEET_GATEWAY_K8S_SERVICE"] == "minilm-worker"
    assert kids["Service/minilm-worker"]["spec"]["clusterIP"] == "None"

    # KWOK runs the pods -> Available, with a truthful status.
    emb = wait_until("Available=True", lambda: available(cluster, ns, "minilm"), op, timeout=90)
    status = emb["status"]
    assert (status["readyReplicas"], status["desiredReplicas"], status["replicas"]) == (2, 2, 2)
    assert status["endpoint"] == f"http://minilm.{ns}.svc:80"
    assert status["selector"] == (
        "app.kubernetes.io/component=worker,app.kubernetes.io/instance=minilm,"
        "app.kubernetes.io/name=embedfleet"
    )
    assert condition(emb, "Degraded")["status"] == "False"
    assert condition(emb, "Available")["observedGeneration"] == emb["metadata"]["generation"]
    assert not emb["metadata"].get("finalizers"), "deletion must never wait for the operator"

    # Printer columns.
    table = cluster.kubectl("get", "emb", "-n", ns).stdout.splitlines()
    assert table[0].split() == ["NAME", "MODEL", "READY", "DESIRED", "TOKENS/S", "P99(MS)", "AGE"]
    assert table[1].split()[:4] == [
        "minilm", "file:///opt/embedfleet/models/all-MiniLM-L6-v2", "2", "2"
    ]  # fmt: skip

    # The scale subresource.
    cluster.kubectl("scale", "-n", ns, "emb/minilm", "--replicas=3")
    wait_until(
        "3 ready workers",
        lambda: (e := available(cluster, ns, "minilm")) and e["status"]["readyReplicas"] == 3,
        op,
    )
    scale = get_json(cluster, ns, "emb", "minilm", "--subresource=scale")
    assert scale["spec"]["replicas"] == 3
    assert scale["status"]["replicas"] == 3
    assert "app.kubernetes.io/component=worker" in scale["status"]["selector"]

    # A spec change rolls the workers (and only them).
    worker_hash = _template_hash(cluster, ns, "minilm-worker")
    gateway_hash = _template_hash(cluster, ns, "minilm-gateway")
    patch = {"spec": {"worker": {"engine": {"maxBatchTokens": 8192}}}}
    cluster.kubectl("patch", "-n", ns, "emb/minilm", "--type=merge", "-p", json.dumps(patch))
    wait_until(
        "the new worker config",
        lambda: _template_hash(cluster, ns, "minilm-worker") != worker_hash,
        op,
    )
    new_hash = _template_hash(cluster, ns, "minilm-worker")
    assert _template_hash(cluster, ns, "minilm-gateway") == gateway_hash
    data = get_json(cluster, ns, "configmap", "minilm-config")["data"]
    assert data["EMBEDFLEET_WORKER_MAX_BATCH_TOKENS"] == "8192"
    wait_until(
        "every worker pod rolled",
        lambda: _worker_pods_hashes(cluster, ns, "minilm") == [(new_hash, True)] * 3,
        op,
        timeout=120,
    )
    wait_until("Available after the rollout", lambda: available(cluster, ns, "minilm"), op)

    # Children deleted or edited by hand are restored.
    before = {k: v["metadata"]["uid"] for k, v in child_objects(cluster, ns, "minilm").items()}
    cluster.kubectl(
        "delete", "-n", ns, "service/minilm-worker", "deployment/minilm-gateway",
        "configmap/minilm-config", "role/minilm-gateway", "--wait=false",
    )  # fmt: skip
    cluster.kubectl("scale", "-n", ns, "deployment/minilm-worker", "--replicas=1")

    def restored() -> bool:
        now = child_objects(cluster, ns, "minilm")
        if set(now) != MINILM_CHILDREN:
            return False
        recreated = (
            "Service/minilm-worker",
            "Deployment/minilm-gateway",
            "ConfigMap/minilm-config",
        )
        return all(now[k]["metadata"]["uid"] != before[k] for k in recreated) and (
            now["Deployment/minilm-worker"]["spec"]["replicas"] == 3
        )

    wait_until("hand-deleted and hand-edited children restored", restored, op)

    # The operator's own metrics.
    text = urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=5).read()
    metrics = text.decode()
    assert 'embedfleet_operator_reconciles_total{result="ok"}' in metrics
    assert (
        f'embedfleet_operator_desired_replicas{{deployment="minilm",namespace="{ns}"}} 3.0'
        in metrics
    )
    assert "embedfleet_operator_reconcile_seconds_bucket" in metrics

    # Events for notable actions.
    events = wait_until(
        "events",
        lambda: (
            {e["reason"] for e in get_json(cluster, ns, "events")["items"]}
            >= {"Created", "Scaled", "AvailableTrue"}
        ),
        op,
    )
    assert events

    # Deleting the EmbeddingDeployment garbage-collects every child.
    cluster.kubectl("delete", "-n", ns, "emb/minilm", "--timeout=30s")
    wait_until("children garbage-collected", lambda: not child_objects(cluster, ns, "minilm"), op)

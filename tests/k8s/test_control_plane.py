"""The harness's control plane behaves like a real cluster: versions, scheduling on fake GPU
nodes, CRD validation, garbage collection."""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from embedfleet.testing import fence
from embedfleet.testing.apiclient import ApiError
from embedfleet.testing.cluster import Cluster, CommandError
from embedfleet.testing.polling import wait_for
from embedfleet.testing.process import ProcessRecord, start_ticks
from embedfleet.testing.tools import pinned_versions

pytestmark = pytest.mark.k8s

GPU = "nvidia.com/gpu"


def test_components_report_pinned_versions(k8s_cluster: Cluster) -> None:
    versions = pinned_versions()
    server = k8s_cluster.api.get("/version")
    assert server["gitVersion"] == versions["K8S_VERSION"]
    assert server["gitTreeState"] == "clean"
    kubectl = json.loads(k8s_cluster.kubectl("version", "-o", "json").stdout)
    assert kubectl["clientVersion"]["gitVersion"] == versions["K8S_VERSION"]
    assert kubectl["serverVersion"]["gitVersion"] == versions["K8S_VERSION"]
    helm = k8s_cluster.helm("version", "--template", "{{.Version}}").stdout.strip()
    assert helm == versions["HELM_VERSION"]


def test_fake_nodes_advertise_gpus(kubectl_json: Callable[..., Any]) -> None:
    nodes = kubectl_json("get", "nodes", "-l", "type=kwok")["items"]
    assert len(nodes) == 3
    for node in nodes:
        assert node["status"]["allocatable"][GPU] == "8"
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready[0]["status"] == "True"


def _deployment(name: str, replicas: int, gpus: int) -> dict[str, Any]:
    labels = {"app": name}
    resources = {"limits": {GPU: str(gpus)}, "requests": {GPU: str(gpus), "cpu": "100m"}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "server",
                            "image": "embedfleet/worker:test",
                            "resources": resources,
                        }
                    ]
                },
            },
        },
    }


def test_deployment_becomes_running_gpu_pods(
    k8s_cluster: Cluster, k8s_namespace: str, kubectl_json: Callable[..., Any]
) -> None:
    manifest = json.dumps(_deployment("worker", replicas=2, gpus=1))
    k8s_cluster.kubectl("apply", "-n", k8s_namespace, "-f", "-", input=manifest)
    k8s_cluster.kubectl(
        "rollout", "status", "deployment/worker", "-n", k8s_namespace, "--timeout=90s", timeout=100
    )

    deployment = kubectl_json("get", "deployment/worker", "-n", k8s_namespace)
    replica_sets = kubectl_json("get", "replicasets", "-n", k8s_namespace, "-l", "app=worker")[
        "items"
    ]
    assert len(replica_sets) == 1
    assert replica_sets[0]["metadata"]["ownerReferences"][0]["uid"] == deployment["metadata"]["uid"]
    pods = kubectl_json("get", "pods", "-n", k8s_namespace, "-l", "app=worker")["items"]
    assert len(pods) == 2
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        assert pod["spec"]["nodeName"].startswith("kwok-gpu-")
        assert pod["metadata"]["ownerReferences"][0]["uid"] == replica_sets[0]["metadata"]["uid"]
        assert pod["spec"]["containers"][0]["resources"]["limits"][GPU] == "1"


def test_pod_asking_more_gpus_than_any_node_stays_pending(
    k8s_cluster: Cluster, k8s_namespace: str, kubectl_json: Callable[..., Any]
) -> None:
    manifest = json.dumps(_deployment("greedy", replicas=1, gpus=9))
    k8s_cluster.kubectl("apply", "-n", k8s_namespace, "-f", "-", input=manifest)

    def unschedulable() -> dict[str, Any] | None:
        pods = kubectl_json("get", "pods", "-n", k8s_namespace, "-l", "app=greedy")["items"]
        for pod in pods:
            for condition in pod["status"].get("conditions", []):
                if (
                    condition["type"] == "PodScheduled"
                    and condition.get("reason") == "Unschedulable"
                ):
                    return dict(condition)
        return None

    condition = wait_for("the scheduler to give up on the pod", unschedulable, timeout=60)
    assert GPU in condition["message"]


MIN_REPLICAS_RULE = "!has(self.minReplicas) || self.minReplicas <= self.replicas"
WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.harness.embedfleet.dev"},
    "spec": {
        "group": "harness.embedfleet.dev",
        "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["replicas"],
                                "properties": {
                                    "replicas": {"type": "integer", "minimum": 1},
                                    "minReplicas": {"type": "integer", "minimum": 0},
                                },
                                "x-kubernetes-validations": [
                                    {
                                        "rule": MIN_REPLICAS_RULE,
                                        "message": "minReplicas must not exceed replicas",
                                    }
                                ],
                            }
                        },
                    }
                },
            }
        ],
    },
}


def _widget(name: str, spec: dict[str, Any]) -> str:
    return json.dumps(
        {
            "apiVersion": "harness.embedfleet.dev/v1",
            "kind": "Widget",
            "metadata": {"name": name},
            "spec": spec,
        }
    )


def test_crd_schema_rejects_bad_objects(k8s_cluster: Cluster, k8s_namespace: str) -> None:
    k8s_cluster.kubectl("apply", "-f", "-", input=json.dumps(WIDGET_CRD))
    try:
        k8s_cluster.wait_established("widgets.harness.embedfleet.dev", timeout=30)
        ns = ("-n", k8s_namespace)
        k8s_cluster.kubectl("apply", *ns, "-f", "-", input=_widget("good", {"replicas": 2}))

        with pytest.raises(CommandError) as wrong_type:
            k8s_cluster.kubectl(
                "apply", *ns, "-f", "-", input=_widget("typed", {"replicas": "two"})
            )
        assert "spec.replicas" in wrong_type.value.stderr

        with pytest.raises(CommandError) as too_small:
            k8s_cluster.kubectl("apply", *ns, "-f", "-", input=_widget("zero", {"replicas": 0}))
        assert "should be greater than or equal to 1" in too_small.value.stderr

        bad = _widget("inverted", {"replicas": 1, "minReplicas": 3})
        with pytest.raises(CommandError) as cel:
            k8s_cluster.kubectl("apply", *ns, "-f", "-", input=bad)
        assert "minReplicas must not exceed replicas" in cel.value.stderr

        names = k8s_cluster.kubectl("get", "widgets", *ns, "-o", "name").stdout.split()
        assert names == ["widget.harness.embedfleet.dev/good"]
    finally:
        k8s_cluster.kubectl("delete", "crd/widgets.harness.embedfleet.dev", "--wait=false")


def test_deleting_owner_garbage_collects_dependents(
    k8s_cluster: Cluster, k8s_namespace: str
) -> None:
    base = f"/api/v1/namespaces/{k8s_namespace}/configmaps"
    owner = k8s_cluster.api.create(
        base, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}
    )
    reference = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
    }
    for i in range(3):
        metadata = {"name": f"dependent-{i}", "ownerReferences": [reference]}
        k8s_cluster.api.create(
            base, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata}
        )
    bystander = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bystander"}}
    k8s_cluster.api.create(base, bystander)

    k8s_cluster.api.delete(f"{base}/owner")

    def dependents_gone() -> bool:
        names = {item["metadata"]["name"] for item in k8s_cluster.api.get(base)["items"]}
        return not any(name.startswith("dependent-") for name in names)

    wait_for("the garbage collector to delete the dependents", dependents_gone, timeout=60)
    assert k8s_cluster.api.get(f"{base}/bystander")["metadata"]["name"] == "bystander"
    with pytest.raises(ApiError) as missing:
        k8s_cluster.api.get(f"{base}/owner")
    assert missing.value.status == 404


def test_helm_checks_kube_version_against_the_cluster(
    k8s_cluster: Cluster, k8s_namespace: str, tmp_path: Path
) -> None:
    minor = pinned_versions()["K8S_VERSION"].split(".")[1]

    def chart(name: str, kube_version: str) -> Path:
        root = tmp_path / name
        (root / "templates").mkdir(parents=True)
        (root / "Chart.yaml").write_text(
            f"apiVersion: v2\nname: {name}\nversion: 0.1.0\nkubeVersion: '{kube_version}'\n"
        )
        (root / "templates" / "cm.yaml").write_text(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\n"
            "data:\n  kube: {{ .Capabilities.KubeVersion.Version | quote }}\n"
        )
        return root

    fits = chart("fits", f">=1.{minor}.0-0")
    k8s_cluster.helm("install", "fits", str(fits), "-n", k8s_namespace, "--wait", "--timeout=60s")
    data = k8s_cluster.api.get(f"/api/v1/namespaces/{k8s_namespace}/configmaps/fits")["data"]
    assert data["kube"] == pinned_versions()["K8S_VERSION"]

    too_new = chart("too-new", f">=1.{int(minor) + 1}.0-0")
    with pytest.raises(CommandError) as refused:
        k8s_cluster.helm("install", "too-new", str(too_new), "-n", k8s_namespace)
    assert "incompatible with Kubernetes" in refused.value.stderr


def test_fake_pod_and_service_addresses_lead_nowhere_off_this_machine(k8s_cluster: Cluster) -> None:
    """KWOK pod IPs and ClusterIPs have no listener here: a connect must fail on this host at
    once (an unreachable route), never be routed out through the default gateway."""
    assert fence.routes() == set(fence.FENCED)
    for cidr in fence.FENCED:
        address = str(next(ipaddress.ip_network(cidr).hosts()))
        with socket.socket() as sock:
            sock.settimeout(5)
            code = sock.connect_ex((address, 8080))
        assert code in (errno.ENETUNREACH, errno.EHOSTUNREACH), (address, errno.errorcode.get(code))


def test_a_dead_fence_holder_is_dropped_and_a_live_one_keeps_the_routes(
    k8s_cluster: Cluster,
) -> None:
    dead = fence.ROOT / "999999999-1-deadbeef.holder"  # no such pid
    dead.touch()
    me = ProcessRecord("test", os.getpid(), start_ticks(os.getpid()) or 0, Path("/dev/null"))
    holder = fence.hold(me)
    assert not dead.exists()
    fence.release(holder)
    # The session cluster's API server still holds them.
    assert fence.routes() == set(fence.FENCED)

"""A shared gateway on the control plane: made for the fleets that name it, re-rendered as they
join and leave, and gone with the last (the real operator process, KWOK pods)."""

from __future__ import annotations

import json
from typing import Any

from embedfleet.testing.cluster import Cluster

from .helpers import OperatorProcess, get_json, wait_until

MODEL = "file:///opt/embedfleet/models/all-MiniLM-L6-v2"
NAME = "search-shared-gateway"


def _fleet(name: str, shared: str, served: str = "") -> str:
    model: dict[str, Any] = {"source": MODEL}
    if served:
        model["servedModelName"] = served
    return json.dumps(
        {
            "apiVersion": "embedfleet.dev/v1alpha1",
            "kind": "EmbeddingDeployment",
            "metadata": {"name": name},
            "spec": {"model": model, "worker": {"replicas": 1}, "gateway": {"shared": shared}},
        }
    )


def _served(cluster: Cluster, ns: str) -> list[str] | None:
    cm = get_json(cluster, ns, "configmap", NAME)
    if cm is None:
        return None
    return [m["served_model_name"] for m in json.loads(cm["data"]["models.json"])["models"]]


def _owners(cluster: Cluster, ns: str, kind: str) -> list[str] | None:
    obj = get_json(cluster, ns, kind, NAME)
    return None if obj is None else [r["name"] for r in obj["metadata"]["ownerReferences"]]


def test_the_shared_gateway_follows_its_members(
    operator: OperatorProcess, k8s_cluster: Cluster, k8s_namespace: str
) -> None:
    cluster, ns, op = k8s_cluster, k8s_namespace, operator
    for name, served in (("alpha", ""), ("beta", "beta-named")):
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=_fleet(name, "search", served))
    wait_until("both models served", lambda: _served(cluster, ns) == ["alpha", "beta-named"], op)
    # Applied in order after the ConfigMap; each owned by both members.
    kinds = ("configmap", "serviceaccount", "role", "rolebinding", "deployment", "service", "pdb")
    wait_until(
        "every object owned by both",
        lambda: all(_owners(cluster, ns, kind) == ["alpha", "beta"] for kind in kinds),
        op,
    )
    deployment = get_json(cluster, ns, "deployment", NAME)
    env = {
        e["name"]: e.get("value", "")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["EMBEDFLEET_GATEWAY_MODELS_FILE"] == "/etc/embedfleet/models/models.json"
    # Each fleet keeps its own gateway.
    assert get_json(cluster, ns, "deployment", "alpha-gateway") is not None

    # An invalid name is refused by the API server, with the reason.
    bad = cluster.kubectl(
        "apply", "-n", ns, "-f", "-", input=_fleet("gamma", "Search_1"), check=False
    )
    assert bad.returncode != 0
    assert "gateway.shared 'Search_1' must start with a letter" in bad.stderr

    # Beta leaves: its model and its owner reference go.
    patch = json.dumps({"spec": {"gateway": {"shared": ""}}})
    cluster.kubectl("patch", "-n", ns, "emb/beta", "--type=merge", "-p", patch)
    wait_until("beta left", lambda: _served(cluster, ns) == ["alpha"], op)
    wait_until("one owner", lambda: _owners(cluster, ns, "deployment") == ["alpha"], op)

    # Alpha, the last member, is deleted: nothing of the shared gateway is left.
    cluster.kubectl("delete", "-n", ns, "emb/alpha", "--wait=false")
    wait_until(
        "the shared gateway gone",
        lambda: all(get_json(cluster, ns, kind, NAME) is None for kind in kinds),
        op,
        timeout=90,
    )
    cluster.kubectl("delete", "-n", ns, "emb/beta", "--wait=false")

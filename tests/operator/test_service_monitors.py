"""ServiceMonitors under the chart's default RBAC, on a cluster that serves prometheus-operator's
ServiceMonitor CRD (issue 14).

The default chart (`rbac.serviceMonitors: false`) grants no rights on ServiceMonitors. Every
EmbeddingDeployment must still reconcile cleanly; one that asks for a ServiceMonitor says, in a
Monitored condition, why it has none; once the rights are granted it gets one, and loses it when
the spec stops asking.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from embedfleet.testing.cluster import Cluster

from .helpers import OPERATOR_NAMESPACE, REPO, OperatorProcess, operator_kubeconfig, wait_until

CHART = REPO / "charts" / "embedfleet"
RELEASE = "svcmon"
# prometheus-operator's CRD reduced to what the API server needs to serve the kind.
CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: servicemonitors.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: ServiceMonitor, listKind: ServiceMonitorList, plural: servicemonitors,
          singular: servicemonitor}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"""


def fleet(name: str, monitor: bool) -> str:
    spec: dict[str, Any] = {"model": {"source": "file:///opt/embedfleet/models/all-MiniLM-L6-v2"}}
    if monitor:
        spec["monitoring"] = {"serviceMonitor": {"enabled": True}}
    body = {
        "apiVersion": "embedfleet.dev/v1alpha1",
        "kind": "EmbeddingDeployment",
        "metadata": {"name": name},
        "spec": spec,
    }
    return json.dumps(body)


def chart_rbac(cluster: Cluster, *values: str) -> list[dict[str, Any]]:
    out = cluster.helm(
        "template", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE,
        "--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/rbac.yaml",
        *values,
    ).stdout  # fmt: skip
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture
def service_monitor_crd(k8s_cluster: Cluster) -> Iterator[None]:
    k8s_cluster.kubectl("apply", "--server-side", "-f", "-", input=CRD)
    k8s_cluster.wait_established("servicemonitors.monitoring.coreos.com")
    try:
        yield
    finally:
        k8s_cluster.kubectl("delete", "crd", "servicemonitors.monitoring.coreos.com", "--wait=true")


def conditions(cluster: Cluster, namespace: str, name: str) -> dict[str, dict[str, Any]] | None:
    """The conditions once the current generation is reconciled."""
    emb = json.loads(cluster.kubectl("get", "emb", name, "-n", namespace, "-o", "json").stdout)
    status = emb.get("status") or {}
    if status.get("observedGeneration") != emb["metadata"]["generation"]:
        return None
    return {c["type"]: c for c in status.get("conditions") or ()}


def monitors(cluster: Cluster, namespace: str) -> list[str]:
    found = cluster.kubectl("get", "servicemonitors", "-n", namespace, "-o", "json").stdout
    return [m["metadata"]["name"] for m in json.loads(found)["items"]]


def test_default_chart_rbac_reconciles_and_explains_a_missing_service_monitor(
    operator: OperatorProcess,
    service_monitor_crd: None,
    k8s_namespace: str,
    tmp_path: Path,
) -> None:
    cluster, ns = operator.cluster, k8s_namespace
    rbac = chart_rbac(cluster)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
    (account,) = [d["metadata"]["name"] for d in rbac if d["kind"] == "ServiceAccount"]
    lease = next(
        rule["resourceNames"][0]
        for d in rbac
        if d["kind"] == "Role"
        for rule in d["rules"]
        if rule.get("resourceNames")
    )
    op = OperatorProcess(
        cluster,
        operator_kubeconfig(cluster, tmp_path / "kubeconfig", account=account),
        tmp_path / "log",
        lease_name=lease,
        extra_env={"EMBEDFLEET_OPERATOR_NAMESPACE": ns, "EMBEDFLEET_OPERATOR_RESYNC_SECONDS": "2"},
    )
    operator.stop()  # the shared operator holds every right: it alone acts here meanwhile
    try:
        op.start()
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=fleet("plain", monitor=False))
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=fleet("watched", monitor=True))

        def settled(name: str, reason: str) -> dict[str, dict[str, Any]] | None:
            found = conditions(cluster, ns, name)
            if found is None or found.get("Monitored", {}).get("reason") != reason:
                return None
            return found

        plain = wait_until("plain reconciled", lambda: settled("plain", "Disabled"), op)
        assert plain["Degraded"]["status"] == "False", plain["Degraded"]
        watched = wait_until("watched reconciled", lambda: settled("watched", "Forbidden"), op)
        assert watched["Degraded"]["status"] == "False", watched["Degraded"]
        assert watched["Monitored"]["status"] == "False"
        assert "rbac.serviceMonitors=true" in watched["Monitored"]["message"]
        assert monitors(cluster, ns) == []

        # Granted: the ServiceMonitor appears; no longer asked for: it goes.
        granted = chart_rbac(cluster, "--set", "rbac.serviceMonitors=true")
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(granted))
        wait_until("watched monitored", lambda: settled("watched", "ServiceMonitorApplied"), op)
        assert monitors(cluster, ns) == ["watched"]
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=fleet("watched", monitor=False))
        wait_until("watched unmonitored", lambda: settled("watched", "Disabled"), op)
        assert monitors(cluster, ns) == []
    finally:
        op.stop()
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input=yaml.safe_dump_all(rbac))
        operator.start()

"""An operator with nothing to do writes nothing: resyncs and watch events of fleets that are
already as their spec says cost the API server reads at most (counted by the API server)."""

from __future__ import annotations

import json
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from embedfleet.testing import apimetrics
from embedfleet.testing.cluster import Cluster

from .helpers import EXAMPLES, OperatorProcess, available, load_yaml, wait_until

FLEETS = 3
# Everything the operator writes for a fleet; the controllers' own status writes are
# subresource "status" of these, not counted for the children.
CHILDREN = (
    "configmaps", "services", "serviceaccounts", "deployments", "roles", "rolebindings",
    "poddisruptionbudgets",
)  # fmt: skip
CREATE_OR_CHANGE = ("POST", "PUT", "PATCH", "APPLY")
# Longer than the test operator's 10 s resync (helpers.OperatorProcess): one full pass at least.
IDLE_SECONDS = 13.0


def test_an_idle_operator_writes_nothing(
    operator: OperatorProcess, k8s_cluster: Cluster, k8s_namespace: str
) -> None:
    cluster, ns = k8s_cluster, k8s_namespace
    fleet = load_yaml(EXAMPLES / "minilm.yaml")
    names = [f"idle-{i}" for i in range(FLEETS)]
    for name in names:
        fleet["metadata"]["name"] = name
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(fleet))  # JSON is YAML
    for name in names:
        wait_until(f"{name} Available", lambda name=name: available(cluster, ns, name), operator)
    # The counters are the API server's, cluster-wide. A namespace an earlier test deleted is
    # still emptied by the control plane's own controllers (the root-CA publisher re-making
    # kube-root-ca.crt there, refused), and those requests would count as ours.
    wait_until(
        "no other namespace terminating", lambda: not _terminating(cluster), operator, timeout=120
    )
    # Settled: the status the last Deployment status change asked for is written.
    time.sleep(2)

    before = apimetrics.request_counts(cluster.api)
    reconciles, unchanged = _reconciles(operator), _metric(operator, UNCHANGED)
    time.sleep(IDLE_SECONDS)
    during = apimetrics.delta(apimetrics.request_counts(cluster.api), before)
    reconciled = _reconciles(operator) - reconciles

    children = apimetrics.writes(during, CHILDREN, CREATE_OR_CHANGE, subresources=("",))
    fleets = apimetrics.writes(during, ("embeddingdeployments",), CREATE_OR_CHANGE)
    assert not children, f"writes to children at idle: {children}"
    assert not fleets, f"writes to EmbeddingDeployments at idle: {fleets}"
    # The operator did look (a resync reconciles every fleet): this is idleness, not absence.
    assert reconciled >= FLEETS
    # And those passes found nothing they read changed, so they rendered nothing either.
    assert _metric(operator, UNCHANGED) - unchanged >= FLEETS


UNCHANGED = "embedfleet_operator_reconciles_unchanged_total"


def _reconciles(op: OperatorProcess) -> float:
    """embedfleet_operator_reconciles_total{result="ok"} from the operator's /metrics."""
    return _metric(op, "embedfleet_operator_reconciles_total", {"result": "ok"})


def _metric(op: OperatorProcess, name: str, labels: dict[str, str] | None = None) -> float:
    """One sample of the operator's /metrics (0 before it is first counted)."""
    url = f"http://127.0.0.1:{op.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == (labels or {}):
                return float(sample.value)
    return 0.0


def _terminating(cluster: Cluster) -> list[str]:
    found = cluster.api.get("/api/v1/namespaces")
    return [
        item["metadata"]["name"]
        for item in found.get("items", [])
        if (item.get("status") or {}).get("phase") == "Terminating"
    ]

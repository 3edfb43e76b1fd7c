"""The autoscaler module's pure pieces (its loop runs in the cluster test,
tests/operator/test_autoscaler_e2e.py)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest

from embedfleet.operator.autoscaling.autoscaler import event, metrics_urls
from embedfleet.operator.manifests import Images, Owner
from embedfleet.operator.render.fleet import children
from embedfleet.operator.spec import parse_spec

BODY = {
    "apiVersion": "embedfleet.dev/v1alpha1",
    "kind": "EmbeddingDeployment",
    "metadata": {"name": "minilm", "namespace": "prod", "uid": "u-1"},
}


def test_event_names_the_resource_and_the_reason() -> None:
    e = event(BODY, "ScaleUpForLoad", "2 -> 4: " + "x" * 2000, 1_764_500_000.0)
    assert e["involvedObject"] == {
        "apiVersion": "embedfleet.dev/v1alpha1",
        "kind": "EmbeddingDeployment",
        "name": "minilm",
        "namespace": "prod",
        "uid": "u-1",
    }
    assert (e["type"], e["reason"]) == ("Normal", "ScaleUpForLoad")
    assert len(e["message"]) == 1000
    assert e["metadata"] == {"generateName": "minilm.", "namespace": "prod"}
    assert e["firstTimestamp"] == e["lastTimestamp"] == "2025-11-30T10:53:20Z"
    assert e["source"] == {"component": "embedfleet-operator"}


@pytest.mark.parametrize(
    ("component", "setting"),
    [("worker", "EMBEDFLEET_WORKER_METRICS_PORT"), ("gateway", "EMBEDFLEET_GATEWAY_PORT")],
)
def test_scrapes_each_pod_where_its_process_serves_metrics(component: str, setting: str) -> None:
    # The gateway serves /metrics on its one HTTP port, the worker on a port of its own.
    spec = parse_spec({"model": {"source": "file:///m"}, "autoscaling": {"enabled": True}})
    owner = Owner(name="minilm", namespace="prod", uid="u-1")
    made = children(owner, spec, 1, Images(worker="w", gateway="g"), False)
    by_key: dict[str, Any] = {f"{m['kind']}/{m['metadata']['name']}": m for m in made}
    template = by_key[f"Deployment/minilm-{component}"]["spec"]["template"]
    pod = {**template, "status": {"phase": "Running", "podIP": "10.244.0.7"}}
    configured = int(by_key["ConfigMap/minilm-config"]["data"][setting])
    (url,) = metrics_urls(component, [pod])
    assert (urlsplit(url).hostname, urlsplit(url).port) == ("10.244.0.7", configured)
    assert urlsplit(url).path == "/metrics"

"""The autoscaler module's pure pieces (its loop runs in the cluster test,
tests/operator/test_autoscaler_e2e.py)."""

from __future__ import annotations

from embedfleet.operator.autoscaling.autoscaler import event

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

"""Static checks of the CRD file; tests/operator/test_cluster.py checks it against an API server."""

from __future__ import annotations

from .helpers import CRD_PATH, crd_schema, load_yaml

AUTOSCALING_FIELDS = {
    "enabled",
    "external",
    "minReplicas",
    "maxReplicas",
    "targetTokensPerSecond",
    "targetUtilization",
    "p99LatencySLOMilliseconds",
    "panicWindowSeconds",
    "stableWindowSeconds",
    "scaleDownStabilizationSeconds",
    "maxScaleUpRate",
    "maxScaleDownRate",
    "tolerance",
    "prometheusURL",
}


def test_names_subresources_and_columns() -> None:
    crd = load_yaml(CRD_PATH)
    assert crd["spec"]["group"] == "embedfleet.dev"
    assert crd["spec"]["names"]["shortNames"] == ["emb"]
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1"
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.worker.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == ["Model", "Ready", "Desired", "Tokens/s", "P99(ms)", "Age"]


def test_autoscaling_contract_fields() -> None:
    spec = crd_schema()["properties"]["spec"]["properties"]
    assert set(spec["autoscaling"]["properties"]) == AUTOSCALING_FIELDS
    status = crd_schema()["properties"]["status"]["properties"]
    assert status["autoscaling"]["x-kubernetes-preserve-unknown-fields"] is True


def test_tracing_is_off_unless_an_endpoint_is_given() -> None:
    monitoring = crd_schema()["properties"]["spec"]["properties"]["monitoring"]
    tracing = monitoring["properties"]["tracing"]
    assert tracing["default"] == {}
    fields = tracing["properties"]
    assert set(fields) == {"endpoint", "sampleRatio"}
    assert fields["endpoint"]["default"] == ""
    assert (fields["sampleRatio"]["minimum"], fields["sampleRatio"]["maximum"]) == (0, 1)

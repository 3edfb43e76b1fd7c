"""Mistakes the API server itself refuses, with a message a person can act on (CRD schema + CEL).
Needs only the CRD, not the operator."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from embedfleet.testing.cluster import Cluster

from .helpers import EXAMPLES

VALID: dict[str, Any] = {"model": {"source": "file:///opt/m"}}


def _with(path: str, value: Any, base: dict[str, Any] | None = None) -> dict[str, Any]:
    spec = copy.deepcopy(base if base is not None else VALID)
    node = spec
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return spec


HF = {"model": {"source": "hf://org/model"}}

# (case, metadata.name, spec, fragment of the API server's message)
CASES: list[tuple[str, str, dict[str, Any], str]] = [
    ("s3", "bad", _with("model.source", "s3://b/m"), "is not hf://org/name[@revision]"),
    ("hf-no-org", "bad", _with("model.source", "hf://m"), "is not hf://org/name[@revision]"),
    ("pvc-claim", "bad", _with("model.source", "pvc://Claim_1/m"), "pvc://claim/path"),
    ("file-relative", "bad", _with("model.source", "file://m"), "file:///absolute/path"),
    ("dotdot", "bad", _with("model.source", "pvc://c/a/../etc"), "must not contain '..'"),
    ("no-source", "bad", {"model": {"task": "embed"}}, "spec.model.source: Required value"),
    (
        "min-over-max",
        "bad",
        _with("autoscaling", {"minReplicas": 5, "maxReplicas": 2}),
        "autoscaling.minReplicas must not exceed autoscaling.maxReplicas",
    ),
    (
        "negative-tokens",
        "bad",
        _with("autoscaling.targetTokensPerSecond", -100),
        "spec.autoscaling.targetTokensPerSecond: Invalid value: -100",
    ),
    ("negative-replicas", "bad", _with("worker.replicas", -1), "spec.worker.replicas: Invalid"),
    ("unknown-task", "bad", _with("model.task", "generate"), 'Unsupported value: "generate"'),
    ("graphs-enum", "bad", _with("worker.engine.cudaGraphs", "on"), 'Unsupported value: "on"'),
    (
        "utilization-over-1",
        "bad",
        _with("autoscaling.targetUtilization", 1.5),
        "spec.autoscaling.targetUtilization: Invalid value: 1.5",
    ),
    ("tolerance-1", "bad", _with("autoscaling.tolerance", 1), "spec.autoscaling.tolerance"),
    (
        "revision-twice",
        "bad",
        _with("model.revision", "v2", {"model": {"source": "hf://o/m@v1"}}),
        "not both",
    ),
    ("revision-file", "bad", _with("model.revision", "v2"), "model.revision applies only to hf://"),
    (
        "cache-both",
        "bad",
        _with("model.cache", {"claimName": "c", "sizeLimit": "1Gi"}, HF),
        "claimName (an existing PVC) or sizeLimit (an emptyDir), not both",
    ),
    ("cache-file", "bad", _with("model.cache", {"sizeLimit": "1Gi"}), "applies only to hf://"),
    ("flash-cpu", "bad", _with("worker.engine.attention", "flash-attn"), "flash-attn needs a GPU"),
    (
        "cpu-runtime-enum",
        "bad",
        _with("worker.engine.cpuRuntime", "onnx"),
        'spec.worker.engine.cpuRuntime: Unsupported value: "onnx"',
    ),
    (
        "front-enum",
        "bad",
        _with("worker.front", "grpc"),
        'spec.worker.front: Unsupported value: "grpc"',
    ),
    (
        "openvino-gpu",
        "bad",
        _with("worker", {"gpus": 1, "engine": {"cpuRuntime": "openvino"}}),
        "worker.engine.cpuRuntime inductor and openvino run on CPU only",
    ),
    (
        "gpu-in-limits",
        "bad",
        _with("worker.resources", {"limits": {"nvidia.com/gpu": 1}}),
        "set GPUs with worker.gpus",
    ),
    (
        "prometheus-url",
        "bad",
        _with("autoscaling.prometheusURL", "prometheus:9090"),
        "must be an http:// or https:// URL",
    ),
    (
        "panic-over-stable",
        "bad",
        _with("autoscaling", {"panicWindowSeconds": 120, "stableWindowSeconds": 60}),
        "panicWindowSeconds must not exceed",
    ),
    ("typo-field", "bad", _with("worker.gpu", 1), 'unknown field "spec.worker.gpu"'),
    (
        "auth-secret-name",
        "bad",
        _with("gateway.auth", {"secretRef": {"name": "Team_Keys"}}),
        'spec.gateway.auth.secretRef.name: Invalid value: "Team_Keys": must be a Secret name',
    ),
    (
        "auth-no-name",
        "bad",
        _with("gateway.auth", {"secretRef": {"key": "k"}}),
        "spec.gateway.auth.secretRef.name: Required value",
    ),
    (
        "auth-key",
        "bad",
        _with("gateway.auth", {"secretRef": {"name": "keys", "key": "a/b"}}),
        "must be a Secret data key",
    ),
    (
        "auth-metrics-without-keys",
        "bad",
        _with("gateway.auth", {"perKeyMetrics": True}),
        "gateway.auth.perKeyMetrics needs gateway.auth.secretRef",
    ),
    (
        "calibration-name",
        "bad",
        _with("gateway.quantization", {"configMapRef": {"name": "-ranges"}}),
        "must be a ConfigMap name",
    ),
    ("overlap", "bad", _with("gateway.splitOverlapTokens", -1), "spec.gateway.splitOverlapTokens"),
    ("queue-zero", "bad", _with("gateway.maxQueueSeconds", 0), "spec.gateway.maxQueueSeconds"),
    ("queue-hour", "bad", _with("gateway.maxQueueSeconds", 3601), "spec.gateway.maxQueueSeconds"),
    ("queue-text", "bad", _with("gateway.maxQueueSeconds", "5"), "spec.gateway.maxQueueSeconds"),
    (
        "engines-two-gpus",
        "bad",
        _with("worker", {"gpus": 2, "enginesPerGPU": 4}),
        "enginesPerGPU above 1 shares one device",
    ),
    ("engines-zero", "bad", _with("worker.enginesPerGPU", 0), "spec.worker.enginesPerGPU"),
    (
        "graph-buckets-lazy",
        "bad",
        _with("worker", {"gpus": 1, "engine": {"graphBuckets": [128]}}),
        "graphBuckets needs worker.engine.cudaGraphs eager",
    ),
    ("buckets-enum", "bad", _with("worker.engine.tokenBuckets", "log"), 'Unsupported value: "log"'),
    (
        "flashinfer-cpu",
        "bad",
        _with("worker.engine.attention", "flashinfer"),
        "flashinfer needs a GPU",
    ),
    (
        "tracing-endpoint",
        "bad",
        _with("monitoring.tracing.endpoint", "otel:4317"),
        "monitoring.tracing.endpoint must be an http:// or https:// URL",
    ),
    (
        "tracing-ratio",
        "bad",
        _with("monitoring.tracing.sampleRatio", 1.5),
        "spec.monitoring.tracing.sampleRatio: Invalid value: 1.5",
    ),
    (
        "inflight-under-a-batch",
        "bad",
        _with(
            "worker.memory.maxInflightBytes",
            2 << 20,
            _with("worker.engine.maxBatchTokens", 1 << 18),
        ),
        "at least 9 bytes per token of worker.engine.maxBatchTokens",
    ),
    (
        "inflight-under-a-default-batch",
        "bad",
        _with("worker.memory.maxInflightBytes", 100_000),
        "spec.worker.memory.maxInflightBytes: Invalid value: 100000",
    ),
    ("trim-negative", "bad", _with("worker.memory.mallocTrimSeconds", -1), "mallocTrimSeconds"),
    (
        "shared-name",
        "bad",
        _with("gateway.shared", "Search_1"),
        "gateway.shared 'Search_1' must start with a letter",
    ),
    ("shared-dash-end", "bad", _with("gateway.shared", "search-"), "must start with a letter"),
    (
        "shared-long",
        "bad",
        _with("gateway.shared", "s" * 41),
        "spec.gateway.shared: Too long: may not be",
    ),
    (
        # removed with the Python gateway: a manifest that still sets it is refused by name
        "gateway-implementation",
        "bad",
        _with("gateway.implementation", "python"),
        'unknown field "spec.gateway.implementation"',
    ),
    ("long-name", "a" * 41, VALID, "at most 40 characters"),
    ("name-digit-first", "1minilm", VALID, "must start with a letter"),
]


def _manifest(name: str, spec: dict[str, Any]) -> str:
    return json.dumps(
        {
            "apiVersion": "embedfleet.dev/v1alpha1",
            "kind": "EmbeddingDeployment",
            "metadata": {"name": name},
            "spec": spec,
        }
    )


def test_invalid_manifests_are_refused_with_a_readable_message(
    crd_installed: Cluster, k8s_namespace: str
) -> None:
    cluster, ns = crd_installed, k8s_namespace
    assert len(CASES) >= 15
    wrong = []
    for case, name, spec, fragment in CASES:
        proc = cluster.kubectl(
            "apply", "-n", ns, "-f", "-", input=_manifest(name, spec), check=False
        )
        if proc.returncode == 0 or fragment not in proc.stderr:
            wrong.append(f"{case}: rc={proc.returncode} stderr={proc.stderr.strip()}")
    assert not wrong, "\n".join(wrong)
    assert json.loads(cluster.kubectl("get", "emb", "-n", ns, "-o", "json").stdout)["items"] == []


def test_immutable_task(crd_installed: Cluster, k8s_namespace: str) -> None:
    cluster, ns = crd_installed, k8s_namespace
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=_manifest("fixed", VALID))
    changed = _manifest("fixed", _with("model.task", "score"))
    proc = cluster.kubectl("apply", "-n", ns, "-f", "-", input=changed, check=False)
    assert proc.returncode != 0
    assert "model.task cannot change after creation" in proc.stderr
    # Other fields still change.
    cluster.kubectl(
        "apply", "-n", ns, "-f", "-", input=_manifest("fixed", _with("worker.replicas", 3))
    )


@pytest.mark.parametrize(
    "example",
    [
        "minilm.yaml",
        "qwen3-embedding-gpu.yaml",
        "reranker.yaml",
        "qwen3-reranker.yaml",
        "splade.yaml",
        "pplx-embed.yaml",
    ],
)
def test_examples_are_valid(crd_installed: Cluster, k8s_namespace: str, example: str) -> None:
    crd_installed.kubectl(
        "apply", "--dry-run=server", "-n", k8s_namespace, "-f", str(EXAMPLES / example)
    )


def test_gateway_auth_is_accepted_with_its_defaults(
    crd_installed: Cluster, k8s_namespace: str
) -> None:
    spec = _with("gateway.auth", {"secretRef": {"name": "team.keys-1"}, "perKeyMetrics": True})
    spec = _with("gateway.quantization", {"configMapRef": {"name": "ranges"}}, spec)
    crd_installed.kubectl("apply", "-n", k8s_namespace, "-f", "-", input=_manifest("keyed", spec))
    got = json.loads(
        crd_installed.kubectl("get", "emb", "keyed", "-n", k8s_namespace, "-o", "json").stdout
    )["spec"]["gateway"]
    assert got["auth"] == {
        "secretRef": {"name": "team.keys-1", "key": "api-keys"},
        "perKeyMetrics": True,
    }
    assert got["quantization"]["configMapRef"]["key"] == "embedfleet_quantization.json"
    assert got["splitLongInputs"] is False
    assert got["splitOverlapTokens"] == 32
    assert got["maxQueueSeconds"] == 30
    assert "implementation" not in got


def test_graph_and_engine_fields_are_accepted(crd_installed: Cluster, k8s_namespace: str) -> None:
    cluster, ns = crd_installed, k8s_namespace
    worker = {
        "gpus": 1,
        "enginesPerGPU": 4,
        "engine": {
            "cudaGraphs": "eager",
            "graphBuckets": [128, 512],
            "maxGraphs": 32,
            "tokenBuckets": "geometric",
            "tokenBucketsPerOctave": 4,
            "sequenceBuckets": "fixed",
            "attention": "flashinfer",
        },
    }
    spec = _with("worker", worker)
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=_manifest("graphs", spec))
    got = json.loads(cluster.kubectl("get", "emb", "graphs", "-n", ns, "-o", "json").stdout)
    assert got["spec"]["worker"]["enginesPerGPU"] == 4
    assert got["spec"]["worker"]["engine"]["tokenBucketSwitch"] == 1024  # defaulted
    assert got["spec"]["worker"]["engine"]["cpuRuntime"] == "auto"  # defaulted, GPU or not
    assert got["spec"]["worker"]["front"] == "rust"  # defaulted
    cluster.kubectl("delete", "emb", "graphs", "-n", ns)
    cpu = _with("worker.engine.cpuRuntime", "openvino")
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=_manifest("openvino", cpu))
    got = json.loads(cluster.kubectl("get", "emb", "openvino", "-n", ns, "-o", "json").stdout)
    assert got["spec"]["worker"]["engine"]["cpuRuntime"] == "openvino"
    cluster.kubectl("delete", "emb", "openvino", "-n", ns)


def test_tracing_settings_are_accepted(crd_installed: Cluster, k8s_namespace: str) -> None:
    cluster, ns = crd_installed, k8s_namespace
    tracing = {"endpoint": "http://otel-collector.observability:4317", "sampleRatio": 0.1}
    spec = _with("monitoring.tracing", tracing)
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=_manifest("traced", spec))
    got = json.loads(cluster.kubectl("get", "emb", "traced", "-n", ns, "-o", "json").stdout)
    assert got["spec"]["monitoring"]["tracing"] == tracing
    untraced = json.loads(
        cluster.kubectl(
            "apply", "-n", ns, "-o", "json", "-f", "-", input=_manifest("untraced", VALID)
        ).stdout
    )
    # Defaults: off (no endpoint), everything sampled once an endpoint is set.
    assert untraced["spec"]["monitoring"]["tracing"] == {"endpoint": "", "sampleRatio": 1.0}

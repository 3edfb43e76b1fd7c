"""Worker pod shapes on the real node (CPU): enginesPerGPU, one worker pod running two engine
processes, each its own port that the gateway discovers and balances over (through the Rust
front, the default); and worker.front python, the grpc asyncio front, still serving the fleet.
Runs on its own (its own helm install):

    pytest tests/e2e/test_engines_per_pod.py
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import numpy as np
import yaml
from prometheus_client.parser import text_string_to_metric_families

from .e2efleet import EMB_PATH, EXAMPLE, NAME, NAMESPACE, Fleet, condition

TEXTS = ["two engines in one pod", "each on its own port", "the gateway balances over both"]


def _gateway_workers(fleet: Fleet) -> dict[str, float]:
    """The gateway's workers by state, from its /metrics (the host routes to pod IPs)."""
    pod = fleet.pods("gateway")[0]
    url = f"http://{pod['status']['podIP']}:8080/metrics"
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    return {
        s.labels["state"]: s.value
        for family in text_string_to_metric_families(text)
        if family.name == "embedfleet_gateway_workers"
        for s in family.samples
    }


def _one_worker(**worker: Any) -> dict[str, Any]:
    """examples/minilm.yaml with one worker pod and `worker`'s fields set."""
    manifest: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"]["worker"].update(replicas=1, **worker)
    return manifest


def _apply(fleet: Fleet, manifest: dict[str, Any], what: str, timeout: float) -> None:
    """`kubectl apply` of manifest, watched until Available=True (the fleet described if not)."""
    fleet.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def available() -> bool:
        cond = condition(fleet.emb(), "Available")
        return bool(cond and cond["status"] == "True")

    try:
        fleet.wait(f"Available {what}", available, timeout=timeout)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{fleet.describe()}") from err


def test_two_engines_per_pod_are_two_balanced_workers(installed: Fleet) -> None:
    fleet = installed
    manifest = _one_worker(enginesPerGPU=2)
    manifest["spec"]["worker"]["resources"]["limits"]["memory"] = "3Gi"
    started = time.monotonic()
    _apply(fleet, manifest, "with two engines per pod", timeout=600)
    try:
        both = lambda: _gateway_workers(fleet).get("ready") == 2 or None  # noqa: E731
        fleet.wait("the gateway to see both engines", both, timeout=120)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{fleet.describe()}") from err
    seconds = round(time.monotonic() - started, 1)
    (pod,) = fleet.pods("worker")
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    assert ports == {"grpc": 50051, "metrics": 9090, "grpc-1": 50052, "metrics-1": 9091}
    log = fleet.logs(NAMESPACE, pod["metadata"]["name"])
    assert "engines started" in log
    assert log.count("self-check passed") == 2, log[-3000:]
    slices = fleet.api(
        f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices",
        labelSelector="kubernetes.io/service-name=minilm-worker",
    )["items"]
    names = {p["name"] for s in slices for p in s.get("ports") or []}
    assert {"grpc", "grpc-1"} <= names
    # Requests through the Service reach both engines: each engine's own tokens counter grows.
    # The balancer picks at random between idle engines: 20 requests all to one has p = 2^-19.
    for _ in range(20):
        got = fleet.embed_in_node(f"http://{fleet.cluster_ip()}/v1", TEXTS)
        assert len(got) == len(TEXTS)
        assert len(got[0]) == 384
    counts = []
    for port in (9090, 9091):
        scrape = (
            "import urllib.request; print(urllib.request.urlopen("
            f"'http://127.0.0.1:{port}/metrics', timeout=5).read().decode())"
        )
        text = fleet.kubectl(
            "exec", "-n", NAMESPACE, pod["metadata"]["name"], "--", "python3", "-c", scrape
        )
        tokens = [ln for ln in text.splitlines() if ln.startswith("embedfleet_worker_tokens_total")]
        counts.append(float(tokens[0].rsplit(" ", 1)[1]))
    assert all(c > 0 for c in counts), counts
    print(f"two engines per pod: Available in {seconds} s; tokens per engine {counts}")
    fleet.kubectl("delete", "-f", "-", input=json.dumps(manifest))


def _worker_metrics(pod: dict[str, Any]) -> dict[str, float]:
    """A worker pod's /metrics samples by name and labels (the host routes to pod IPs)."""
    url = f"http://{pod['status']['podIP']}:9090/metrics"
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _records(log: str, **fields: str) -> list[dict[str, Any]]:
    """The JSON log records carrying `fields`."""
    records = []
    for line in log.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and fields.items() <= record.items():
            records.append(record)
    return records


def test_the_python_front_serves_the_fleet(installed: Fleet, reference: Any) -> None:
    """worker.front python: the fleet's other front serves the gateway's calls with the Rust
    front's vectors and metrics (every other real-node test runs the default, rust)."""
    fleet = installed
    # The test above deletes its fleet without waiting: this one takes the same name.
    gone = lambda: fleet.api_or_none(f"{EMB_PATH}/{NAME}") is None or None  # noqa: E731
    fleet.wait("the previous fleet deleted", gone, timeout=120)
    manifest = _one_worker(front="python")
    started = time.monotonic()
    _apply(fleet, manifest, "with the Python front", timeout=300)
    seconds = round(time.monotonic() - started, 1)
    (pod,) = fleet.ready_pods("worker")
    log = fleet.logs(NAMESPACE, pod["metadata"]["name"])
    assert "self-check passed" in log, log[-3000:]
    assert _records(log, logger="embedfleet.worker.lifecycle", msg="serving"), log[-3000:]
    assert not _records(log, front="rust"), log[-3000:]
    calls = 5
    for _ in range(calls):
        got = np.asarray(fleet.embed_in_node(f"http://{fleet.cluster_ip()}/v1", TEXTS))
        want = reference.encode(TEXTS, normalize_embeddings=False, convert_to_numpy=True)
        cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
        assert float(cos.min()) >= 0.999, cos
    assert fleet.embed_ok(pod) == calls

    def capacity() -> float | None:
        value = _worker_metrics(pod).get("embedfleet_worker_capacity_tokens_per_second[]", 0.0)
        return value if value > 0 else None

    measured = fleet.wait("the Python front's capacity measured", capacity, timeout=60)
    print(f"python front: Available in {seconds} s; capacity {measured:.0f} tokens/s")
    fleet.kubectl("delete", "-f", "-", input=json.dumps(manifest))

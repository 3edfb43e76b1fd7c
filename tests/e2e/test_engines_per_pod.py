"""enginesPerGPU on the real node (CPU): one worker pod running two engine processes, each its
own port that the gateway discovers and balances over. Runs on its own (its own helm install):

    pytest tests/e2e/test_engines_per_pod.py
"""

from __future__ import annotations

import json
import time
import urllib.request

import yaml
from prometheus_client.parser import text_string_to_metric_families

from .e2efleet import EXAMPLE, NAMESPACE, Fleet, condition

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


def test_two_engines_per_pod_are_two_balanced_workers(installed: Fleet) -> None:
    fleet = installed
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"]["worker"]["replicas"] = 1
    manifest["spec"]["worker"]["enginesPerGPU"] = 2
    manifest["spec"]["worker"]["resources"]["limits"]["memory"] = "3Gi"
    started = time.monotonic()
    fleet.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def available() -> bool:
        cond = condition(fleet.emb(), "Available")
        return bool(cond and cond["status"] == "True")

    try:
        fleet.wait("Available with two engines per pod", available, timeout=600)
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

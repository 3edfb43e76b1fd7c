"""The autoscaler end to end: real control plane, the real operator process, real metrics.

KWOK's pods are fake (their IPs lead nowhere), so each worker pod gets a STUB WORKER process
(embedfleet.testing.stub_worker: the worker's real prometheus-client registry over HTTP, its
counters advanced at the rate the test sets) and the pod is annotated with
`embedfleet.dev/metrics-url` pointing at it: the documented override for pods whose metrics are
not at podIP:port. The test plays the gateway: it spreads the offered load evenly over the pods
whose stub is up. The worker Deployment's replicas must then follow the policy: up for load, up
for latency, down when the load goes, with a status and an Event for each decision.

Lives here (not tests/autoscaling) to share this directory's session-wide operator process: two
operators would wait on one leader lease.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from embedfleet.operator.autoscaling.signals import METRICS_URL_ANNOTATION
from embedfleet.testing.cluster import Cluster
from embedfleet.testing.stub_worker import StubWorker, start_stub

from .helpers import OperatorProcess, wait_until

NAME = "autoscaled"
CAPACITY = 10_000.0  # tokens/s per stub replica; the target is 8,000 at utilization 0.8


def manifest() -> dict[str, Any]:
    return {
        "apiVersion": "embedfleet.dev/v1alpha1",
        "kind": "EmbeddingDeployment",
        "metadata": {"name": NAME},
        "spec": {
            "model": {"source": "file:///opt/embedfleet/models/all-MiniLM-L6-v2"},
            "worker": {"replicas": 1},
            "autoscaling": {
                "enabled": True,
                "minReplicas": 1,
                "maxReplicas": 4,
                "p99LatencySLOMilliseconds": 500,
                "panicWindowSeconds": 10,
                "stableWindowSeconds": 10,
                # Short, so the test sees a scale-down; still masks a one-interval dip.
                "scaleDownStabilizationSeconds": 20,
            },
        },
    }


class FakeFleet:
    """Binds a stub worker to every running worker pod and spreads the load over them."""

    def __init__(self, cluster: Cluster, namespace: str, tmp: Path) -> None:
        self.cluster, self.namespace, self.tmp = cluster, namespace, tmp
        self.stubs: dict[str, StubWorker] = {}
        self.started: list[StubWorker] = []
        self.load = {"tokens_per_second": 0.0, "latency_seconds": 0.05}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def __enter__(self) -> FakeFleet:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for stub in self.started:
            stub.stop()

    def set(self, tokens_per_second: float, latency_seconds: float) -> None:
        self.load = {"tokens_per_second": tokens_per_second, "latency_seconds": latency_seconds}

    def _pods(self) -> list[dict[str, Any]]:
        proc = self.cluster.kubectl(
            "get", "pods", "-n", self.namespace, "-o", "json",
            "-l", f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=worker",
            check=False,
        )  # fmt: skip
        return list(json.loads(proc.stdout)["items"]) if proc.returncode == 0 else []

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._sync()
                self._stop.wait(0.5)
        except BaseException as err:  # surfaced by the test through `error`
            self.error = err

    def _sync(self) -> None:
        running = {
            p["metadata"]["name"]: p
            for p in self._pods()
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        }
        for name in list(self.stubs):
            if name not in running:
                self.stubs.pop(name).stop()  # the pod is gone: so is its process
        for name, pod in running.items():
            if name not in self.stubs:
                stub = start_stub(self.started, self.tmp, capacity=CAPACITY)
                self.stubs[name] = stub
            annotations = pod["metadata"].get("annotations") or {}
            if annotations.get(METRICS_URL_ANNOTATION) != self.stubs[name].url:
                self.cluster.kubectl(
                    "annotate", "pod", name, "-n", self.namespace, "--overwrite",
                    f"{METRICS_URL_ANNOTATION}={self.stubs[name].url}",
                )  # fmt: skip
        share = self.load["tokens_per_second"] / max(len(self.stubs), 1)
        for stub in self.stubs.values():
            stub.set_load(
                tokens_per_second=share,
                latency_seconds=self.load["latency_seconds"],
                capacity=CAPACITY,
            )


@pytest.fixture
def fleet(k8s_cluster: Cluster, k8s_namespace: str, tmp_path: Path) -> Iterator[FakeFleet]:
    with FakeFleet(k8s_cluster, k8s_namespace, tmp_path) as f:
        yield f


def emb(cluster: Cluster, ns: str) -> dict[str, Any]:
    return dict(json.loads(cluster.kubectl("get", "emb", NAME, "-n", ns, "-o", "json").stdout))


def worker_replicas(cluster: Cluster, ns: str) -> int | None:
    proc = cluster.kubectl(
        "get", "deployment", f"{NAME}-worker", "-n", ns, "-o", "json", check=False
    )
    return int(json.loads(proc.stdout)["spec"]["replicas"]) if proc.returncode == 0 else None


def event_reasons(cluster: Cluster, ns: str) -> list[str]:
    events = json.loads(
        cluster.kubectl(
            "get", "events", "-n", ns, "-o", "json", "--field-selector",
            f"involvedObject.kind=EmbeddingDeployment,involvedObject.name={NAME}",
        ).stdout
    )  # fmt: skip
    return [e["reason"] for e in events["items"]]


def test_worker_replicas_follow_load_and_latency(
    operator: OperatorProcess, k8s_cluster: Cluster, k8s_namespace: str, fleet: FakeFleet
) -> None:
    cluster, ns, op = k8s_cluster, k8s_namespace, operator
    path = fleet.tmp / "emb.json"
    path.write_text(json.dumps(manifest()))
    cluster.kubectl("apply", "-n", ns, "-f", str(path))

    def replicas_become(n: int) -> None:
        def probe() -> bool:
            if fleet.error:
                raise fleet.error
            return worker_replicas(cluster, ns) == n

        wait_until(f"{n} worker replicas", probe, op, timeout=90)

    # Idle: the autoscaler measures (capacity from the stub's gauge) and keeps minReplicas.
    wait_until(
        "a measurement in status",
        lambda: (
            emb(cluster, ns).get("status", {}).get("autoscaling", {}).get("capacityTokensPerSecond")
        ),
        op,
    )
    assert worker_replicas(cluster, ns) == 1

    # 20,000 tokens/s over 8,000 per replica: ceil(2.5) = 3.
    fleet.set(tokens_per_second=20_000, latency_seconds=0.05)
    replicas_become(3)
    status = emb(cluster, ns)["status"]
    auto = status["autoscaling"]
    assert auto["lastScaleReason"] in {"ScaleUpForLoad", "ScaleUpForBurst"}
    assert auto["observedTokensPerSecond"] == pytest.approx(20_000, rel=0.35)
    assert auto["capacityTokensPerSecond"] == CAPACITY
    assert auto["targetTokensPerSecondPerReplica"] == pytest.approx(8_000)
    assert auto["lastScaleTime"].endswith("Z")
    assert auto["policyState"]["load"], "the policy's memory is kept in status"
    wait_until(
        "the scale-up Event",
        lambda: bool({"ScaleUpForLoad", "ScaleUpForBurst"} & set(event_reasons(cluster, ns))),
        op,
    )
    # Mirrored to the top of status by the operator's next reconcile.
    wait_until(
        "status.desiredReplicas 3",
        lambda: emb(cluster, ns)["status"].get("desiredReplicas") == 3,
        op,
    )
    status = emb(cluster, ns)["status"]
    scaling = next(c for c in status["conditions"] if c["type"] == "ScalingActive")
    assert scaling["status"] == "True"

    # Same load, p99 above the SLO for the whole panic window: the latency guard adds one.
    fleet.set(tokens_per_second=20_000, latency_seconds=0.9)
    replicas_become(4)
    assert emb(cluster, ns)["status"]["autoscaling"]["lastScaleReason"] == "ScaleUpForLatency"
    wait_until("the latency Event", lambda: "ScaleUpForLatency" in event_reasons(cluster, ns), op)

    # Load gone and latency fine: down to minReplicas once the stabilization window has passed.
    fleet.set(tokens_per_second=1_000, latency_seconds=0.02)
    replicas_become(1)
    auto = emb(cluster, ns)["status"]["autoscaling"]
    assert auto["lastScaleReason"] == "ScaleDownForLoad"
    assert "ScaleDownForLoad" in event_reasons(cluster, ns)

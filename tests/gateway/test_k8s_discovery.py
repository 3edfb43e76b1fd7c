"""The EndpointSlice watch against a REAL kube-apiserver (the `k8s_cluster` fixture): slices
appearing, changing readiness and disappearing reach the gateway's worker set live. The workers
behind the addresses are FAKE in-process gRPC servers (fakes.py); the watch is what is tested."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from embedfleet.common.modeldir import ModelDir
from embedfleet.gateway.settings import GatewaySettings
from embedfleet.testing.cluster import Cluster

from .fakes import FakeWorker
from .helpers import GatewayThread, host_fakes, service_slice, wait_until

SERVICE = "workers"


@pytest.fixture
def fakes() -> Iterator[list[FakeWorker]]:
    with host_fakes(2) as workers:
        yield workers


def test_endpointslice_changes_reach_the_gateway(
    k8s_cluster: Cluster, k8s_namespace: str, minilm: ModelDir, fakes: list[FakeWorker]
) -> None:
    path = f"/apis/discovery.k8s.io/v1/namespaces/{k8s_namespace}/endpointslices"
    k8s_cluster.api.create(path, service_slice("a", SERVICE, fakes[0].host, fakes[0].port))
    settings = GatewaySettings(
        k8s_service=f"{k8s_namespace}/{SERVICE}",
        kubeconfig=str(k8s_cluster.kubeconfig),
        probe_seconds=0.1,
        chunk_tokens=10,
        min_chunk_tokens=1,
    )
    gw = GatewayThread(settings, minilm).start()
    try:
        balancer = gw.app.balancer
        first, second = fakes[0].address, fakes[1].address
        wait_until("listed slice", lambda: set(balancer.endpoints) == {first})
        wait_until("first ready", lambda: len(balancer.usable()) == 1)
        k8s_cluster.api.create(path, service_slice("b", SERVICE, fakes[1].host, fakes[1].port))
        wait_until("added slice", lambda: set(balancer.endpoints) == {first, second})
        wait_until("both ready", lambda: len(balancer.usable()) == 2)
        body = {"input": [[i + 1] * 3 for i in range(40)]}
        reply = httpx.post(gw.url + "/v1/embeddings", json=body, timeout=30)
        assert {int(d["embedding"][3]) for d in reply.json()["data"]} == {0, 1}
        # A terminating (not ready) endpoint leaves the rotation; a deleted slice too.
        k8s_cluster.api.delete(f"{path}/a")
        k8s_cluster.api.create(
            path, service_slice("a", SERVICE, fakes[0].host, fakes[0].port, ready=False)
        )
        wait_until("unready dropped", lambda: set(balancer.endpoints) == {second})
        k8s_cluster.api.delete(f"{path}/b")
        wait_until("deleted dropped", lambda: not balancer.endpoints)
        assert httpx.get(gw.url + "/ready").status_code == 503
    finally:
        gw.stop()

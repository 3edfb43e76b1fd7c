"""The EndpointSlice watch against a REAL kube-apiserver (the `k8s_cluster` fixture): slices
appearing, changing readiness and disappearing reach the gateway's worker set live. The workers
behind the addresses are FAKE in-process gRPC servers (fakes.py); the watch is what is tested."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from embedfleet.common.modeldir import ModelDir
from embedfleet.gateway.settings import GatewaySettings
from embedfleet.testing.cluster import Cluster

from .fakes import FakeWorker
from .helpers import GatewayThread, wait_until

SERVICE = "workers"


def host_ip() -> str:
    """This machine's outbound IPv4 address: the API refuses loopback endpoint addresses."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(("203.0.113.1", 9))  # UDP connect sends nothing; it only picks a route
            return str(sock.getsockname()[0])
    except OSError:  # no default route: any non-loopback address of this host
        names = socket.gethostbyname_ex(socket.gethostname())[2]
        return next(a for a in names if not a.startswith("127."))


def _slice(name: str, ip: str, port: int, ready: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": SERVICE}},
        "addressType": "IPv4",
        "ports": [{"name": "grpc", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": ready}}],
    }


@pytest.fixture
def fakes() -> Iterator[list[FakeWorker]]:
    workers = [FakeWorker(i, host=host_ip()).start() for i in range(2)]
    yield workers
    for w in workers:
        w.stop()


def test_endpointslice_changes_reach_the_gateway(
    k8s_cluster: Cluster, k8s_namespace: str, minilm: ModelDir, fakes: list[FakeWorker]
) -> None:
    path = f"/apis/discovery.k8s.io/v1/namespaces/{k8s_namespace}/endpointslices"
    k8s_cluster.api.create(path, _slice("a", fakes[0].host, fakes[0].port))
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
        k8s_cluster.api.create(path, _slice("b", fakes[1].host, fakes[1].port))
        wait_until("added slice", lambda: set(balancer.endpoints) == {first, second})
        wait_until("both ready", lambda: len(balancer.usable()) == 2)
        body = {"input": [[i + 1] * 3 for i in range(40)]}
        reply = httpx.post(gw.url + "/v1/embeddings", json=body, timeout=30)
        assert {int(d["embedding"][3]) for d in reply.json()["data"]} == {0, 1}
        # A terminating (not ready) endpoint leaves the rotation; a deleted slice too.
        k8s_cluster.api.delete(f"{path}/a")
        k8s_cluster.api.create(path, _slice("a", fakes[0].host, fakes[0].port, ready=False))
        wait_until("unready dropped", lambda: set(balancer.endpoints) == {second})
        k8s_cluster.api.delete(f"{path}/b")
        wait_until("deleted dropped", lambda: not balancer.endpoints)
        assert httpx.get(gw.url + "/ready").status_code == 503
    finally:
        gw.stop()

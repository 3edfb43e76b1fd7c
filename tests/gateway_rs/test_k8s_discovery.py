"""--k8s-service against a REAL kube-apiserver (the `k8s_cluster` fixture): both gateways watch
one Service's EndpointSlices, through a kubeconfig with a client certificate, and follow slices
appearing, turning unready and disappearing alike. The workers behind the addresses are FAKE
in-process gRPC servers (tests/gateway/fakes.py), shared by both; the watch is what is tested."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from embedfleet.common.modeldir import ModelDir
from embedfleet.gateway.settings import GatewaySettings
from embedfleet.testing.cluster import Cluster
from tests.gateway.fakes import FakeWorker
from tests.gateway.helpers import host_fakes, service_slice, wait_until

from .conftest import LIMITS, flags
from .pair import gateways

SERVICE = "workers"
#: small chunks, so that 40 inputs spread over every worker there is
SPREAD = {**LIMITS, "chunk_tokens": 10, "min_chunk_tokens": 1}
INPUTS = [[i + 1] * 3 for i in range(40)]


@pytest.fixture
def fakes() -> Iterator[list[FakeWorker]]:
    with host_fakes(2) as workers:
        yield workers


def test_endpointslice_changes_reach_both_gateways_alike(
    k8s_cluster: Cluster,
    k8s_namespace: str,
    minilm: ModelDir,
    fakes: list[FakeWorker],
    tmp_path: Path,
) -> None:
    path = f"/apis/discovery.k8s.io/v1/namespaces/{k8s_namespace}/endpointslices"
    k8s_cluster.api.create(path, service_slice("a", SERVICE, fakes[0].host, fakes[0].port))
    watch = {"k8s_service": f"{k8s_namespace}/{SERVICE}", "kubeconfig": str(k8s_cluster.kubeconfig)}
    settings = GatewaySettings(**watch, **SPREAD)  # type: ignore[arg-type]
    rust = flags({**watch, **SPREAD})
    with gateways(minilm, settings, rust, tmp_path / "gateway-rs.log", (fakes, fakes)) as pair:
        wait_until("listed slice", lambda: pair.worker_counts() == [(1, 1)] * 2)
        assert pair.served_by(INPUTS) == [{0}, {0}]
        second = service_slice("b", SERVICE, fakes[1].host, fakes[1].port)
        k8s_cluster.api.create(path, second)
        wait_until("added slice", lambda: pair.worker_counts() == [(2, 2)] * 2)
        assert pair.served_by(INPUTS) == [{0, 1}, {0, 1}]
        # A terminating (not ready) endpoint leaves the rotation; a deleted slice too.
        k8s_cluster.api.delete(f"{path}/a")
        unready = service_slice("a", SERVICE, fakes[0].host, fakes[0].port, ready=False)
        k8s_cluster.api.create(path, unready)
        wait_until("unready dropped", lambda: pair.worker_counts() == [(1, 1)] * 2)
        assert pair.served_by(INPUTS) == [{1}, {1}]
        k8s_cluster.api.delete(f"{path}/b")
        wait_until("deleted dropped", lambda: pair.worker_counts() == [(0, 0)] * 2)
        statuses = [one.request("GET", "/ready").status for one in (pair.python(), pair.rust())]
        assert statuses == [503, 503]

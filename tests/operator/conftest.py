"""Fixtures for the operator tests. The operator runs as a real process, shared by every cluster
test here, as the ServiceAccount of operator/deploy/rbac.yaml: a rule missing from that file fails
these tests the way it would fail in a cluster."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from embedfleet.testing.cluster import Cluster

from .helpers import CRD_PATH, OPERATOR_NAMESPACE, RBAC, OperatorProcess, operator_kubeconfig


@pytest.fixture(scope="session")
def crd_installed(k8s_cluster: Cluster) -> Cluster:
    k8s_cluster.kubectl("apply", "--server-side", "-f", str(CRD_PATH))
    k8s_cluster.wait_established("embeddingdeployments.embedfleet.dev")
    return k8s_cluster


@pytest.fixture(scope="session")
def operator_rbac(crd_installed: Cluster) -> Cluster:
    """The operator's namespace, ServiceAccount and RBAC (operator/deploy/rbac.yaml)."""
    crd_installed.kubectl("create", "namespace", OPERATOR_NAMESPACE, check=False)
    crd_installed.kubectl("apply", "-f", str(RBAC))
    return crd_installed


@pytest.fixture(scope="session")
def operator(
    operator_rbac: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    cluster = operator_rbac
    tmp = tmp_path_factory.mktemp("operator")
    process = OperatorProcess(
        cluster, operator_kubeconfig(cluster, tmp / "kubeconfig"), tmp / "log"
    )
    process.start()
    try:
        yield process
    finally:
        code = process.stop()
        print(f"operator log: {process.log} (exit {code})")


@pytest.fixture
def kube_json(k8s_cluster: Cluster) -> Callable[..., Any]:
    def run(*args: str) -> Any:
        return json.loads(k8s_cluster.kubectl(*args, "-o", "json").stdout)

    return run

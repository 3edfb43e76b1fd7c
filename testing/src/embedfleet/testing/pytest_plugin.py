"""pytest fixtures for a real control plane.

Enabled automatically once embedfleet-testing is installed (a `pytest11` entry point); otherwise
add `pytest_plugins = ["embedfleet.testing.pytest_plugin"]` to the top-level conftest.py.

    def test_crd(k8s_cluster: Cluster, k8s_namespace: str) -> None:
        k8s_cluster.kubectl("apply", "-n", k8s_namespace, "-f", "crds/")

Tests that use `k8s_cluster` (directly or through `k8s_namespace`) are marked `k8s`, so
`-m "not k8s"` deselects them. Without built binaries the first such test builds them.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator

import pytest

from embedfleet.testing.cluster import Cluster, ClusterConfig

FIXTURE = "k8s_cluster"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "k8s: needs the real Kubernetes control plane")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.k8s)


@pytest.fixture(scope="session")
def k8s_cluster() -> Iterator[Cluster]:
    """etcd, kube-apiserver, controller-manager, scheduler and KWOK with 3 fake 8-GPU nodes."""
    cluster = Cluster.start(ClusterConfig())
    try:
        yield cluster
    finally:
        cluster.stop()


def namespace_name(test_name: str) -> str:
    """A DNS-1123 label unique to one test run: a slug of the test's name plus a random suffix."""
    slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:48].rstrip("-")
    return f"{slug or 'test'}-{secrets.token_hex(3)}"


@pytest.fixture
def k8s_namespace(k8s_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (its default ServiceAccount ready), deleted after the test."""
    name = namespace_name(request.node.name)
    k8s_cluster.create_namespace(name, labels={"embedfleet.dev/test": "true"})
    try:
        yield name
    finally:
        k8s_cluster.delete_namespace(name)

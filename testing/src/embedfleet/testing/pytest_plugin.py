"""pytest fixtures for a real control plane.

Enabled automatically once embedfleet-testing is installed (a `pytest11` entry point); otherwise
add `pytest_plugins = ["embedfleet.testing.pytest_plugin"]` to the top-level conftest.py.

    def test_crd(k8s_cluster: Cluster, k8s_namespace: str) -> None:
        k8s_cluster.kubectl("apply", "-n", k8s_namespace, "-f", "crds/")

Tests that use `k8s_cluster` (directly or through `k8s_namespace`) are marked `k8s`, so
`-m "not k8s"` deselects them. Without built binaries the first such test builds them.

`k8s_real_node` is a control plane of its own plus one real node (embedfleet.testing.node);
its tests are marked `k8s` and `real_node`. Where the node cannot start they fail, with the
reason, rather than skip.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from embedfleet.testing.cluster import Cluster, ClusterConfig
from embedfleet.testing.node import RealNode, start_with_cluster

FIXTURE = "k8s_cluster"
REAL_NODE_FIXTURE = "k8s_real_node"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "k8s: needs the real Kubernetes control plane")
    config.addinivalue_line("markers", "real_node: needs a real Kubernetes node (root)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if FIXTURE in fixtures or REAL_NODE_FIXTURE in fixtures:
            item.add_marker(pytest.mark.k8s)
        if REAL_NODE_FIXTURE in fixtures:
            item.add_marker(pytest.mark.real_node)


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


@contextmanager
def fresh_namespace(cluster: Cluster, test_name: str) -> Iterator[str]:
    name = namespace_name(test_name)
    cluster.create_namespace(name, labels={"embedfleet.dev/test": "true"})
    try:
        yield name
    finally:
        cluster.delete_namespace(name)


@pytest.fixture
def k8s_namespace(k8s_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (its default ServiceAccount ready), deleted after the test."""
    with fresh_namespace(k8s_cluster, request.node.name) as name:
        yield name


@pytest.fixture(scope="session")
def k8s_real_node() -> Iterator[RealNode]:
    """A control plane (no KWOK nodes) plus one real node: containerd, kubelet and kube-proxy,
    pods on a bridge in the node's own network namespace. `.cluster` is the control plane;
    `.import_image(tar)` loads an image archive; `.image_ref("testserver")` names a tiny test
    image already imported."""
    node = start_with_cluster()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture
def k8s_real_node_namespace(
    k8s_real_node: RealNode, request: pytest.FixtureRequest
) -> Iterator[str]:
    """A fresh namespace on the real node's control plane, deleted after the test."""
    with fresh_namespace(k8s_real_node.cluster, request.node.name) as name:
        yield name

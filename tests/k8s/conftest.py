"""Helpers for the control-plane tests. The fixtures themselves (k8s_cluster, k8s_namespace)
come from the embedfleet.testing.pytest_plugin plugin, so other test trees get them too."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from embedfleet.testing.cluster import Cluster


@pytest.fixture
def kubectl_json(k8s_cluster: Cluster) -> Callable[..., Any]:
    """Runs `kubectl <args> -o json` and decodes the result."""

    def run(*args: str) -> Any:
        return json.loads(k8s_cluster.kubectl(*args, "-o", "json").stdout)

    return run

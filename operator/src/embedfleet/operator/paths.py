"""REST paths of the kinds the operator reads and writes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from embedfleet.operator.spec import GROUP, PLURAL, VERSION

_PLURALS = {
    "ConfigMap": "configmaps",
    "Service": "services",
    "ServiceAccount": "serviceaccounts",
    "Deployment": "deployments",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "ServiceMonitor": "servicemonitors",
    "Lease": "leases",
}


def collection(api_version: str, kind: str, namespace: str) -> str:
    """The kind's collection in `namespace`; empty means across every namespace."""
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    scope = f"/namespaces/{namespace}" if namespace else ""
    return f"{root}{scope}/{_PLURALS[kind]}"


def of(manifest: Mapping[str, Any]) -> str:
    meta = manifest["metadata"]
    base = collection(manifest["apiVersion"], manifest["kind"], meta["namespace"])
    return f"{base}/{meta['name']}"


def embedding_deployments(namespace: str = "") -> str:
    scope = f"/namespaces/{namespace}" if namespace else ""
    return f"/apis/{GROUP}/{VERSION}{scope}/{PLURAL}"


def embedding_deployment(namespace: str, name: str) -> str:
    return f"{embedding_deployments(namespace)}/{name}"

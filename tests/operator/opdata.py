"""Shared fixtures' data for the operator tests: the repository's CRD and examples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "crds" / "embedfleet.dev_embeddingdeployments.yaml"
EXAMPLES = REPO / "examples"


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def crd_schema() -> dict[str, Any]:
    crd = load_yaml(CRD_PATH)
    (version,) = crd["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


MINILM_CHILDREN = {
    "ConfigMap/minilm-config",
    "Deployment/minilm-gateway",
    "Deployment/minilm-worker",
    "PodDisruptionBudget/minilm-gateway",
    "PodDisruptionBudget/minilm-worker",
    "Role/minilm-gateway",
    "RoleBinding/minilm-gateway",
    "Service/minilm",
    "Service/minilm-worker",
    "ServiceAccount/minilm-gateway",
}
"""Children of an EmbeddingDeployment named minilm (no ServiceMonitor)."""

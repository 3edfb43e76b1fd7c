"""The reconciler's I/O shell against a stand-in API (FakeKube, a mock by name): how it treats
the API server's refusals."""

from __future__ import annotations

from typing import Any

from embedfleet.operator import paths
from embedfleet.operator.kube import KubeError
from embedfleet.operator.manifests import Images
from embedfleet.operator.reconciler import Reconciler

BODY = {
    "apiVersion": "embedfleet.dev/v1alpha1",
    "kind": "EmbeddingDeployment",
    "metadata": {"name": "minilm", "namespace": "ml", "uid": "u-1", "generation": 1},
    "spec": {"model": {"source": "file:///m"}},
}


class FakeKube:
    """A mock of Kube: serves one EmbeddingDeployment, echoes applies, forbids ServiceMonitors
    (the chart's default, rbac.serviceMonitors off) while their CRD is served."""

    def __init__(self) -> None:
        self.applied: list[str] = []
        self.status: dict[str, Any] | None = None

    def get_or_none(self, path: str) -> Any:
        return BODY if path == paths.embedding_deployment("ml", "minilm") else None

    def has_resource(self, group_version: str, plural: str) -> bool:
        return (group_version, plural) == ("monitoring.coreos.com/v1", "servicemonitors")

    def apply(self, path: str, manifest: dict[str, Any], manager: str) -> Any:
        self.applied.append(path)
        return manifest

    def delete(self, path: str) -> None:
        if "/servicemonitors/" in path:
            raise KubeError("DELETE", path, 403, '{"message": "servicemonitors is forbidden"}')
        raise AssertionError(f"unexpected delete of {path}")

    def merge_status(self, path: str, status: dict[str, Any]) -> Any:
        self.status = status
        return None


def test_forbidden_service_monitors_are_none_to_remove() -> None:
    kube = FakeKube()
    reconciler = Reconciler(kube, Images(worker="w", gateway="g"))  # type: ignore[arg-type]
    outcome = reconciler.reconcile("ml", "minilm")
    assert outcome.error == ""
    assert len(kube.applied) == 10
    assert kube.status is not None
    degraded = next(c for c in kube.status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "False"

"""What every pod the operator runs shares: security contexts, resources, the model's volume and
the Deployment around a pod; and the disruption budget that guards a Deployment's pods."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from embedfleet.operator.manifests import GPU_RESOURCE, MODEL_DIR, RUN_AS, Manifest
from embedfleet.operator.render.config import model_path
from embedfleet.operator.spec import Resources, Spec


def container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def pod_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        # Makes a model cache claim writable by the non-root user.
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def resources(wanted: Resources, gpus: int = 0) -> dict[str, Any]:
    """A container's requests and limits, `gpus` GPUs among the limits; empty when none."""
    out: dict[str, Any] = {}
    if wanted.requests:
        out["requests"] = dict(wanted.requests)
    limits = dict(wanted.limits)
    if gpus:
        limits[GPU_RESOURCE] = str(gpus)
    if limits:
        out["limits"] = limits
    return out


@dataclass(frozen=True)
class ModelMount:
    """Volumes, their mounts in the main container, and the init containers that fill them."""

    volumes: list[dict[str, Any]]
    mounts: list[dict[str, Any]]
    init_containers: list[dict[str, Any]]

    def __add__(self, other: ModelMount) -> ModelMount:
        return ModelMount(
            self.volumes + other.volumes,
            self.mounts + other.mounts,
            self.init_containers + other.init_containers,
        )


def model_mount(
    spec: Spec, image: str, pull_policy: str, root: str = MODEL_DIR, volume_name: str = "model"
) -> ModelMount:
    """Volumes, mounts and init containers that put the model directory at model_path(source,
    root); `volume_name` also names the init container that fetches an hf:// model."""
    source = spec.model.source
    if source.kind == "file":
        return ModelMount([], [], [])
    if source.kind == "pvc":
        claim = {"claimName": source.claim, "readOnly": True}
        volume = {"name": volume_name, "persistentVolumeClaim": claim}
        mount = {"name": volume_name, "mountPath": root, "readOnly": True}
        return ModelMount([volume], [mount], [])
    cache = spec.model.cache
    if cache.claim_name:
        volume = {"name": volume_name, "persistentVolumeClaim": {"claimName": cache.claim_name}}
    else:
        volume = {"name": volume_name, "emptyDir": {"sizeLimit": cache.size_limit}}
    argv = ["hf", "download", source.repo, "--local-dir", model_path(source, root)]
    if source.revision:
        argv += ["--revision", source.revision]
    fetch = {
        "name": f"fetch-{volume_name}",
        "image": image,
        "imagePullPolicy": pull_policy,
        "command": argv,
        "env": [
            # hf keeps its locks and metadata under HF_HOME; the root FS is read-only.
            {"name": "HF_HOME", "value": f"{root}/.hf"},
            {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
            {"name": "HOME", "value": "/tmp"},
        ],
        "volumeMounts": [
            {"name": volume_name, "mountPath": root},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        "securityContext": container_security(),
    }
    return ModelMount([volume], [{"name": volume_name, "mountPath": root}], [fetch])


def pod_spec(
    container: dict[str, Any], mount: ModelMount, pull_secrets: Sequence[str], **extra: Any
) -> dict[str, Any]:
    """One container's pod: a writable /tmp (the root FS is read-only) besides `mount`."""
    container["volumeMounts"] = [{"name": "tmp", "mountPath": "/tmp"}, *mount.mounts]
    pod: dict[str, Any] = {
        "securityContext": pod_security(),
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}, *mount.volumes],
        **extra,
    }
    if mount.init_containers:
        pod["initContainers"] = mount.init_containers
    if pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in pull_secrets]
    return pod


def deployment(
    meta: dict[str, Any],
    replicas: int,
    selector: dict[str, str],
    pod_labels: dict[str, str],
    annotations: dict[str, str],
    rolling_update: dict[str, Any],
    pod: dict[str, Any],
) -> Manifest:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": replicas,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": selector},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": rolling_update},
            "template": {
                "metadata": {"labels": pod_labels, "annotations": annotations},
                "spec": pod,
            },
        },
    }


def disruption_budget(meta: dict[str, Any], selector: dict[str, str]) -> Manifest:
    """One voluntary disruption at a time among the pods `selector` picks."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta,
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector},
            # A pod that never became ready must not block a node drain.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }

"""A gateway: its settings (EMBEDFLEET_GATEWAY_*, docs/gateway.md "Settings") and its objects.

Two kinds of gateway run the same binary in the same kind of pod: a fleet's own (here) and a
shared one serving several fleets (shared_gateway.py, which renders its objects with these). What
tells them apart is gathered in `Pods`; the Deployment, Service and RBAC are rendered here once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from embedfleet.operator.manifests import (
    API_KEYS_DIR,
    API_KEYS_FILE,
    CONFIG_HASH,
    GATEWAY_PORT,
    GATEWAY_PREFIX,
    GRACE_MARGIN_SECONDS,
    HOLD_REQUESTS,
    LABEL_TASK,
    MODEL_DIR,
    PRESTOP_SECONDS,
    QUANTIZATION_DIR,
    Images,
    Manifest,
    Names,
    Owner,
    labels,
    metadata,
    selector_labels,
)
from embedfleet.operator.render import pods
from embedfleet.operator.render.config import config_hash, env, model_path, served_task, tracing_env
from embedfleet.operator.render.pods import ModelMount, container_security, model_mount, resources
from embedfleet.operator.spec import FileRef, Gateway, GatewayService, Spec

COMMAND = ["embedfleet-gateway"]
"""The gateway image's binary, reading its settings from EMBEDFLEET_GATEWAY_* (docs/gateway.md)."""
QUANTIZATION_NAME = "embedfleet_quantization.json"

# -- settings ----------------------------------------------------------------------------------


def model_settings(
    served_name: str, owner: Owner, spec: Spec, root: str, quantization_dir: str
) -> dict[str, object]:
    """One model's settings, by the gateway's setting names: a fleet's gateway reads them as env
    vars, a shared one from its models file (`root`, `quantization_dir`: where that gateway mounts
    the model and the calibration ranges)."""
    gateway = spec.gateway
    return {
        "model": model_path(spec.model.source, root),
        "task": served_task(spec),
        "served_model_name": served_name,
        "max_input_tokens": spec.model.max_input_tokens,
        "k8s_service": Names.of(owner.name).worker,
        "k8s_port_name": "grpc",
        "chunk_tokens": gateway.chunk_tokens,
        "split_long_inputs": gateway.split_long_inputs,
        "split_overlap_tokens": gateway.split_overlap_tokens,
        "quantization_file": (
            f"{quantization_dir}/{QUANTIZATION_NAME}" if gateway.quantization else ""
        ),
    }


def process_settings(gateway: Gateway, api_keys: bool, per_key_metrics: bool) -> dict[str, object]:
    """The settings of the gateway process as a whole, whatever it serves."""
    return {
        "max_client_batch": gateway.max_client_batch,
        "max_request_tokens": gateway.max_request_tokens,
        "upstream_timeout_seconds": gateway.upstream_timeout_seconds,
        "max_queue_seconds": gateway.max_queue_seconds,
        "api_keys_file": API_KEYS_FILE if api_keys else "",
        "api_key_metrics": per_key_metrics,
        "host": "0.0.0.0",
        "port": GATEWAY_PORT,
    }


def _scales_to_zero(spec: Spec) -> bool:
    return spec.autoscaling.enabled and spec.autoscaling.min_replicas == 0


def gateway_env(owner: Owner, spec: Spec) -> dict[str, str]:
    """A fleet's own gateway's EMBEDFLEET_GATEWAY_* settings."""
    gateway = spec.gateway
    model = model_settings(spec.model.served_model_name, owner, spec, MODEL_DIR, QUANTIZATION_DIR)
    process = process_settings(
        gateway, gateway.auth.secret is not None, gateway.auth.per_key_metrics
    )
    return env(
        GATEWAY_PREFIX,
        {
            **model,
            **process,
            # Zero workers by design: the gateway stays Ready and holds the first requests, whose
            # count and tokens on its /metrics wake the fleet (the autoscaler scrapes them).
            "hold_requests": HOLD_REQUESTS if _scales_to_zero(spec) else 0,
        },
    ) | tracing_env(GATEWAY_PREFIX, spec, "embedfleet-gateway")


# -- files -------------------------------------------------------------------------------------
# Whole volumes with `items`, never `subPath`: the kubelet updates such a volume in place (by
# swapping its `..data` symlink), which is how a key rotation reaches the running gateway.


def api_keys(secret: FileRef) -> ModelMount:
    """The Secret of API keys as a read-only file, API_KEYS_FILE."""
    items = [{"key": secret.key, "path": API_KEYS_FILE.rsplit("/", 1)[1]}]
    volume = {
        "name": "api-keys",
        # Readable by the pod's group (fsGroup) only; the keys are never world-readable.
        "secret": {"secretName": secret.name, "items": items, "defaultMode": 0o440},
    }
    return ModelMount(
        [volume], [{"name": "api-keys", "mountPath": API_KEYS_DIR, "readOnly": True}], []
    )


def quantization(ref: FileRef, name: str, directory: str) -> ModelMount:
    """A ConfigMap of calibration ranges as the read-only file QUANTIZATION_NAME in `directory`."""
    items = [{"key": ref.key, "path": QUANTIZATION_NAME}]
    volume = {"name": name, "configMap": {"name": ref.name, "items": items}}
    return ModelMount([volume], [{"name": name, "mountPath": directory, "readOnly": True}], [])


def files(gateway: Gateway) -> ModelMount:
    """A fleet's own gateway's API keys and calibration ranges, when it has them."""
    out = ModelMount([], [], [])
    if (secret := gateway.auth.secret) is not None:
        out += api_keys(secret)
    if (ref := gateway.quantization) is not None:
        out += quantization(ref, "quantization", QUANTIZATION_DIR)
    return out


# -- objects -----------------------------------------------------------------------------------


def probes() -> dict[str, Any]:
    """A gateway container's probes and preStop."""
    return {
        # The default 1 s timeout is too short for a busy node: one slow answer under load would
        # take the gateway out of its Service (with one replica, the whole endpoint).
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": "http"},
            "periodSeconds": 5,
            "timeoutSeconds": 5,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 6,
        },
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}},
    }


@dataclass(frozen=True)
class Pods:
    """What tells one gateway's pods from another's: a fleet's own gateway or a shared one."""

    meta: dict[str, Any]
    """The Deployment's metadata."""
    selector: dict[str, str]
    pod_labels: dict[str, str]
    service_account: str
    env_from: list[dict[str, Any]]
    """Where the settings come from: a fleet's ConfigMap, or none."""
    env: list[dict[str, str]]
    """Settings given one by one, besides HOME."""
    mount: ModelMount
    pull_secrets: Sequence[str]
    config_hash: str
    """Of everything the process reads at start: a change rolls the pods."""


def deployment(gateway: Gateway, images: Images, of: Pods) -> Manifest:
    """A gateway's Deployment: `gateway` is the spec whose process-wide settings it runs with."""
    container: dict[str, Any] = {
        "name": "gateway",
        "image": gateway.image or images.gateway,
        "imagePullPolicy": gateway.image_pull_policy,
        "command": COMMAND,
        **({"envFrom": of.env_from} if of.env_from else {}),
        "env": [{"name": "HOME", "value": "/tmp"}, *of.env],
        "ports": [{"name": "http", "containerPort": GATEWAY_PORT, "protocol": "TCP"}],
        **probes(),
        "securityContext": container_security(),
    }
    if wanted := resources(gateway.resources):
        container["resources"] = wanted
    pod = pods.pod_spec(
        container,
        of.mount,
        of.pull_secrets,
        serviceAccountName=of.service_account,
        enableServiceLinks=False,
        terminationGracePeriodSeconds=int(gateway.upstream_timeout_seconds)
        + PRESTOP_SECONDS
        + GRACE_MARGIN_SECONDS,
    )
    return pods.deployment(
        of.meta,
        gateway.replicas,
        of.selector,
        of.pod_labels,
        {CONFIG_HASH: of.config_hash},
        {"maxUnavailable": 0, "maxSurge": "25%"},
        pod,
    )


def http_service(
    meta: dict[str, Any], service: GatewayService, selector: dict[str, str]
) -> Manifest:
    """A gateway's endpoint: `gateway.service`'s type, port and annotations, to port "http"."""
    if service.annotations:
        meta["annotations"] = dict(service.annotations)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": service.type,
            "selector": selector,
            "ports": [
                {"name": "http", "port": service.port, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }


def rbac(name: str, namespace: str, meta: Callable[[], dict[str, Any]]) -> list[Manifest]:
    """A gateway's identity: ServiceAccount, Role and RoleBinding `name` that get/list/watch the
    EndpointSlices of `namespace`, nothing else (each object's metadata from `meta`)."""
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": meta(),
            "automountServiceAccountToken": True,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta(),
            "rules": [
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["get", "list", "watch"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    ]


# -- a fleet's own gateway ---------------------------------------------------------------------


def fleet_objects(owner: Owner, spec: Spec, images: Images) -> list[Manifest]:
    """A fleet's own gateway, in apply order: its RBAC, Deployment and Service (the fleet adds
    its disruption budget)."""
    names = Names.of(owner.name)
    own = Pods(
        meta=metadata(owner, names.gateway, "gateway"),
        selector=selector_labels(owner, "gateway"),
        pod_labels={**labels(owner, "gateway"), LABEL_TASK: spec.model.task},
        service_account=names.gateway,
        env_from=[{"configMapRef": {"name": names.config}}],
        env=[],
        mount=model_mount(spec, *images.fetcher(spec)) + files(spec.gateway),
        pull_secrets=spec.image_pull_secrets,
        config_hash=config_hash(gateway_env(owner, spec)),
    )
    return [
        *rbac(names.gateway, owner.namespace, lambda: metadata(owner, names.gateway, "gateway")),
        deployment(spec.gateway, images, own),
        http_service(
            metadata(owner, names.service, "gateway"),
            spec.gateway.service,
            selector_labels(owner, "gateway"),
        ),
    ]

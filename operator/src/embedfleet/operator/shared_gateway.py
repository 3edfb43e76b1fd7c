"""Pure functions from the EmbeddingDeployments that name a shared gateway to its objects.

Fleets join with `spec.gateway.shared: NAME`; the namespace then has one more gateway, serving
every member's model on one endpoint and routing by the request's `model` (the gateway's
`--models-file`, catalog.py there):

  NAME-shared-gateway  ConfigMap (models.json), Deployment, Service, ServiceAccount, Role +
                       RoleBinding (read EndpointSlices), PodDisruptionBudget

No single fleet owns it: every member is one of its owner references (none the controller), so
the garbage collector removes it with the last member, and a member that leaves or is deleted
drops out at the next reconcile of any fleet in the namespace. Each member keeps its own gateway.

A member is called `model.servedModelName` there, else its EmbeddingDeployment's name (unique in
the namespace, as KubeAI names models). The gateway-wide settings (replicas, image, resources,
Service, request limits, timeouts, tracing) are the first member's by name; API keys are the
first member's that has any, so a member asking for keys is never served without them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from embedfleet.operator.manifests import (
    API_KEYS_FILE,
    CONFIG_HASH,
    GATEWAY_COMMAND,
    GATEWAY_PORT,
    GATEWAY_PREFIX,
    GRACE_MARGIN_SECONDS,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_OWNER,
    LABEL_SHARED,
    MANAGER,
    MODEL_DIR,
    PRESTOP_SECONDS,
    QUANTIZATION_DIR,
    Images,
    Manifest,
    ModelMount,
    Names,
    Owner,
    _container_security,
    _env,
    _pod_security,
    _resources,
    config_hash,
    gateway_probes,
    http_service,
    model_mount,
    model_path,
    served_task,
    slice_reader,
    tracing_env,
)
from embedfleet.operator.spec import API_VERSION, KIND, Spec, SpecError, parse_spec

COMPONENT = "shared-gateway"
MODELS_DIR = "/etc/embedfleet/models"
MODELS_FILE = f"{MODELS_DIR}/models.json"


@dataclass(frozen=True)
class Member:
    """A fleet that names the shared gateway, as the gateway serves it."""

    owner: Owner
    spec: Spec

    @property
    def served_name(self) -> str:
        return self.spec.model.served_model_name or self.owner.name


def object_name(shared: str) -> str:
    """The one name of all of a shared gateway's objects; clients use its Service."""
    return f"{shared}-shared-gateway"


def endpoint(namespace: str, shared: str, port: int) -> str:
    return f"http://{object_name(shared)}.{namespace}.svc:{port}"


def members(bodies: Iterable[Mapping[str, Any]], namespace: str, shared: str) -> list[Member]:
    """The fleets of `namespace` that name `shared`, by name; deleted and invalid ones left out."""
    out = []
    for body in bodies:
        meta = body.get("metadata") or {}
        if meta.get("namespace") != namespace or meta.get("deletionTimestamp"):
            continue
        raw = body.get("spec") or {}
        if (raw.get("gateway") or {}).get("shared") != shared:
            continue
        try:
            spec = parse_spec(raw)
        except SpecError:
            continue  # its own reconcile reports it (InvalidSpec)
        owner = Owner(name=str(meta["name"]), namespace=namespace, uid=str(meta.get("uid", "")))
        out.append(Member(owner, spec))
    return sorted(out, key=lambda m: m.owner.name)


def names_in(bodies: Iterable[Mapping[str, Any]], namespace: str) -> set[str]:
    """Every shared gateway the fleets of `namespace` name."""
    return {
        str(shared)
        for body in bodies
        if (body.get("metadata") or {}).get("namespace") == namespace
        and (shared := ((body.get("spec") or {}).get("gateway") or {}).get("shared"))
    }


def routable(found: list[Member]) -> tuple[list[Member], list[Member]]:
    """(served, left out): of members served under one name, the first by name is served."""
    served: list[Member] = []
    left: list[Member] = []
    taken: set[str] = set()
    for member in found:
        (left if member.served_name in taken else served).append(member)
        taken.add(member.served_name)
    return served, left


# -- the objects ---------------------------------------------------------------------------


def _selector(shared: str) -> dict[str, str]:
    return {
        LABEL_NAME: "embedfleet",
        LABEL_INSTANCE: object_name(shared),
        LABEL_COMPONENT: COMPONENT,
    }


def _meta(namespace: str, shared: str, served: list[Member]) -> dict[str, Any]:
    return {
        "name": object_name(shared),
        "namespace": namespace,
        "labels": {
            **_selector(shared),
            LABEL_MANAGED_BY: MANAGER,
            # Present (the informer lists children by it) but empty: no one fleet owns it, so
            # its watch events re-reconcile none.
            LABEL_OWNER: "",
            LABEL_SHARED: shared,
        },
        "ownerReferences": [
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": m.owner.name,
                "uid": m.owner.uid,
                # Several owners, none the controller: collected when the last one is gone, and
                # deleting one member never waits on it.
                "controller": False,
                "blockOwnerDeletion": False,
            }
            for m in served
        ],
    }


def _root(index: int) -> str:
    return f"{MODEL_DIR}/{index}"


def models_file(served: list[Member]) -> dict[str, Any]:
    """The gateway's --models-file: each member's own settings, by the gateway's setting names."""
    out = []
    for i, m in enumerate(served):
        spec, gateway = m.spec, m.spec.gateway
        out.append(
            {
                "served_model_name": m.served_name,
                "model": model_path(spec.model.source, _root(i)),
                "task": served_task(spec),
                "max_input_tokens": spec.model.max_input_tokens,
                "k8s_service": Names.of(m.owner.name).worker,
                "k8s_port_name": "grpc",
                "chunk_tokens": gateway.chunk_tokens,
                "split_long_inputs": gateway.split_long_inputs,
                "split_overlap_tokens": gateway.split_overlap_tokens,
                "quantization_file": (
                    f"{QUANTIZATION_DIR}/{i}/embedfleet_quantization.json"
                    if gateway.quantization
                    else ""
                ),
            }
        )
    return {"models": out}


def _keys_from(served: list[Member]) -> Member | None:
    return next((m for m in served if m.spec.gateway.auth.secret is not None), None)


def gateway_env(served: list[Member]) -> dict[str, str]:
    """The process-wide settings: the first member's, API keys from the first that has any."""
    lead = served[0].spec
    gateway = lead.gateway
    keys = _keys_from(served)
    return _env(
        GATEWAY_PREFIX,
        {
            "models_file": MODELS_FILE,
            "max_client_batch": gateway.max_client_batch,
            "max_request_tokens": gateway.max_request_tokens,
            "upstream_timeout_seconds": gateway.upstream_timeout_seconds,
            "max_queue_seconds": gateway.max_queue_seconds,
            "api_keys_file": API_KEYS_FILE if keys else "",
            "api_key_metrics": bool(keys and keys.spec.gateway.auth.per_key_metrics),
            "host": "0.0.0.0",
            "port": GATEWAY_PORT,
        },
    ) | tracing_env(GATEWAY_PREFIX, lead, "embedfleet-gateway")


def _mounts(shared: str, served: list[Member], images: Images) -> ModelMount:
    """Each member's model at /models/N, its calibration ConfigMap, the API keys, models.json."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    inits: list[dict[str, Any]] = []
    for i, m in enumerate(served):
        one = model_mount(m.spec, *images.fetcher(m.spec), _root(i), f"model-{i}")
        volumes += one.volumes
        mounts += one.mounts
        inits += one.init_containers
        if (ref := m.spec.gateway.quantization) is not None:
            items = [{"key": ref.key, "path": "embedfleet_quantization.json"}]
            volumes.append(
                {"name": f"quantization-{i}", "configMap": {"name": ref.name, "items": items}}
            )
            mounts.append(
                {
                    "name": f"quantization-{i}",
                    "mountPath": f"{QUANTIZATION_DIR}/{i}",
                    "readOnly": True,
                }
            )
    if (keys := _keys_from(served)) is not None:
        secret = keys.spec.gateway.auth.secret
        assert secret is not None
        items = [{"key": secret.key, "path": API_KEYS_FILE.rsplit("/", 1)[1]}]
        volumes.append(
            {
                "name": "api-keys",
                "secret": {"secretName": secret.name, "items": items, "defaultMode": 0o440},
            }
        )
        mounts.append(
            {"name": "api-keys", "mountPath": API_KEYS_FILE.rsplit("/", 1)[0], "readOnly": True}
        )
    # A whole volume (no subPath), like every file a gateway reads.
    items = [{"key": "models.json", "path": "models.json"}]
    volumes.append({"name": "models", "configMap": {"name": object_name(shared), "items": items}})
    mounts.append({"name": "models", "mountPath": MODELS_DIR, "readOnly": True})
    return ModelMount(volumes, mounts, inits)


def config_map(namespace: str, shared: str, served: list[Member]) -> Manifest:
    text = json.dumps(models_file(served), indent=1, sort_keys=True)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(namespace, shared, served),
        "data": {"models.json": text},
    }


def deployment(namespace: str, shared: str, served: list[Member], images: Images) -> Manifest:
    lead = served[0].spec
    gateway = lead.gateway
    image = gateway.image or images.gateway
    env = gateway_env(served)
    mount = _mounts(shared, served, images)
    container: dict[str, Any] = {
        "name": "gateway",
        "image": image,
        "imagePullPolicy": gateway.image_pull_policy,
        "command": GATEWAY_COMMAND,
        "env": [
            {"name": "HOME", "value": "/tmp"},
            # An empty value is each setting's default, and the API server would drop it anyway.
            *({"name": k, "value": v} for k, v in sorted(env.items()) if v),
        ],
        "ports": [{"name": "http", "containerPort": GATEWAY_PORT, "protocol": "TCP"}],
        **gateway_probes(),
        "securityContext": _container_security(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, *mount.mounts],
    }
    if resources := _resources(gateway.resources):
        container["resources"] = resources
    pod: dict[str, Any] = {
        "securityContext": _pod_security(),
        "serviceAccountName": object_name(shared),
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": int(gateway.upstream_timeout_seconds)
        + PRESTOP_SECONDS
        + GRACE_MARGIN_SECONDS,
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}, *mount.volumes],
    }
    if mount.init_containers:
        pod["initContainers"] = mount.init_containers
    pull_secrets = sorted({s for m in served for s in m.spec.image_pull_secrets})
    if pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in pull_secrets]
    # The models file is read at start: a change of members rolls the pods (so do their mounts).
    digest = config_hash({**env, "models.json": json.dumps(models_file(served), sort_keys=True)})
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(namespace, shared, served),
        "spec": {
            "replicas": gateway.replicas,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": _selector(shared)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "25%"},
            },
            "template": {
                "metadata": {
                    "labels": {**_meta(namespace, shared, served)["labels"]},
                    "annotations": {CONFIG_HASH: digest},
                },
                "spec": pod,
            },
        },
    }


def service(namespace: str, shared: str, served: list[Member]) -> Manifest:
    meta = _meta(namespace, shared, served)
    return http_service(meta, served[0].spec.gateway.service, _selector(shared))


def rbac(namespace: str, shared: str, served: list[Member]) -> list[Manifest]:
    """Read the EndpointSlices of the namespace (each member's worker Service), nothing else."""
    return slice_reader(object_name(shared), namespace, lambda: _meta(namespace, shared, served))


def disruption_budget(namespace: str, shared: str, served: list[Member]) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(namespace, shared, served),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": _selector(shared)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def objects(namespace: str, shared: str, served: list[Member], images: Images) -> list[Manifest]:
    """Every object of the shared gateway, in apply order; none without a member."""
    if not served:
        return []
    return [
        config_map(namespace, shared, served),
        *rbac(namespace, shared, served),
        deployment(namespace, shared, served, images),
        service(namespace, shared, served),
        disruption_budget(namespace, shared, served),
    ]


#: (apiVersion, kind) of every object `objects` makes, for deleting a gateway left memberless
KINDS = (
    ("v1", "ConfigMap"),
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
    ("policy/v1", "PodDisruptionBudget"),
)

"""A shared gateway: the EmbeddingDeployments that name it, and its objects.

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
first member's that has any, so a member asking for keys is never served without them. Its
Deployment, Service and RBAC are rendered by gateway.py, as a fleet's own gateway's are.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from embedfleet.operator.manifests import (
    GATEWAY_PREFIX,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_OWNER,
    LABEL_SHARED,
    MANAGER,
    MODEL_DIR,
    QUANTIZATION_DIR,
    Images,
    Manifest,
    Owner,
)
from embedfleet.operator.render import gateway, pods
from embedfleet.operator.render.config import config_hash, env, tracing_env
from embedfleet.operator.render.pods import ModelMount, model_mount
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
    return {
        "models": [
            gateway.model_settings(
                m.served_name, m.owner, m.spec, _root(i), f"{QUANTIZATION_DIR}/{i}"
            )
            for i, m in enumerate(served)
        ]
    }


def _keys_from(served: list[Member]) -> Member | None:
    return next((m for m in served if m.spec.gateway.auth.secret is not None), None)


def gateway_env(served: list[Member]) -> dict[str, str]:
    """The process-wide settings: the first member's, API keys from the first that has any."""
    lead = served[0].spec
    keys = _keys_from(served)
    per_key_metrics = bool(keys and keys.spec.gateway.auth.per_key_metrics)
    process = gateway.process_settings(lead.gateway, keys is not None, per_key_metrics)
    return env(GATEWAY_PREFIX, {"models_file": MODELS_FILE, **process}) | tracing_env(
        GATEWAY_PREFIX, lead, "embedfleet-gateway"
    )


def _mounts(shared: str, served: list[Member], images: Images) -> ModelMount:
    """Each member's model at /models/N, its calibration ConfigMap, the API keys, models.json."""
    out = ModelMount([], [], [])
    for i, m in enumerate(served):
        out += model_mount(m.spec, *images.fetcher(m.spec), _root(i), f"model-{i}")
        if (ref := m.spec.gateway.quantization) is not None:
            out += gateway.quantization(ref, f"quantization-{i}", f"{QUANTIZATION_DIR}/{i}")
    if (keys := _keys_from(served)) is not None:
        secret = keys.spec.gateway.auth.secret
        assert secret is not None
        out += gateway.api_keys(secret)
    # A whole volume (no subPath), like every file a gateway reads.
    items = [{"key": "models.json", "path": "models.json"}]
    volume = {"name": "models", "configMap": {"name": object_name(shared), "items": items}}
    return out + ModelMount(
        [volume], [{"name": "models", "mountPath": MODELS_DIR, "readOnly": True}], []
    )


def config_map(namespace: str, shared: str, served: list[Member]) -> Manifest:
    text = json.dumps(models_file(served), indent=1, sort_keys=True)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(namespace, shared, served),
        "data": {"models.json": text},
    }


def deployment(namespace: str, shared: str, served: list[Member], images: Images) -> Manifest:
    settings = gateway_env(served)
    # The models file is read at start: a change of members rolls the pods (so do their mounts).
    models = json.dumps(models_file(served), sort_keys=True)
    of = gateway.Pods(
        meta=_meta(namespace, shared, served),
        selector=_selector(shared),
        pod_labels={**_meta(namespace, shared, served)["labels"]},
        service_account=object_name(shared),
        env_from=[],
        # An empty value is each setting's default, and the API server would drop it anyway.
        env=[{"name": k, "value": v} for k, v in sorted(settings.items()) if v],
        mount=_mounts(shared, served, images),
        pull_secrets=sorted({s for m in served for s in m.spec.image_pull_secrets}),
        config_hash=config_hash({**settings, "models.json": models}),
    )
    return gateway.deployment(served[0].spec.gateway, images, of)


def objects(namespace: str, shared: str, served: list[Member], images: Images) -> list[Manifest]:
    """Every object of the shared gateway, in apply order; none without a member."""
    if not served:
        return []
    meta = _meta(namespace, shared, served)
    return [
        config_map(namespace, shared, served),
        *gateway.rbac(object_name(shared), namespace, lambda: _meta(namespace, shared, served)),
        deployment(namespace, shared, served, images),
        gateway.http_service(meta, served[0].spec.gateway.service, _selector(shared)),
        pods.disruption_budget(_meta(namespace, shared, served), _selector(shared)),
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

"""An EmbeddingDeployment's children (manifests.py names them), in apply order."""

from __future__ import annotations

from embedfleet.operator.manifests import Images, Manifest, Names, Owner, metadata, selector_labels
from embedfleet.operator.render import gateway, workers
from embedfleet.operator.render.monitoring import service_monitor
from embedfleet.operator.render.pods import disruption_budget
from embedfleet.operator.spec import Spec


def config_map(owner: Owner, spec: Spec) -> Manifest:
    """The worker's and the gateway's settings, read by both Deployments' pods."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(owner, Names.of(owner.name).config, "config"),
        "data": {**workers.worker_env(spec), **gateway.gateway_env(owner, spec)},
    }


def children(
    owner: Owner,
    spec: Spec,
    worker_replicas: int,
    images: Images,
    service_monitors_available: bool,
) -> list[Manifest]:
    """Every child, in apply order: settings before the pods that read them."""
    names = Names.of(owner.name)
    out = [
        config_map(owner, spec),
        workers.worker_service(owner, spec.worker.engines_per_gpu),
        workers.worker_deployment(owner, spec, worker_replicas, images),
        *gateway.fleet_objects(owner, spec, images),
        disruption_budget(
            metadata(owner, names.worker, "worker"), selector_labels(owner, "worker")
        ),
        disruption_budget(
            metadata(owner, names.gateway, "gateway"), selector_labels(owner, "gateway")
        ),
    ]
    if spec.service_monitor.enabled and service_monitors_available:
        out.append(service_monitor(owner, spec))
    return out

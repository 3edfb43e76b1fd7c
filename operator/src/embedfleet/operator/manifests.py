"""What the operator's objects are called and carry: names, labels, ports, paths and images,
shared by the rendering (the render package), the reconciler, the informer and the autoscaler.

Children of an EmbeddingDeployment NAME, all owned by it (so deleting it garbage-collects them):
  NAME-config   ConfigMap   worker and gateway settings as EMBEDFLEET_* env vars
  NAME-worker   Deployment  the model servers; Service (headless) the gateway's discovery
  NAME-gateway  Deployment, ServiceAccount, Role + RoleBinding (read EndpointSlices)
  NAME          Service     the endpoint clients use
  NAME-worker, NAME-gateway PodDisruptionBudgets; NAME ServiceMonitor when asked for and possible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from embedfleet.operator.spec import API_VERSION, KIND, Spec

Manifest = dict[str, Any]

MANAGER = "embedfleet-operator"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_OWNER = "embedfleet.dev/deployment"
"""On every child: the owning EmbeddingDeployment's name, so a child's event finds its owner."""
LABEL_TASK = "embedfleet.dev/task"
LABEL_SHARED = "embedfleet.dev/shared-gateway"
"""On every object of a shared gateway (render/shared_gateway.py): its name."""
CONFIG_HASH = "embedfleet.dev/config-hash"

WORKER_PREFIX = "EMBEDFLEET_WORKER_"
GATEWAY_PREFIX = "EMBEDFLEET_GATEWAY_"
GRPC_PORT = 50051
WORKER_METRICS_PORT = 9090
GATEWAY_PORT = 8080
METRICS_PORTS = {"worker": ("metrics", WORKER_METRICS_PORT), "gateway": ("http", GATEWAY_PORT)}
"""Where each component's pods serve /metrics: (container port name, port). The gateway serves it
on its one HTTP port."""
MODEL_DIR = "/models"
#: where the gateway finds gateway.auth's Secret entry and gateway.quantization's ConfigMap entry
API_KEYS_DIR = "/etc/embedfleet/auth"
QUANTIZATION_DIR = "/etc/embedfleet/quantization"
API_KEYS_FILE = f"{API_KEYS_DIR}/api-keys"
PRESTOP_SECONDS = 5
#: Requests a gateway holds while its fleet has no ready worker, when the fleet may scale to zero
#: (gateway `hold_requests`); more get 503 with Retry-After until a worker is up.
HOLD_REQUESTS = 256
"""Before SIGTERM: time for the endpoint removal to reach the gateways, so no new work arrives."""
GRACE_MARGIN_SECONDS = 10
RUN_AS = 65532
GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class Owner:
    """The EmbeddingDeployment the children belong to."""

    name: str
    namespace: str
    uid: str


@dataclass(frozen=True)
class Images:
    """Operator-wide default images; a CR's worker.image / gateway.image override them."""

    worker: str
    gateway: str
    worker_cpu: str = ""
    """For fleets that ask for no GPUs; empty uses `worker` for those too."""

    def worker_for(self, gpus: int) -> str:
        return self.worker if gpus or not self.worker_cpu else self.worker_cpu

    def fetcher(self, spec: Spec) -> tuple[str, str]:
        """The image (and its pull policy) whose `hf` fetches an hf:// model: the fleet's worker
        image, which has it (the gateway image holds the gateway binary alone)."""
        worker = spec.worker
        return worker.image or self.worker_for(worker.gpus), worker.image_pull_policy


@dataclass(frozen=True)
class Names:
    config: str
    worker: str
    gateway: str
    service: str

    @classmethod
    def of(cls, name: str) -> Names:
        return cls(
            config=f"{name}-config",
            worker=f"{name}-worker",
            gateway=f"{name}-gateway",
            service=name,
        )


# -- labels and metadata ---------------------------------------------------------------------------


def selector_labels(owner: Owner, component: str) -> dict[str, str]:
    return {LABEL_NAME: "embedfleet", LABEL_INSTANCE: owner.name, LABEL_COMPONENT: component}


def labels(owner: Owner, component: str) -> dict[str, str]:
    return {
        **selector_labels(owner, component),
        LABEL_MANAGED_BY: MANAGER,
        LABEL_OWNER: owner.name,
    }


def worker_selector(owner: Owner) -> str:
    """The worker pods' selector as a string: status.selector, for the scale subresource."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(owner, "worker").items()))


def endpoint(owner: Owner, spec: Spec) -> str:
    return (
        f"http://{Names.of(owner.name).service}.{owner.namespace}.svc:{spec.gateway.service.port}"
    )


def owner_reference(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(owner: Owner, name: str, component: str) -> dict[str, Any]:
    """A child's metadata: its name, namespace, labels and controller reference."""
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner, component),
        "ownerReferences": [owner_reference(owner)],
    }

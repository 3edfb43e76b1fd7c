"""Pure functions from a spec to the child objects of one EmbeddingDeployment.

Children, all owned by the EmbeddingDeployment (so deleting it garbage-collects them):
  NAME-config   ConfigMap   worker and gateway settings as EMBEDFLEET_* env vars
  NAME-worker   Deployment  the model servers; Service (headless) the gateway's discovery
  NAME-gateway  Deployment, ServiceAccount, Role + RoleBinding (read EndpointSlices)
  NAME          Service     the endpoint clients use
  NAME-worker, NAME-gateway PodDisruptionBudgets; NAME ServiceMonitor when asked for and possible.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from embedfleet.operator.spec import (
    API_VERSION,
    KIND,
    Gateway,
    GatewayService,
    ModelSource,
    Resources,
    Spec,
)

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
"""On every object of a shared gateway (shared_gateway.py): its name."""
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
QUANTIZATION_FILE = f"{QUANTIZATION_DIR}/embedfleet_quantization.json"
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


def _meta(owner: Owner, name: str, component: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner, component),
        "ownerReferences": [owner_reference(owner)],
        **extra,
    }


# -- settings --------------------------------------------------------------------------------


def _env(prefix: str, values: Mapping[str, object]) -> dict[str, str]:
    def text(value: object) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    return {prefix + key.upper(): text(value) for key, value in values.items()}


def model_path(source: ModelSource, root: str = MODEL_DIR) -> str:
    """Where the model directory is inside the worker and gateway containers (`root`: where
    its volume is mounted; a shared gateway mounts each fleet's at a root of its own)."""
    if source.kind == "hf":
        org, name = source.repo.split("/", 1)
        return f"{root}/{org}--{name}/{source.revision or 'default'}"
    if source.kind == "pvc":
        return f"{root}/{source.path}"
    return source.path


def cpu_cores(quantity: str) -> float | None:
    """A Kubernetes CPU quantity ("2", "1.5", "500m") in cores; None for forms CPUs never use."""
    text = quantity.strip()
    scale = 1.0
    if text.endswith("m"):
        text, scale = text[:-1], 1e-3
    try:
        return float(text) * scale
    except ValueError:
        return None


def worker_threads(resources: Resources) -> int:
    """Torch's intra-op threads for a worker pod: its CPU share, rounded up (0: torch's default).

    In a container torch counts the node's cores, not the pod's share: a 1-CPU worker on a
    64-core node would start 64 threads that the CFS quota then throttles, and several workers on
    one node would oversubscribe it. The limit is the share a pod may use; else its request.
    """
    cores = cpu_cores(resources.limits.get("cpu") or resources.requests.get("cpu") or "")
    return max(1, math.ceil(cores)) if cores else 0


def openvino_cache_dir(spec: Spec) -> str:
    """Where an OpenVINO worker keeps its converted graph: in the model cache claim when there is
    one (hf:// with model.cache.claimName, mounted writable at MODEL_DIR), so only the fleet's
    first pod pays the conversion (most of a new pod's start-up); "" leaves the worker's default,
    the pod's /tmp emptyDir, converted again by every pod."""
    source, claim = spec.model.source, spec.model.cache.claim_name
    if spec.worker.engine.cpu_runtime != "openvino" or source.kind != "hf" or not claim:
        return ""
    return f"{MODEL_DIR}/.openvino"


def served_task(spec: Spec) -> str:
    """The worker's and gateway's --task: embed, the default, leaves the choice to the checkpoint
    (so a cross-encoder deployed without model.task still scores); the others are checked
    against it at start."""
    return "auto" if spec.model.task == "embed" else spec.model.task


def engine_ports(engines: int) -> list[tuple[str, int, str, int]]:
    """(gRPC port name, port, metrics port name, port) of each engine process of a worker pod:
    grpc/50051 and metrics/9090 for the first, then grpc-1/50052, metrics-1/9091 and so on.
    The gateway takes every port named grpc or grpc-N as one endpoint."""
    return [
        (
            "grpc" if i == 0 else f"grpc-{i}",
            GRPC_PORT + i,
            "metrics" if i == 0 else f"metrics-{i}",
            WORKER_METRICS_PORT + i,
        )
        for i in range(engines)
    ]


def tracing_env(prefix: str, spec: Spec, service_name: str) -> dict[str, str]:
    """The tracing settings of one component; none when spec.monitoring.tracing has no endpoint,
    so an untraced deployment's config (and its pods' config hash) is what it was before."""
    tracing = spec.tracing
    if not tracing.endpoint:
        return {}
    return _env(
        prefix,
        {
            "tracing_endpoint": tracing.endpoint,
            "tracing_sample_ratio": tracing.sample_ratio,
            "tracing_service_name": service_name,
        },
    )


def worker_env(spec: Spec) -> dict[str, str]:
    """EMBEDFLEET_WORKER_* settings (names match embedfleet.worker.settings.WorkerSettings)."""
    engine = spec.worker.engine
    engines: dict[str, object] = {}
    if spec.worker.engines_per_gpu > 1:
        # The worker splits ports, threads and (on a GPU) 0.9 of its memory between them.
        engines["engines"] = spec.worker.engines_per_gpu
    graphs: dict[str, object] = {
        "token_buckets": engine.token_buckets,
        "token_buckets_per_octave": engine.token_buckets_per_octave,
        "token_bucket_switch": engine.token_bucket_switch,
        "token_bucket_large_step": engine.token_bucket_large_step,
        "sequence_buckets": engine.sequence_buckets,
        "max_graphs": engine.max_graphs,
    }
    if engine.graph_buckets:
        graphs["graph_buckets"] = ",".join(str(b) for b in engine.graph_buckets)
    if engine.cpu_runtime != "auto":
        # Only when chosen, so a fleet that never set it keeps its pods' config hash (no rollout
        # of every CPU fleet when the operator is upgraded).
        graphs["cpu_runtime"] = engine.cpu_runtime
    if cache := openvino_cache_dir(spec):
        graphs["openvino_cache_dir"] = cache
    return _env(
        WORKER_PREFIX,
        {
            **engines,
            **graphs,
            "threads": worker_threads(spec.worker.resources),
            "model": model_path(spec.model.source),
            "task": served_task(spec),
            "max_input_tokens": spec.model.max_input_tokens,
            "device": "cuda" if spec.worker.gpus > 0 else "cpu",
            "dtype": spec.model.dtype,
            "attention": engine.attention,
            "cuda_graphs": engine.cuda_graphs,
            "max_batch_tokens": engine.max_batch_tokens,
            "max_batch_sequences": engine.max_batch_sequences,
            "max_queue_requests": engine.max_queue_requests,
            "token_bucket_step": engine.token_bucket_step,
            "host": "0.0.0.0",
            "port": GRPC_PORT,
            "metrics_port": WORKER_METRICS_PORT,
            "drain_seconds": spec.worker.drain_seconds,
            "max_inflight_bytes": spec.worker.memory.max_inflight_bytes,
            "library_cache_capacity": spec.worker.memory.library_cache_capacity,
            "malloc_trim_seconds": spec.worker.memory.malloc_trim_seconds,
        },
    ) | tracing_env(WORKER_PREFIX, spec, "embedfleet-worker")


def gateway_env(owner: Owner, spec: Spec) -> dict[str, str]:
    """EMBEDFLEET_GATEWAY_* settings (the gateway binary's, docs/gateway.md "Settings")."""
    gateway = spec.gateway
    return _env(
        GATEWAY_PREFIX,
        {
            "model": model_path(spec.model.source),
            "task": served_task(spec),
            "served_model_name": spec.model.served_model_name,
            "max_input_tokens": spec.model.max_input_tokens,
            "k8s_service": Names.of(owner.name).worker,
            "k8s_port_name": "grpc",
            "max_client_batch": gateway.max_client_batch,
            "max_request_tokens": gateway.max_request_tokens,
            "chunk_tokens": gateway.chunk_tokens,
            "upstream_timeout_seconds": gateway.upstream_timeout_seconds,
            "max_queue_seconds": gateway.max_queue_seconds,
            "split_long_inputs": gateway.split_long_inputs,
            "split_overlap_tokens": gateway.split_overlap_tokens,
            "api_keys_file": API_KEYS_FILE if gateway.auth.secret else "",
            "api_key_metrics": gateway.auth.per_key_metrics,
            "quantization_file": QUANTIZATION_FILE if gateway.quantization else "",
            # Zero workers by design: the gateway stays Ready and holds the first requests, whose
            # count and tokens on its /metrics wake the fleet (the autoscaler scrapes them).
            "hold_requests": HOLD_REQUESTS if _scales_to_zero(spec) else 0,
            "host": "0.0.0.0",
            "port": GATEWAY_PORT,
        },
    ) | tracing_env(GATEWAY_PREFIX, spec, "embedfleet-gateway")


def _scales_to_zero(spec: Spec) -> bool:
    return spec.autoscaling.enabled and spec.autoscaling.min_replicas == 0


def config_hash(values: Mapping[str, str]) -> str:
    """Annotates a pod template, so a settings change rolls exactly the pods that read it."""
    blob = json.dumps(dict(values), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def config_map(owner: Owner, spec: Spec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(owner, Names.of(owner.name).config, "config"),
        "data": {**worker_env(spec), **gateway_env(owner, spec)},
    }


# -- pods ------------------------------------------------------------------------------------


def _container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _pod_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        # Makes a model cache claim writable by the non-root user.
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _resources(resources: Resources, gpus: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if resources.requests:
        out["requests"] = dict(resources.requests)
    limits = dict(resources.limits)
    if gpus:
        limits[GPU_RESOURCE] = str(gpus)
    if limits:
        out["limits"] = limits
    return out


@dataclass(frozen=True)
class ModelMount:
    volumes: list[dict[str, Any]]
    mounts: list[dict[str, Any]]
    init_containers: list[dict[str, Any]]


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
        "securityContext": _container_security(),
    }
    return ModelMount([volume], [{"name": volume_name, "mountPath": root}], [fetch])


def _pod_spec(
    spec: Spec,
    container: dict[str, Any],
    mount: ModelMount,
    **extra: Any,
) -> dict[str, Any]:
    container["volumeMounts"] = [{"name": "tmp", "mountPath": "/tmp"}, *mount.mounts]
    pod: dict[str, Any] = {
        "securityContext": _pod_security(),
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}, *mount.volumes],
        **extra,
    }
    if mount.init_containers:
        pod["initContainers"] = mount.init_containers
    if spec.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in spec.image_pull_secrets]
    return pod


def _deployment(
    owner: Owner,
    name: str,
    component: str,
    replicas: int,
    pod_spec: dict[str, Any],
    annotations: dict[str, str],
    strategy: dict[str, Any],
    task: str,
) -> Manifest:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(owner, name, component),
        "spec": {
            "replicas": replicas,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": selector_labels(owner, component)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": strategy},
            "template": {
                "metadata": {
                    "labels": {**labels(owner, component), LABEL_TASK: task},
                    "annotations": annotations,
                },
                "spec": pod_spec,
            },
        },
    }


def _grpc_probe(period: int, failures: int) -> dict[str, Any]:
    # The worker serves grpc.health.v1; "" is the overall serving status (NOT_SERVING while
    # loading and while draining).
    return {
        "grpc": {"port": GRPC_PORT, "service": ""},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def worker_deployment(owner: Owner, spec: Spec, replicas: int, images: Images) -> Manifest:
    worker = spec.worker
    image, _ = images.fetcher(spec)
    env = worker_env(spec)
    names = Names.of(owner.name)
    container: dict[str, Any] = {
        "name": "worker",
        "image": image,
        "imagePullPolicy": worker.image_pull_policy,
        "command": ["embedfleet-worker"],
        "envFrom": [{"configMapRef": {"name": names.config}}],
        "env": [{"name": "HOME", "value": "/tmp"}],
        "ports": [
            port
            for grpc, grpc_port, metrics, metrics_port in engine_ports(worker.engines_per_gpu)
            for port in (
                {"name": grpc, "containerPort": grpc_port, "protocol": "TCP"},
                {"name": metrics, "containerPort": metrics_port, "protocol": "TCP"},
            )
        ],
        # Loading weights, warm-up and the self-check may take minutes on a cold node (15 at
        # most); a short period lets readiness (checked only after start-up) follow SERVING soon.
        # Period 1 s: a worker woken from zero is answering requests within about a second of
        # SERVING (the gateway only sees it once the pod is Ready). kubelet runs one probe at a
        # time, so a silent worker fails one probe per timeout (5 s), not per period: two
        # failures take a hung worker out of the Service after ~10 s, well before liveness
        # restarts it (60 s); a refused or NOT_SERVING answer fails at once.
        "startupProbe": _grpc_probe(period=1, failures=900),
        "readinessProbe": _grpc_probe(period=1, failures=2),
        "livenessProbe": _grpc_probe(period=10, failures=6),
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}},
        "securityContext": _container_security(),
        # A refused model's one line is the termination message (refusal.py reads it); should
        # the worker fail to write the file, the log's tail, which ends with that line, is.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if resources := _resources(worker.resources, worker.gpus):
        container["resources"] = resources
    sched = worker.scheduling
    tolerations = [dict(t) for t in sched.tolerations]
    if worker.gpus and not any(t.get("key") == GPU_RESOURCE for t in tolerations):
        # GPU node pools are commonly tainted with the resource name.
        tolerations.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    extra: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": worker.drain_seconds
        + PRESTOP_SECONDS
        + GRACE_MARGIN_SECONDS,
    }
    if sched.node_selector:
        extra["nodeSelector"] = dict(sched.node_selector)
    if tolerations:
        extra["tolerations"] = tolerations
    if sched.affinity:
        extra["affinity"] = dict(sched.affinity)
    if sched.priority_class_name:
        extra["priorityClassName"] = sched.priority_class_name
    mount = model_mount(spec, image, worker.image_pull_policy)
    return _deployment(
        owner,
        names.worker,
        "worker",
        replicas,
        _pod_spec(spec, container, mount, **extra),
        {CONFIG_HASH: config_hash(env)},
        # Never below the current capacity during a rollout: a new pod must be ready first.
        {"maxUnavailable": 0, "maxSurge": 1},
        spec.model.task,
    )


def gateway_files(gateway: Gateway) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts): the Secret of API keys and the ConfigMap of calibration ranges, as
    read-only files.

    Whole volumes with `items`, never `subPath`: the kubelet updates such a volume in place (by
    swapping its `..data` symlink), which is how a key rotation reaches the running gateway.
    """
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if (secret := gateway.auth.secret) is not None:
        items = [{"key": secret.key, "path": API_KEYS_FILE.rsplit("/", 1)[1]}]
        volumes.append(
            {
                "name": "api-keys",
                # Readable by the pod's group (fsGroup) only; the keys are never world-readable.
                "secret": {"secretName": secret.name, "items": items, "defaultMode": 0o440},
            }
        )
        mounts.append({"name": "api-keys", "mountPath": API_KEYS_DIR, "readOnly": True})
    if (ref := gateway.quantization) is not None:
        items = [{"key": ref.key, "path": QUANTIZATION_FILE.rsplit("/", 1)[1]}]
        volumes.append({"name": "quantization", "configMap": {"name": ref.name, "items": items}})
        mounts.append({"name": "quantization", "mountPath": QUANTIZATION_DIR, "readOnly": True})
    return volumes, mounts


def gateway_probes() -> dict[str, Any]:
    """A gateway container's probes and preStop (a fleet's gateway and a shared one alike)."""
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


GATEWAY_COMMAND = ["embedfleet-gateway"]
"""The gateway image's binary, reading its settings from EMBEDFLEET_GATEWAY_* (docs/gateway.md)."""


def gateway_deployment(owner: Owner, spec: Spec, images: Images) -> Manifest:
    gateway = spec.gateway
    image = gateway.image or images.gateway
    env = gateway_env(owner, spec)
    names = Names.of(owner.name)
    http = {"name": "http", "containerPort": GATEWAY_PORT, "protocol": "TCP"}
    container: dict[str, Any] = {
        "name": "gateway",
        "image": image,
        "imagePullPolicy": gateway.image_pull_policy,
        "command": GATEWAY_COMMAND,
        "envFrom": [{"configMapRef": {"name": names.config}}],
        "env": [{"name": "HOME", "value": "/tmp"}],
        "ports": [http],
        **gateway_probes(),
        "securityContext": _container_security(),
    }
    if resources := _resources(gateway.resources):
        container["resources"] = resources
    model = model_mount(spec, *images.fetcher(spec))
    volumes, mounts = gateway_files(gateway)
    mount = ModelMount(model.volumes + volumes, model.mounts + mounts, model.init_containers)
    pod = _pod_spec(
        spec,
        container,
        mount,
        serviceAccountName=names.gateway,
        enableServiceLinks=False,
        terminationGracePeriodSeconds=int(gateway.upstream_timeout_seconds)
        + PRESTOP_SECONDS
        + GRACE_MARGIN_SECONDS,
    )
    return _deployment(
        owner,
        names.gateway,
        "gateway",
        gateway.replicas,
        pod,
        {CONFIG_HASH: config_hash(env)},
        {"maxUnavailable": 0, "maxSurge": "25%"},
        spec.model.task,
    )


# -- services, RBAC, disruption budgets, monitoring ------------------------------------------------


def worker_service(owner: Owner, engines: int = 1) -> Manifest:
    name = Names.of(owner.name).worker
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(owner, name, "worker"),
        "spec": {
            # Headless: the gateway balances per pod from the EndpointSlices, not through a VIP.
            "clusterIP": "None",
            "selector": selector_labels(owner, "worker"),
            "publishNotReadyAddresses": False,
            "ports": [
                port
                for grpc, grpc_port, metrics, metrics_port in engine_ports(engines)
                for port in (
                    {"name": grpc, "port": grpc_port, "targetPort": grpc, "protocol": "TCP"},
                    {
                        "name": metrics,
                        "port": metrics_port,
                        "targetPort": metrics,
                        "protocol": "TCP",
                    },
                )
            ],
        },
    }


def gateway_service(owner: Owner, spec: Spec) -> Manifest:
    meta = _meta(owner, Names.of(owner.name).service, "gateway")
    return http_service(meta, spec.gateway.service, selector_labels(owner, "gateway"))


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


def gateway_rbac(owner: Owner) -> list[Manifest]:
    """The gateway's identity: read the EndpointSlices of its namespace, nothing else."""
    name = Names.of(owner.name).gateway
    return slice_reader(name, owner.namespace, lambda: _meta(owner, name, "gateway"))


def slice_reader(name: str, namespace: str, meta: Callable[[], dict[str, Any]]) -> list[Manifest]:
    """ServiceAccount, Role and RoleBinding `name`: get/list/watch EndpointSlices in
    `namespace`, nothing else (each object's metadata from `meta`)."""
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


def disruption_budget(owner: Owner, component: str) -> Manifest:
    names = Names.of(owner.name)
    name = names.worker if component == "worker" else names.gateway
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(owner, name, component),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(owner, component)},
            # A pod that never became ready must not block a node drain.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def service_monitor(owner: Owner, spec: Spec) -> Manifest:
    monitor = spec.service_monitor
    meta = _meta(owner, owner.name, "monitoring")
    meta["labels"] = {**meta["labels"], **monitor.labels}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": {LABEL_NAME: "embedfleet", LABEL_INSTANCE: owner.name}},
            "namespaceSelector": {"matchNames": [owner.namespace]},
            # Each endpoint matches only the Service that has a port of that name.
            "endpoints": [
                *(
                    {"port": metrics, "interval": monitor.interval}
                    for _, _, metrics, _ in engine_ports(spec.worker.engines_per_gpu)
                ),
                {"port": "http", "path": "/metrics", "interval": monitor.interval},
            ],
        },
    }


def children(
    owner: Owner,
    spec: Spec,
    worker_replicas: int,
    images: Images,
    service_monitors_available: bool,
) -> list[Manifest]:
    """Every child, in apply order: settings before the pods that read them."""
    out = [
        config_map(owner, spec),
        worker_service(owner, spec.worker.engines_per_gpu),
        worker_deployment(owner, spec, worker_replicas, images),
        *gateway_rbac(owner),
        gateway_deployment(owner, spec, images),
        gateway_service(owner, spec),
        disruption_budget(owner, "worker"),
        disruption_budget(owner, "gateway"),
    ]
    if spec.service_monitor.enabled and service_monitors_available:
        out.append(service_monitor(owner, spec))
    return out

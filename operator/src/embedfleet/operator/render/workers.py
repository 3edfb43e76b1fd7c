"""The worker: its settings (EMBEDFLEET_WORKER_*), its Deployment and the headless Service the
gateways discover its pods by."""

from __future__ import annotations

import math
from typing import Any

from embedfleet.operator.manifests import (
    CONFIG_HASH,
    GPU_RESOURCE,
    GRACE_MARGIN_SECONDS,
    GRPC_PORT,
    LABEL_TASK,
    MODEL_DIR,
    PRESTOP_SECONDS,
    WORKER_METRICS_PORT,
    WORKER_PREFIX,
    Images,
    Manifest,
    Names,
    Owner,
    labels,
    metadata,
    selector_labels,
)
from embedfleet.operator.render.config import config_hash, env, model_path, served_task, tracing_env
from embedfleet.operator.render.pods import (
    container_security,
    deployment,
    model_mount,
    pod_spec,
    resources,
)
from embedfleet.operator.spec import Resources, Spec


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


def worker_front(spec: Spec) -> dict[str, str]:
    """The worker's --front, only when it is not the worker's own default (python), which a
    fleet that chose python keeps its pods' config hash by. The images carry the Rust front's
    extension, so rust needs no --front-library."""
    front = spec.worker.front
    return {} if front == "python" else {"front": front}


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
    return env(
        WORKER_PREFIX,
        {
            **engines,
            **graphs,
            **worker_front(spec),
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


def grpc_probe(period: int, failures: int) -> dict[str, Any]:
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
    settings = worker_env(spec)
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
        "startupProbe": grpc_probe(period=1, failures=900),
        "readinessProbe": grpc_probe(period=1, failures=2),
        "livenessProbe": grpc_probe(period=10, failures=6),
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}},
        "securityContext": container_security(),
        # A refused model's one line is the termination message (refusal.py reads it); should
        # the worker fail to write the file, the log's tail, which ends with that line, is.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if wanted := resources(worker.resources, worker.gpus):
        container["resources"] = wanted
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
    return deployment(
        metadata(owner, names.worker, "worker"),
        replicas,
        selector_labels(owner, "worker"),
        {**labels(owner, "worker"), LABEL_TASK: spec.model.task},
        {CONFIG_HASH: config_hash(settings)},
        # Never below the current capacity during a rollout: a new pod must be ready first.
        {"maxUnavailable": 0, "maxSurge": 1},
        pod_spec(container, mount, spec.image_pull_secrets, **extra),
    )


def worker_service(owner: Owner, engines: int = 1) -> Manifest:
    name = Names.of(owner.name).worker
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, name, "worker"),
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

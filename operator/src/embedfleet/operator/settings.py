"""The operator's config object: every field is a flag and an env var (EMBEDFLEET_OPERATOR_*)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import version

from embedfleet.common.logs import LOG_FORMATS
from embedfleet.common.settings import setting

ENV_PREFIX = "EMBEDFLEET_OPERATOR_"
REGISTRY = "ghcr.io/embedfleet"
# Images are REGISTRY/<component>:<version>, the CPU worker <version>-cpu (docs/operator.md,
# "Images"); the version is the release's, which every component's pyproject.toml carries.
DEFAULT_TAG = version("embedfleet-operator")
DEFAULT_WORKER_IMAGE = f"{REGISTRY}/worker:{DEFAULT_TAG}"
DEFAULT_WORKER_CPU_IMAGE = f"{REGISTRY}/worker:{DEFAULT_TAG}-cpu"
DEFAULT_GATEWAY_IMAGE = f"{REGISTRY}/gateway:{DEFAULT_TAG}"


@dataclass(frozen=True)
class OperatorSettings:
    namespace: str = setting(
        "", "Watch EmbeddingDeployments in this namespace only; empty watches all namespaces."
    )
    worker_image: str = setting(
        DEFAULT_WORKER_IMAGE,
        "Worker image for EmbeddingDeployments that set no spec.worker.image (for those that ask "
        "for no GPUs, see --worker-cpu-image).",
    )
    worker_cpu_image: str = setting(
        "",
        "Worker image for EmbeddingDeployments that set no spec.worker.image and ask for no GPUs "
        f"(worker.gpus 0); empty means {DEFAULT_WORKER_CPU_IMAGE} while --worker-image keeps its "
        "default, else --worker-image.",
    )
    gateway_image: str = setting(
        DEFAULT_GATEWAY_IMAGE,
        "Gateway image for EmbeddingDeployments that set no spec.gateway.image.",
    )
    resync_seconds: float = setting(
        60.0,
        "Every EmbeddingDeployment is reconciled at least this often (besides every change to "
        "it or its children): retries after errors and repairs anything a watch missed.",
    )
    reconcile_workers: int = setting(
        16,
        "Reconciles running at once. Each is a thread of blocking API calls that mostly waits on "
        "the API server (and etcd's fsyncs), so more workers apply more fleets per second "
        "until the API server is the bottleneck.",
        minimum=1,
    )
    autoscaler_status_seconds: float = setting(
        30.0,
        "The autoscaler writes a new decision to status.autoscaling at once, and new measurements "
        "(observed load, p99, its windows) at most this often: a write per autoscaled fleet per "
        "5 s tick would load the API server. A new leader resumes from what was written last.",
        minimum=0,
    )
    metrics_port: int = setting(8080, "Prometheus /metrics port; 0 disables it.")
    health_port: int = setting(
        8081,
        "Health endpoint (http://0.0.0.0:PORT/healthz, for the liveness and readiness probes), "
        "served from start-up, by a standby replica too; 0 disables it.",
    )
    leader_election: bool = setting(
        True,
        "Act only while holding a coordination.k8s.io Lease, so two replicas never both act.",
    )
    lease_name: str = setting("embedfleet-operator", "Name of the leader-election Lease.")
    lease_namespace: str = setting(
        "",
        "Namespace of the Lease; empty uses the pod's namespace (POD_NAMESPACE or the service "
        "account's), else `default`.",
    )
    lease_seconds: float = setting(
        15.0, "Lease duration: how long a crashed leader blocks a successor at most."
    )
    identity: str = setting(
        "", "This replica's name in the Lease; empty uses the host name plus a random suffix."
    )
    watch_server_timeout: int = setting(
        300, "Seconds the API server keeps one watch open before kopf reconnects."
    )
    watch_client_timeout: int = setting(
        330,
        "Client-side limit on one watch request (keep it above the server timeout). Besides, "
        "kopf reconnects a watch that is silent for 70 s: the API server sends a bookmark "
        "every 60 s, so silence means a stalled connection.",
    )
    log_level: str = setting("info", "Log level.", choices=("debug", "info", "warning", "error"))
    log_format: str = setting(
        "auto",
        "Log lines as json, as text, or auto (JSON unless stderr is a terminal).",
        choices=LOG_FORMATS,
    )


def cpu_worker_image(op: OperatorSettings) -> str:
    """The worker image for fleets without GPUs: one custom --worker-image serves every fleet, the
    built-in one has a CPU variant that leaves out CUDA's gigabytes."""
    if op.worker_cpu_image:
        return op.worker_cpu_image
    return DEFAULT_WORKER_CPU_IMAGE if op.worker_image == DEFAULT_WORKER_IMAGE else op.worker_image

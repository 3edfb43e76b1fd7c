"""A typed, defaulted view of an EmbeddingDeployment's spec.

The API server applies the CRD's defaults before the operator sees an object; the same defaults
live here so pure functions (and their tests) can take hand-written specs. A test keeps the two
sets of defaults equal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

GROUP = "embedfleet.dev"
VERSION = "v1alpha1"
PLURAL = "embeddingdeployments"
KIND = "EmbeddingDeployment"
API_VERSION = f"{GROUP}/{VERSION}"

SourceKind = Literal["hf", "pvc", "file"]
#: default entries of gateway.auth.secretRef and gateway.quantization.configMapRef (as the CRD's)
API_KEYS_KEY = "api-keys"
QUANTIZATION_KEY = "embedfleet_quantization.json"

_HF = re.compile(r"^hf://([A-Za-z0-9][A-Za-z0-9._-]*)/([A-Za-z0-9][A-Za-z0-9._-]*)(?:@(.+))?$")
_PVC = re.compile(r"^pvc://([a-z0-9](?:[-a-z0-9.]*[a-z0-9])?)/([^/].*)$")
_FILE = re.compile(r"^file://(/[^/].*)$")
#: gateway.shared: it names the shared gateway's objects (NAME-shared-gateway), as the CRD says
SHARED_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
SHARED_MAX = 40
#: what model.task may be (the CRD schema's enum)
TaskName = Literal["embed", "score", "classify", "sparse", "multivector", "hybrid"]


class SpecError(ValueError):
    """A spec the CRD schema should have refused (the operator reports it as Degraded)."""


@dataclass(frozen=True)
class ModelSource:
    kind: SourceKind
    repo: str = ""
    """hf: org/name."""
    revision: str = ""
    """hf: branch, tag or commit; empty means the default branch."""
    claim: str = ""
    """pvc: claim name."""
    path: str = ""
    """pvc: path inside the claim; file: absolute path."""


def parse_source(source: str, revision: str = "") -> ModelSource:
    if m := _HF.match(source):
        return ModelSource(
            kind="hf", repo=f"{m.group(1)}/{m.group(2)}", revision=m.group(3) or revision
        )
    if m := _PVC.match(source):
        return ModelSource(kind="pvc", claim=m.group(1), path=m.group(2).rstrip("/"))
    if m := _FILE.match(source):
        return ModelSource(kind="file", path=m.group(1))
    raise SpecError(
        f"model.source {source!r} is not hf://org/name[@revision], pvc://claim/path "
        "or file:///absolute/path"
    )


@dataclass(frozen=True)
class Cache:
    claim_name: str = ""
    size_limit: str = "20Gi"


@dataclass(frozen=True)
class Model:
    source: ModelSource
    task: TaskName = "embed"
    served_model_name: str = ""
    max_input_tokens: int = 0
    dtype: str = "auto"
    cache: Cache = field(default_factory=Cache)


@dataclass(frozen=True)
class Engine:
    max_batch_tokens: int = 16384
    max_batch_sequences: int = 512
    max_queue_requests: int = 1024
    token_bucket_step: int = 64
    token_buckets: str = "geometric"
    token_buckets_per_octave: int = 4
    token_bucket_switch: int = 1024
    token_bucket_large_step: int = 256
    sequence_buckets: str = "fixed"
    max_graphs: int = 64
    graph_buckets: tuple[int, ...] = ()
    cuda_graphs: str = "lazy"
    attention: str = "auto"
    #: how the encoder runs on a CPU worker (the worker's --cpu-runtime): auto, eager, inductor,
    #: openvino
    cpu_runtime: str = "auto"


@dataclass(frozen=True)
class Memory:
    max_inflight_bytes: int = 128 << 20
    library_cache_capacity: int = 64
    malloc_trim_seconds: float = 2.0


@dataclass(frozen=True)
class Resources:
    requests: Mapping[str, str] = field(default_factory=dict)
    limits: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Scheduling:
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] = field(default_factory=dict)
    priority_class_name: str = ""


@dataclass(frozen=True)
class Worker:
    replicas: int = 1
    image: str = ""
    image_pull_policy: str = "IfNotPresent"
    gpus: int = 0
    engines_per_gpu: int = 1
    resources: Resources = field(default_factory=Resources)
    drain_seconds: int = 30
    #: the worker's gRPC front (its --front): rust (worker-front/, in the images), or python
    front: str = "rust"
    engine: Engine = field(default_factory=Engine)
    memory: Memory = field(default_factory=Memory)
    scheduling: Scheduling = field(default_factory=Scheduling)


@dataclass(frozen=True)
class GatewayService:
    type: str = "ClusterIP"
    port: int = 80
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class FileRef:
    """One entry of a Secret or ConfigMap, mounted into the gateway as a file."""

    name: str
    key: str


@dataclass(frozen=True)
class GatewayAuth:
    #: the Secret entry of API keys (one a line); None: no auth
    secret: FileRef | None = None
    per_key_metrics: bool = False


@dataclass(frozen=True)
class Gateway:
    replicas: int = 1
    image: str = ""
    image_pull_policy: str = "IfNotPresent"
    resources: Resources = field(default_factory=Resources)
    max_client_batch: int = 2048
    max_request_tokens: int = 1_000_000
    chunk_tokens: int = 8192
    upstream_timeout_seconds: float = 60.0
    #: admission's bound, seconds of work queued ahead (the gateway's --max-queue-seconds)
    max_queue_seconds: float = 30.0
    split_long_inputs: bool = False
    split_overlap_tokens: int = 32
    auth: GatewayAuth = field(default_factory=GatewayAuth)
    #: the ConfigMap entry holding int8/uint8 calibration ranges; None: the model directory's
    quantization: FileRef | None = None
    service: GatewayService = field(default_factory=GatewayService)
    #: the namespace's shared gateway this fleet also joins (manifests.shared_gateway); "": none
    shared: str = ""


@dataclass(frozen=True)
class Autoscaling:
    enabled: bool = False
    external: bool = False
    min_replicas: int = 1
    max_replicas: int = 4
    target_tokens_per_second: int | None = None
    target_utilization: float = 0.8
    p99_latency_slo_milliseconds: int = 500
    panic_window_seconds: int = 10
    stable_window_seconds: int = 60
    scale_down_stabilization_seconds: int = 300
    max_scale_up_rate: float = 2.0
    max_scale_down_rate: float = 2.0
    tolerance: float = 0.1
    prometheus_url: str = ""

    @property
    def operator_driven(self) -> bool:
        """True when the built-in autoscaler (not HPA/KEDA, not the user) sets replicas."""
        return self.enabled and not self.external


@dataclass(frozen=True)
class ServiceMonitor:
    enabled: bool = False
    interval: str = "30s"
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Tracing:
    #: OTLP/gRPC collector URL; empty: tracing off (and no tracing env vars rendered)
    endpoint: str = ""
    sample_ratio: float = 1.0


@dataclass(frozen=True)
class Spec:
    model: Model
    worker: Worker = field(default_factory=Worker)
    gateway: Gateway = field(default_factory=Gateway)
    autoscaling: Autoscaling = field(default_factory=Autoscaling)
    service_monitor: ServiceMonitor = field(default_factory=ServiceMonitor)
    tracing: Tracing = field(default_factory=Tracing)
    image_pull_secrets: tuple[str, ...] = ()


# -- parsing ---------------------------------------------------------------------------------------


def _obj(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(f"{key} must be an object")
    return value


def _strings(raw: Mapping[str, Any], key: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in _obj(raw, key).items()}


def _resources(raw: Mapping[str, Any]) -> Resources:
    return Resources(requests=_strings(raw, "requests"), limits=_strings(raw, "limits"))


def _task(raw: object) -> TaskName:
    if raw == "score":
        return "score"
    if raw == "classify":
        return "classify"
    if raw == "sparse":
        return "sparse"
    if raw == "multivector":
        return "multivector"
    if raw == "hybrid":
        return "hybrid"
    return "embed"


def _model(raw: Mapping[str, Any]) -> Model:
    if not raw.get("source"):
        raise SpecError("model.source is required")
    cache = _obj(raw, "cache")
    return Model(
        source=parse_source(str(raw["source"]), str(raw.get("revision", ""))),
        task=_task(raw.get("task", "embed")),
        served_model_name=str(raw.get("servedModelName", "")),
        max_input_tokens=int(raw.get("maxInputTokens", 0)),
        dtype=str(raw.get("dtype", "auto")),
        cache=Cache(
            claim_name=str(cache.get("claimName", "")),
            size_limit=str(cache.get("sizeLimit", Cache.size_limit)),
        ),
    )


def _worker(raw: Mapping[str, Any]) -> Worker:
    d = Worker()
    engine, sched, e = _obj(raw, "engine"), _obj(raw, "scheduling"), Engine()
    memory, m = _obj(raw, "memory"), Memory()
    return Worker(
        replicas=int(raw.get("replicas", d.replicas)),
        image=str(raw.get("image", "")),
        image_pull_policy=str(raw.get("imagePullPolicy", d.image_pull_policy)),
        gpus=int(raw.get("gpus", d.gpus)),
        engines_per_gpu=int(raw.get("enginesPerGPU", d.engines_per_gpu)),
        resources=_resources(_obj(raw, "resources")),
        drain_seconds=int(raw.get("drainSeconds", d.drain_seconds)),
        front=str(raw.get("front", d.front)),
        engine=Engine(
            max_batch_tokens=int(engine.get("maxBatchTokens", e.max_batch_tokens)),
            max_batch_sequences=int(engine.get("maxBatchSequences", e.max_batch_sequences)),
            max_queue_requests=int(engine.get("maxQueueRequests", e.max_queue_requests)),
            token_bucket_step=int(engine.get("tokenBucketStep", e.token_bucket_step)),
            token_buckets=str(engine.get("tokenBuckets", e.token_buckets)),
            token_buckets_per_octave=int(
                engine.get("tokenBucketsPerOctave", e.token_buckets_per_octave)
            ),
            token_bucket_switch=int(engine.get("tokenBucketSwitch", e.token_bucket_switch)),
            token_bucket_large_step=int(
                engine.get("tokenBucketLargeStep", e.token_bucket_large_step)
            ),
            sequence_buckets=str(engine.get("sequenceBuckets", e.sequence_buckets)),
            max_graphs=int(engine.get("maxGraphs", e.max_graphs)),
            graph_buckets=tuple(int(b) for b in engine.get("graphBuckets") or ()),
            cuda_graphs=str(engine.get("cudaGraphs", e.cuda_graphs)),
            attention=str(engine.get("attention", e.attention)),
            cpu_runtime=str(engine.get("cpuRuntime", e.cpu_runtime)),
        ),
        memory=Memory(
            max_inflight_bytes=int(memory.get("maxInflightBytes", m.max_inflight_bytes)),
            library_cache_capacity=int(
                memory.get("libraryCacheCapacity", m.library_cache_capacity)
            ),
            malloc_trim_seconds=float(memory.get("mallocTrimSeconds", m.malloc_trim_seconds)),
        ),
        scheduling=Scheduling(
            node_selector=_strings(sched, "nodeSelector"),
            tolerations=tuple(sched.get("tolerations") or ()),
            affinity=dict(_obj(sched, "affinity")),
            priority_class_name=str(sched.get("priorityClassName", "")),
        ),
    )


def _file_ref(raw: Mapping[str, Any], key: str, default_key: str) -> FileRef | None:
    ref = _obj(raw, key)
    if not ref:
        return None
    if not ref.get("name"):
        raise SpecError(f"{key}.name is required")
    return FileRef(name=str(ref["name"]), key=str(ref.get("key", default_key)))


def _shared(raw: Mapping[str, Any]) -> str:
    """gateway.shared, checked as the CRD checks it (for API servers holding an older CRD)."""
    name = str(raw.get("shared") or "")
    if name and (len(name) > SHARED_MAX or not SHARED_NAME.fullmatch(name)):
        raise SpecError(
            f"gateway.shared '{name}' must start with a letter, hold only lowercase letters, "
            f"digits and '-', end with a letter or digit, and be at most {SHARED_MAX} characters"
        )
    return name


def _gateway(raw: Mapping[str, Any]) -> Gateway:
    d, service, s = Gateway(), _obj(raw, "service"), GatewayService()
    auth = _obj(raw, "auth")
    return Gateway(
        shared=_shared(raw),
        replicas=int(raw.get("replicas", d.replicas)),
        image=str(raw.get("image", "")),
        image_pull_policy=str(raw.get("imagePullPolicy", d.image_pull_policy)),
        resources=_resources(_obj(raw, "resources")),
        max_client_batch=int(raw.get("maxClientBatch", d.max_client_batch)),
        max_request_tokens=int(raw.get("maxRequestTokens", d.max_request_tokens)),
        chunk_tokens=int(raw.get("chunkTokens", d.chunk_tokens)),
        upstream_timeout_seconds=float(
            raw.get("upstreamTimeoutSeconds", d.upstream_timeout_seconds)
        ),
        max_queue_seconds=float(raw.get("maxQueueSeconds", d.max_queue_seconds)),
        split_long_inputs=bool(raw.get("splitLongInputs", d.split_long_inputs)),
        split_overlap_tokens=int(raw.get("splitOverlapTokens", d.split_overlap_tokens)),
        auth=GatewayAuth(
            secret=_file_ref(auth, "secretRef", API_KEYS_KEY),
            per_key_metrics=bool(auth.get("perKeyMetrics", False)),
        ),
        quantization=_file_ref(_obj(raw, "quantization"), "configMapRef", QUANTIZATION_KEY),
        service=GatewayService(
            type=str(service.get("type", s.type)),
            port=int(service.get("port", s.port)),
            annotations=_strings(service, "annotations"),
        ),
    )


def _autoscaling(raw: Mapping[str, Any]) -> Autoscaling:
    d = Autoscaling()
    target = raw.get("targetTokensPerSecond")
    return Autoscaling(
        enabled=bool(raw.get("enabled", d.enabled)),
        external=bool(raw.get("external", d.external)),
        min_replicas=int(raw.get("minReplicas", d.min_replicas)),
        max_replicas=int(raw.get("maxReplicas", d.max_replicas)),
        target_tokens_per_second=None if target is None else int(target),
        target_utilization=float(raw.get("targetUtilization", d.target_utilization)),
        p99_latency_slo_milliseconds=int(
            raw.get("p99LatencySLOMilliseconds", d.p99_latency_slo_milliseconds)
        ),
        panic_window_seconds=int(raw.get("panicWindowSeconds", d.panic_window_seconds)),
        stable_window_seconds=int(raw.get("stableWindowSeconds", d.stable_window_seconds)),
        scale_down_stabilization_seconds=int(
            raw.get("scaleDownStabilizationSeconds", d.scale_down_stabilization_seconds)
        ),
        max_scale_up_rate=float(raw.get("maxScaleUpRate", d.max_scale_up_rate)),
        max_scale_down_rate=float(raw.get("maxScaleDownRate", d.max_scale_down_rate)),
        tolerance=float(raw.get("tolerance", d.tolerance)),
        prometheus_url=str(raw.get("prometheusURL", "")),
    )


def parse_spec(raw: Mapping[str, Any]) -> Spec:
    """The typed spec of an EmbeddingDeployment's `spec`; raises SpecError when unusable."""
    try:
        monitor = _obj(_obj(raw, "monitoring"), "serviceMonitor")
        tracing = _obj(_obj(raw, "monitoring"), "tracing")
        d = ServiceMonitor()
        return Spec(
            model=_model(_obj(raw, "model")),
            worker=_worker(_obj(raw, "worker")),
            gateway=_gateway(_obj(raw, "gateway")),
            autoscaling=_autoscaling(_obj(raw, "autoscaling")),
            service_monitor=ServiceMonitor(
                enabled=bool(monitor.get("enabled", d.enabled)),
                interval=str(monitor.get("interval", d.interval)),
                labels=_strings(monitor, "labels"),
            ),
            tracing=Tracing(
                endpoint=str(tracing.get("endpoint", "")),
                sample_ratio=float(tracing.get("sampleRatio", Tracing.sample_ratio)),
            ),
            image_pull_secrets=tuple(
                str(item["name"]) for item in raw.get("imagePullSecrets") or () if "name" in item
            ),
        )
    except (TypeError, ValueError) as exc:
        if isinstance(exc, SpecError):
            raise
        raise SpecError(str(exc)) from exc

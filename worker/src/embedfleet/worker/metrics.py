"""The worker's Prometheus metrics, declared once each (embedfleet.common.metrics), in a registry
of its own (no process-global state).

docs/worker.md lists them; `metric_rows` renders that list from the registry, so it cannot drift.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from embedfleet.common.metrics import Metrics, counter, gauge, histogram
from embedfleet.worker.contract import Engine, GraphCounters, StageTimes

_PREFIX = "embedfleet_worker_"
_SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
            2.5, 5.0, 10.0, 30.0)  # fmt: skip
#: finer at the low end: a stage of one small request takes microseconds
_STAGE_SECONDS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                  0.01, 0.025, 0.05, 0.1, 0.25, 1.0)  # fmt: skip
#: the worker's stages of a request besides queue_wait and compute (their own histograms): parse
#: (protobuf decode), validate (tokens unpacked, admitted, checked), reply (results to the reply
#: message), serialize (reply encoded); an engine may add its own per batch (pack, forward, pool)
STAGES = ("parse", "validate", "reply", "serialize")
ENGINE_STAGES = ("pack", "forward", "pool")
_TOKENS = tuple(float(2**k) for k in range(4, 18))  # 16 .. 131072
_SEQUENCES = tuple(float(2**k) for k in range(0, 11))  # 1 .. 1024

# Read at scrape time from the engine (_GraphCollector) and the device (_GpuMemoryCollector).
GRAPH_CAPTURES = counter(_PREFIX + "graph_captures_total", "CUDA graphs captured.")
GRAPH_REPLAYS = counter(_PREFIX + "graph_replays_total", "Batches run by replaying a CUDA graph.")
EAGER_RUNS = counter(_PREFIX + "eager_runs_total", "Batches run eagerly (no graph).")
GRAPH_CAPTURE_SECONDS = counter(
    _PREFIX + "graph_capture_seconds_total", "Time spent capturing CUDA graphs."
)
GRAPH_REJECTS = counter(
    _PREFIX + "graph_rejects_total",
    "New CUDA graphs whose check replay disagreed with eager (never served; the bucket "
    "runs eager from then on).",
)
LIVE_GRAPHS = gauge(_PREFIX + "live_graphs", "CUDA graphs held now.")
GRAPH_POOL_BYTES = gauge(
    _PREFIX + "graph_pool_bytes",
    "GPU memory held by the CUDA graphs' shared memory pool (the largest captured "
    "bucket's working set; all graphs reuse it).",
)
ENGINE_INFO = gauge(
    _PREFIX + "engine_info",
    "1, labelled with the attention backend in use, whether CUDA graphs are on "
    "(off on CUDA: the engine's log says why) and the CPU runtime the encoder runs in "
    "(eager on CUDA).",
    ("attention", "cuda_graphs", "runtime"),
)
GPU_MEMORY_BYTES = gauge(
    _PREFIX + "gpu_memory_bytes",
    "GPU memory of the engine's device by kind: allocated (live tensors) or reserved "
    "(torch's caching allocator, allocated included). Absent on CPU.",
    ("kind",),
)
GPU_MEMORY_TOTAL_BYTES = gauge(
    _PREFIX + "gpu_memory_total_bytes", "Memory of the engine's GPU. Absent on CPU."
)
#: every metric read at scrape time, for checks of the names
SCRAPED = (
    GRAPH_CAPTURES,
    GRAPH_REPLAYS,
    EAGER_RUNS,
    GRAPH_CAPTURE_SECONDS,
    GRAPH_REJECTS,
    LIVE_GRAPHS,
    GRAPH_POOL_BYTES,
    ENGINE_INFO,
    GPU_MEMORY_BYTES,
    GPU_MEMORY_TOTAL_BYTES,
)


class _GraphCollector(Collector):
    """Reads the engine's own counters at scrape time rather than mirroring them."""

    def __init__(self, read: Callable[[], GraphCounters]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        counters = self._read()
        yield GRAPH_CAPTURES.family(counters.captures)
        yield GRAPH_REPLAYS.family(counters.replays)
        yield EAGER_RUNS.family(counters.eager_runs)
        yield GRAPH_CAPTURE_SECONDS.family(counters.capture_seconds)
        yield GRAPH_REJECTS.family(counters.rejects)
        yield LIVE_GRAPHS.family(counters.live_graphs)
        yield GRAPH_POOL_BYTES.family(counters.graph_pool_bytes)
        info = ENGINE_INFO.family()
        graphs = "on" if counters.graphs_enabled else "off"
        info.add_metric((counters.attention or "none", graphs, counters.runtime or "none"), 1.0)
        yield info

    def describe(self) -> Iterator[Metric]:
        # Same families with zero values: lets the docs list them before an engine exists.
        return _GraphCollector(GraphCounters).collect()


@dataclass(frozen=True, slots=True)
class GpuMemory:
    """The CUDA memory of the engine's device, in bytes."""

    allocated: int
    """Held by live tensors (weights, activations, graph pools in use)."""
    reserved: int
    """Held by torch's caching allocator: allocated plus cached free blocks; what other processes
    on the GPU cannot have."""
    total: int
    """The device's memory."""


def no_gpu() -> GpuMemory | None:
    return None


def cuda_memory(device: str) -> GpuMemory:
    """Torch's allocator counters: host-side reads, no CUDA call, so they are safe from the
    metrics thread while the engine thread launches or captures graphs."""
    import torch  # the metrics module loads without torch (docs, stub workers)

    return GpuMemory(
        allocated=torch.cuda.memory_allocated(device),
        reserved=torch.cuda.memory_reserved(device),
        total=torch.cuda.get_device_properties(device).total_memory,
    )


def engine_gpu_memory(engine: Engine | None) -> GpuMemory | None:
    """The GPU memory of a CUDA engine; None (no series at all) before the engine exists and on
    CPU, where a 0 would read as "uses no memory" rather than "has no GPU"."""
    if engine is None or not engine.info.device.startswith("cuda"):
        return None
    return cuda_memory(engine.info.device)


class _GpuMemoryCollector(Collector):
    """Samples GPU memory at scrape time: the value is current, and a CPU worker exports none."""

    def __init__(self, read: Callable[[], GpuMemory | None]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        memory = self._read()
        if memory is None:
            return
        used = GPU_MEMORY_BYTES.family()
        used.add_metric(("allocated",), memory.allocated)
        used.add_metric(("reserved",), memory.reserved)
        yield used
        yield GPU_MEMORY_TOTAL_BYTES.family(memory.total)

    def describe(self) -> Iterator[Metric]:
        return _GpuMemoryCollector(lambda: GpuMemory(0, 0, 0)).collect()


class WorkerMetrics(Metrics):
    """The worker's metrics, one registry per worker. The engine's graph counters and the GPU's
    memory are read at scrape time (the declarations above)."""

    tokens = counter(
        _PREFIX + "tokens_total", "Tokens computed for requests (warm-up and self-check excluded)."
    )
    requests = counter(
        _PREFIX + "requests_total",
        "RPCs answered, by method and gRPC status code.",
        ("rpc", "code"),
    )
    batch_tokens = histogram(_PREFIX + "batch_tokens", "Tokens per batch.", buckets=_TOKENS)
    batch_sequences = histogram(
        _PREFIX + "batch_sequences", "Sequences per batch.", buckets=_SEQUENCES
    )
    queue_wait = histogram(
        _PREFIX + "queue_wait_seconds",
        "From a request's arrival to the launch of its batch.",
        buckets=_SECONDS,
    )
    compute = histogram(
        _PREFIX + "compute_seconds",
        "From a batch's launch to its results on the host.",
        buckets=_SECONDS,
    )
    stage_seconds = histogram(
        _PREFIX + "stage_seconds",
        "Time in one stage: per request parse (protobuf decode), validate (tokens unpacked, "
        "admitted, checked), reply (results to the reply message), serialize (reply "
        "encoded); per batch the engine's own stages where it reports them (pack, forward, "
        "pool). queue_wait and compute have their own histograms.",
        ("stage",),
        buckets=_STAGE_SECONDS,
    )
    request = histogram(
        _PREFIX + "request_seconds",
        "Embed/Score RPC time inside the server, from the handler's start to its reply.",
        buckets=_SECONDS,
    )
    inflight = gauge(_PREFIX + "inflight_requests", "Requests admitted and not yet answered.")
    request_bytes = gauge(
        _PREFIX + "inflight_request_bytes",
        "Request message bytes held (decoded, queued or computing), at most --max-inflight-bytes.",
    )
    streams = gauge(
        _PREFIX + "embed_streams",
        "EmbedStream calls open: a gateway's long-lived stream of small Embed calls each "
        "(their calls count as Embed in the requests counter).",
    )
    queued_tokens = gauge(
        _PREFIX + "queued_tokens", "Tokens waiting in the queue (not yet launched)."
    )
    queued_requests = gauge(_PREFIX + "queued_requests", "Requests waiting in the queue.")
    dropped = counter(
        _PREFIX + "dropped_requests_total",
        "Requests removed from the queue without compute, by reason (cancelled, deadline).",
        ("reason",),
    )
    capacity = gauge(
        _PREFIX + "capacity_tokens_per_second",
        "Tokens/s this worker sustained at saturation during warm-up; the autoscaler reads it.",
    )
    saturated = gauge(
        _PREFIX + "saturated_tokens_per_second",
        "Tokens/s over this worker's latest back-to-back batches cut by the budget (saturated "
        "on real traffic, on its current share of the machine); 0 until it has been.",
    )
    ready = gauge(_PREFIX + "ready", "1 once warm-up and the self-check passed, 0 otherwise.")
    draining = gauge(_PREFIX + "draining", "1 after SIGTERM while in-flight requests finish.")

    def __init__(
        self,
        engine_counters: Callable[[], GraphCounters] = GraphCounters,
        gpu_memory: Callable[[], GpuMemory | None] = no_gpu,
    ) -> None:
        super().__init__(CollectorRegistry(auto_describe=True))
        # Resolved once, so observing is no label lookup; engines' names are looked up here too.
        self.stages = {name: self.stage_seconds.labels(name) for name in (*STAGES, *ENGINE_STAGES)}
        # Known series exist from the start (at 0), so dashboards and rate() see them at once.
        for reason in ("cancelled", "deadline"):
            self.dropped.labels(reason)
        for rpc in ("Embed", "Score", "Info"):
            self.requests.labels(rpc, "OK")
        self.registry.register(_GraphCollector(engine_counters))
        self.registry.register(_GpuMemoryCollector(gpu_memory))

    def serve(self, host: str, port: int) -> None:
        start_http_server(port, addr=host, registry=self.registry)

    def observe_batch(self, tokens: int, sequences: int) -> None:
        """One batch launched (either front's)."""
        self.batch_tokens.observe(tokens)
        self.batch_sequences.observe(sequences)

    def observe_stages(self, stages: StageTimes) -> None:
        """A batch's engine stages, (name, nanoseconds) each, where the engine reports them."""
        known = self.stages
        for name, ns in stages:
            histogram = known.get(name)
            if histogram is None:
                histogram = known[name] = self.stage_seconds.labels(name)
            histogram.observe(ns * 1e-9)


def metric_rows(metrics: WorkerMetrics) -> list[tuple[str, str, str, str]]:
    """(name as scraped, type, labels, help) for each metric, for the docs table."""
    rows = []
    for family in metrics.registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = sorted(
            {k for s in family.samples for k in s.labels if k not in ("le", "quantile")}
        )
        rows.append((name, family.type, ",".join(labels), family.documentation))
    return sorted(rows)

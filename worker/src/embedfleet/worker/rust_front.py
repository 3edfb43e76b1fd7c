"""`embedfleet-worker --front rust`: the worker's gRPC front in Rust (worker-front/, the
`embedfleet_front` extension), hosting this process's engine.

The engine is built, warmed up (its capacity measured with --capacity-measurement startup) and
self-checked here through the Python front's own runner; then `embedfleet_front.Server.serve`
takes the thread: a tonic server with the FCFS queue and byte budget, and one Rust thread that
calls `Batches` once per batch. Each request's options, checks and reply are the Python front's
functions (server.py), so both fronts answer alike; /metrics is the Python front's registry
(front_metrics.py); a background measurement goes through the Rust queue (rust_capacity.py).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from embedfleet.common import heap, logs
from embedfleet.common.arrays import FloatArray
from embedfleet.common.modeldir import ModelDir
from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.common.tracing import OFF, Tracer
from embedfleet.worker import front_metrics, tracing
from embedfleet.worker.contract import Engine, Options, Pending, WorkItem
from embedfleet.worker.device_errors import device_lost
from embedfleet.worker.lifecycle import (
    DEVICE_LOST_EXIT,
    budget_of,
    load_engine,
    log_device_lost,
    opening,
    port_taken,
    probe_shape,
    serve_metrics,
    warm_and_check,
    warm_graphs,
    worker_metrics,
    write_port_file,
)
from embedfleet.worker.metrics import WorkerMetrics
from embedfleet.worker.runner import BatchRunner, DeviceLostError, Entry
from embedfleet.worker.rust_capacity import Probes, QueueMeasured, resolve
from embedfleet.worker.rust_capacity import start as start_measuring
from embedfleet.worker.scheduler import Budget, FcfsQueue
from embedfleet.worker.server import (
    POOLING_ENUM,
    Served,
    StatusError,
    WorkerState,
    check_task,
    classify_response,
    embed_options,
    embed_response,
    hybrid_embed_response,
    hybrid_options,
    malformed_message,
    multi_vector_embed_response,
    multi_vector_options,
    score_options,
    score_response,
    served_by,
    sparse_embed_response,
    sparse_options,
    work_item,
)
from embedfleet.worker.settings import WorkerSettings
from embedfleet.worker.tracing import Computed, record_call

log = logging.getLogger(__name__)

#: what the extension's batch callable returns per request: the serialized reply, or a refusal
Reply = bytes | tuple[int, str]
#: what it gets per request: the gRPC method, the serialized request, its queue wait in seconds,
#: and with tracing on a unary call's (traceparent, tracestate) metadata ("" where absent)
Call = tuple[str, bytes, float, tuple[str, str] | None]
_INVALID = grpc.StatusCode.INVALID_ARGUMENT.value[0]
_INTERNAL = grpc.StatusCode.INTERNAL.value[0]
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]


@dataclass(frozen=True, slots=True)
class Rpc:
    """One RPC as the Python front answers it: its task, request type, options and reply."""

    task: str
    request: Callable[[bytes], Any]
    options: Callable[[Any], Options]
    reply: Callable[[Any, FloatArray, WorkItem, Served], Message]


def _plain(
    reply: Callable[[Any, FloatArray, WorkItem], Message],
) -> Callable[[Any, FloatArray, WorkItem, Served], Message]:
    """A reply that needs nothing of the served model."""
    return lambda request, result, item, _: reply(request, result, item)


#: the RPCs the Rust front serves (worker-front/build.rs lists the same), by gRPC method name
RPCS = {
    "Embed": Rpc("embed", pb.EmbedRequest.FromString, embed_options, _plain(embed_response)),
    "Score": Rpc("score", pb.ScoreRequest.FromString, score_options, _plain(score_response)),
    "Classify": Rpc(
        "classify", pb.ClassifyRequest.FromString, score_options, _plain(classify_response)
    ),
    "SparseEmbed": Rpc(
        "sparse", pb.SparseEmbedRequest.FromString, sparse_options, _plain(sparse_embed_response)
    ),
    "MultiVectorEmbed": Rpc(
        "multivector",
        pb.MultiVectorEmbedRequest.FromString,
        multi_vector_options,
        multi_vector_embed_response,
    ),
    "HybridEmbed": Rpc(
        "hybrid", pb.HybridEmbedRequest.FromString, hybrid_options, hybrid_embed_response
    ),
}


@dataclass(frozen=True, slots=True)
class _Admitted:
    slot: int
    item: WorkItem
    rpc: Rpc | None = None
    request: Any = None
    #: a capacity probe's (rust_capacity.py), which gets the result itself
    probe: asyncio.Future[FloatArray] | None = None


class Batches:
    """The Rust engine thread's Python half of a batch: `launch` takes its `Call`s and returns
    a `Launch`, whose `finish` gives each call's serialized reply (or its refusal), in order. It
    observes the batch's metrics as the Python front's runner and handlers do. A ("Probe", id)
    call is a capacity probe's item from `probes`, computed with the rest.

    A lost device (a sticky CUDA error) is reported once to `on_device_lost` (the server's
    drain); from then on every request is UNAVAILABLE without touching the engine, as the
    Python front's: the gateway retries elsewhere while this worker exits to be restarted."""

    def __init__(
        self,
        engine: Engine,
        budget: Budget,
        model: ModelDir,
        metrics: WorkerMetrics | None = None,
        probes: Probes | None = None,
        on_device_lost: Callable[[], None] = lambda: None,
        tracer: Tracer = OFF,
    ) -> None:
        self.engine = engine
        self.budget = budget
        self.task = model.task
        self.served = served_by(model, engine)
        self.metrics = metrics or WorkerMetrics()
        self.probes = probes or Probes()
        self._stages = self.metrics.stages
        #: tokens computed so far, probes' too (the capacity measurement reads it)
        self.computed_tokens = 0
        self._on_device_lost = on_device_lost
        self.tracer = tracer
        #: batches computed: each traced call's compute span names its batch
        self._batches = 0
        #: why the device is lost, once it is (serve exits DEVICE_LOST_EXIT)
        self.lost: str | None = None

    def __call__(self, calls: list[Call]) -> list[Reply]:
        """A batch launched and finished at once (what a CPU engine does anyway)."""
        return self.launch(calls).finish()

    def launch(self, calls: list[Call]) -> Launch:
        """The batch parsed, checked and launched on the engine: its `Launch`, whose `finish`
        waits for the results and makes the replies. The Rust engine thread launches batch N+1
        before finishing N while N is not `ready` (an asynchronous engine: CUDA)."""
        launch = Launch(self, calls, time.monotonic())
        launch.admitted = self._admit(calls, launch.replies)
        if launch.admitted:
            self._step(launch)
        return launch

    def _admit(self, calls: list[Call], replies: list[Reply]) -> list[_Admitted]:
        """Each call parsed and checked: the admitted ones, the rest's refusals in `replies`."""
        admitted: list[_Admitted] = []
        parse, validate = self._stages["parse"], self._stages["validate"]
        for slot, (method, data, waited, _) in enumerate(calls):
            self.metrics.queue_wait.observe(waited)
            if method == "Probe":
                if (probe := self.probes.take(int.from_bytes(data, "little"))) is not None:
                    admitted.append(_Admitted(slot, probe[0], probe=probe[1]))
                else:  # its measurement stopped waiting: skipped, as a cancelled call is dropped
                    replies[slot] = b""
                continue
            rpc = RPCS[method]
            try:
                started = time.perf_counter_ns()
                request = rpc.request(data)
                parsed = time.perf_counter_ns()
                parse.observe((parsed - started) * 1e-9)
                check_task(self.task, rpc.task)
                item = work_item(request.batch, rpc.options(request), self.budget, self.engine)
                validate.observe((time.perf_counter_ns() - parsed) * 1e-9)
            except DecodeError as exc:
                replies[slot] = (_INVALID, malformed_message(method, str(exc) or "undecodable"))
            except StatusError as exc:
                replies[slot] = (exc.code.value[0], exc.message)
            else:
                admitted.append(_Admitted(slot, item, rpc, request))
        return admitted

    def _step(self, launch: Launch) -> None:
        """One engine step for the admitted calls (their failure's replies if it raises)."""
        items = [call.item for call in launch.admitted]
        launch.tokens = sum(item.tokens.total for item in items)
        self.metrics.observe_batch(launch.tokens, sum(item.tokens.count for item in items))
        launch.started = time.perf_counter()
        try:
            if self.lost is not None:
                raise DeviceLostError(self.lost)  # refused without touching the engine
            launch.pending = self.engine.step(items)
        except Exception as exc:
            self.metrics.compute.observe(time.perf_counter() - launch.started)
            self._failed(launch.admitted, launch.replies, exc)

    def _finish(self, launch: Launch) -> list[Reply]:
        if launch.pending is not None:
            try:
                results = launch.pending.wait()
            except Exception as exc:
                self._failed(launch.admitted, launch.replies, exc)
            else:
                self._reply(launch, results)
            finally:
                self.metrics.compute.observe(time.perf_counter() - launch.started)
        if self.tracer.enabled:
            self._trace(launch)
        return launch.replies

    def _reply(self, launch: Launch, results: list[FloatArray]) -> None:
        """The computed batch's replies (a probe's result handed to its measurement)."""
        metrics = self.metrics
        metrics.observe_stages(getattr(launch.pending, "stages", ()))
        self._batches += 1
        launch.number, launch.computed = self._batches, time.monotonic()
        self.computed_tokens += launch.tokens
        metrics.tokens.inc(sum(call.item.tokens.total for call in launch.admitted if call.rpc))
        reply, serialize = self._stages["reply"], self._stages["serialize"]
        for call, result in zip(launch.admitted, results, strict=True):
            if call.rpc is None:
                assert call.probe is not None
                resolve(call.probe, result)
                launch.replies[call.slot] = b""
                continue
            started_ns = time.perf_counter_ns()
            message = call.rpc.reply(call.request, result, call.item, self.served)
            built = time.perf_counter_ns()
            launch.replies[call.slot] = message.SerializeToString()
            reply.observe((built - started_ns) * 1e-9)
            serialize.observe((time.perf_counter_ns() - built) * 1e-9)

    def _trace(self, launch: Launch) -> None:
        """Each traced call's spans (tracing.record_call), after the batch's replies are made."""
        computed = {call.slot: call.item for call in launch.admitted if call.rpc is not None}
        items = list(computed.values())
        tokens = sum(item.tokens.total for item in items)
        sequences = sum(item.tokens.count for item in items)
        at = launch.launched
        for slot, (method, _, waited, context) in enumerate(launch.calls):
            if context is None:
                continue
            reply = launch.replies[slot]
            code = 0 if isinstance(reply, bytes) else reply[0]
            item = computed.get(slot) if code == 0 else None
            part = None
            if item is not None:
                part = Computed(
                    at - waited,
                    at,
                    launch.computed,
                    launch.number,
                    tokens,
                    sequences,
                    item.tokens.total,
                    item.tokens.count,
                )
            carrier = (("traceparent", context[0]), ("tracestate", context[1]))
            record_call(self.tracer, method, carrier, at - waited, code, part)

    def _failed(self, admitted: list[_Admitted], replies: list[Reply], exc: Exception) -> None:
        """The engine failed the batch: INTERNAL for each request, or UNAVAILABLE once the
        device is lost (reported the first time)."""
        if isinstance(exc, DeviceLostError) or device_lost(exc):
            if self.lost is None:
                self.lost = str(exc).splitlines()[0][:300] if str(exc) else repr(exc)
                log_device_lost(exc)
                self._on_device_lost()
            code, message = _UNAVAILABLE, f"the device is lost: {self.lost}"
        else:
            log.exception("engine step failed")
            code, message = _INTERNAL, f"the engine failed: {exc}"
        for call in admitted:
            replies[call.slot] = (code, message)
            if call.probe is not None:
                resolve(call.probe, RuntimeError(message))


class Launch:
    """One batch between its launch and its replies (Batches.launch); the Rust engine thread
    asks `ready` and calls `finish` once."""

    def __init__(self, batches: Batches, calls: list[Call], launched: float) -> None:
        self.batches, self.calls, self.launched = batches, calls, launched
        self.replies: list[Reply] = [(_INTERNAL, "unanswered")] * len(calls)
        self.admitted: list[_Admitted] = []
        self.pending: Pending | None = None
        self.tokens = 0
        #: perf_counter at the step (compute_seconds), and the batch's number and monotonic end
        #: once computed (its traced calls' spans)
        self.started = 0.0
        self.number = 0
        self.computed = 0.0

    def ready(self) -> bool:
        """Whether `finish` would not wait (nothing launched, or the engine is done)."""
        return self.pending is None or self.pending.ready()

    def finish(self) -> list[Reply]:
        """Each call's serialized reply or refusal, in order, once the engine is done."""
        return self.batches._finish(self)


def unserved(model: ModelDir) -> str | None:
    """Why --front rust cannot serve this model (one line), or None."""
    tasks = sorted({rpc.task for rpc in RPCS.values()})
    if model.task not in tasks:
        return (
            f"--front rust serves {', '.join(tasks)} models; {model.name} is a {model.task} "
            "model: use --front python"
        )
    return None


def load_front(path: str) -> ModuleType:
    """The compiled extension: from `path` when given (a harness's cached build), else
    `embedfleet_front` on the Python path."""
    if not path:
        return importlib.import_module("embedfleet_front")
    spec = importlib.util.spec_from_file_location("embedfleet_front", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _prepare(settings: WorkerSettings, engine: Engine, state: WorkerState) -> Budget:
    """The Python front's start-up on its own runner, ended before the Rust engine thread
    exists (the engine allows one caller): graph capture, the warm-up (the capacity measurement
    with --capacity-measurement startup) and the self-check. Returns the batch budget, paced by
    the capacity when it was measured."""
    await warm_graphs(settings, engine)
    queue: FcfsQueue[Entry] = FcfsQueue(state.budget, settings.max_queue_requests)
    runner = BatchRunner(engine, queue, state.metrics, asyncio.get_running_loop())
    runner.start()
    state.engine, state.runner = engine, runner
    try:
        measure = settings.capacity_measurement == "startup"
        await warm_and_check(settings, state, probe_shape(engine, state.budget), measure)
    finally:
        runner.stop()
        await asyncio.to_thread(runner.join, 5.0)
    return runner.batch_budget()


def info_of(model: ModelDir, engine: Engine, budget: Budget, capacity: float) -> bytes:
    """InfoResponse's fixed fields; the extension fills in the queue and readiness per call."""
    info = engine.info
    return pb.InfoResponse(
        model_name=model.name,
        task=model.task,
        max_batch_tokens=budget.max_tokens,
        vocab_size=model.vocab_size,
        capacity_tokens_per_second=capacity,
        default_pooling=POOLING_ENUM[model.pooling],  # type: ignore[arg-type]
        default_normalize=model.normalize,
        instance=secrets.token_hex(8),
        dimensions=info.dimensions,
        max_input_tokens=info.max_input_tokens,
        dtype=info.dtype,
        device=info.device,
    ).SerializeToString()


def _on_listening(
    settings: WorkerSettings, started: float, then: Callable[[], None]
) -> Callable[[int], None]:
    def listening(port: int) -> None:
        then()
        if settings.port_file:
            write_port_file(settings.port_file, port, settings.metrics_port)
        log.info(
            "serving",
            extra={
                "port": port,
                "metrics_port": settings.metrics_port,
                "front": "rust",
                "startup_seconds": round(time.monotonic() - started, 3),
            },
        )

    return listening


def serve(settings: WorkerSettings) -> int:
    """Build, warm and measure the engine, then serve it through the Rust front until SIGTERM."""
    started = time.monotonic()
    if (opened := opening(settings)) is None:
        return 2
    receive, model = opened
    if (refusal := unserved(model)) is not None:
        log.error(refusal)
        return 2
    try:
        front = load_front(settings.front_library)
    except (ImportError, OSError) as exc:
        log.error("--front-library %s cannot be loaded: %s", settings.front_library, exc)
        return 2
    budget = budget_of(settings)
    tracer = tracing.from_settings(settings)
    metrics = worker_metrics(lambda: state.engine)
    state = WorkerState(model=model, budget=budget, metrics=metrics)
    if not serve_metrics(settings, metrics):
        return 2
    engine = load_engine(settings, model)
    state.engine = engine  # its counters and GPU memory are scraped from here on
    log.info("warming up", extra={"max_batch_tokens": budget.max_tokens})
    paced = asyncio.run(_prepare(settings, engine, state))
    heap.settle()  # the model, the tokenizer and warm-up's leftovers: never walked again
    server = front.Server(
        max_batch_tokens=paced.max_tokens,
        max_batch_sequences=paced.max_sequences,
        hard_max_tokens=paced.hard_max_tokens,
        max_queue_requests=settings.max_queue_requests,
        max_inflight_bytes=settings.max_inflight_bytes,
        request_seconds_buckets=list(front_metrics.REQUEST_SECONDS_BUCKETS),
    )
    front_metrics.watch(metrics, server.stats)
    batches = Batches(engine, budget, model, metrics, on_device_lost=server.stop, tracer=tracer)
    measured = QueueMeasured(
        server, batches.probes, lambda: batches.computed_tokens, metrics, budget
    )

    def measure() -> None:
        if settings.capacity_measurement == "background":
            start_measuring(settings, measured, probe_shape(engine, budget))

    try:
        server.serve(
            host=settings.host,
            port=settings.port,
            max_message_bytes=receive,
            drain_seconds=settings.drain_seconds,
            info=info_of(model, engine, paced, state.capacity),
            batches=batches,
            on_listening=_on_listening(settings, started, measure),
            log_level=settings.log_level,
            json_logs=logs.is_json(settings.log_format),
            traced=tracer.enabled,
        )
    except OSError:
        log.error(port_taken(settings.host, settings.port, "--port"))
        return 2
    finally:
        tracer.shutdown()
    code = 0 if batches.lost is None else DEVICE_LOST_EXIT
    log.info("stopped", extra={"exit_code": code})
    return code

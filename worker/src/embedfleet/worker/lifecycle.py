"""A worker process's life: listen (NOT_SERVING), load, warm up, self-check, serve (and measure
capacity in the background), drain, exit.

The gRPC port opens first so probes get an answer (NOT_SERVING) while weights load; the standard
grpc.health.v1 service flips to SERVING only after warm-up and the self-check passed. Capacity is
measured after that by default (warmup.py): a worker woken from zero serves the request waiting
for it first. SIGTERM (or
SIGINT) starts the drain: health goes NOT_SERVING, new requests get UNAVAILABLE, everything queued
or computing is answered, then the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from embedfleet.common import heap
from embedfleet.common.arrays import FloatArray
from embedfleet.common.modeldir import (
    ModelDir,
    ModelDirError,
    load_model_dir,
    resolve_model_path,
    weight_files,
)
from embedfleet.worker import memory, tracing
from embedfleet.worker.contract import (
    Engine,
    GraphCounters,
    GraphWarmup,
    UnservableError,
    WorkItem,
)
from embedfleet.worker.inflight import max_message_bytes, mib
from embedfleet.worker.metrics import WorkerMetrics, engine_gpu_memory
from embedfleet.worker.null_engine import NullEngine
from embedfleet.worker.runner import BatchRunner, Entry
from embedfleet.worker.scheduler import Budget, FcfsQueue, paced
from embedfleet.worker.selfcheck import ReferenceFn, reference_outputs, run_selfcheck
from embedfleet.worker.server import WorkerService, WorkerState, add_to_server
from embedfleet.worker.settings import WorkerSettings
from embedfleet.worker.warmup import (
    BUSY_PATIENCE_SECONDS,
    measure_capacity,
    warm_up,
    yields_to_traffic,
)

log = logging.getLogger(__name__)

SERVICE_NAME = "embedfleet.v1.Worker"
#: the exit status of a worker whose device was lost (a sticky CUDA error)
DEVICE_LOST_EXIT = 3
#: replies: the largest is a full request's vectors, far from this
_MAX_REPLY = 256 << 20


def budget_of(settings: WorkerSettings) -> Budget:
    hard = settings.max_request_tokens or 4 * settings.max_batch_tokens
    return Budget(settings.max_batch_tokens, settings.max_batch_sequences, hard)


def message_limit(settings: WorkerSettings) -> int:
    """The longest request message gRPC receives: one that can hold the largest request this
    worker accepts, and no more than the byte budget; raises ValueError when that budget cannot
    hold even one full batch."""
    batch = max_message_bytes(settings.max_batch_tokens)
    if settings.max_inflight_bytes < batch:
        raise ValueError(
            f"--max-inflight-bytes {settings.max_inflight_bytes} cannot hold one full batch's "
            f"message ({mib(batch)} for --max-batch-tokens {settings.max_batch_tokens})"
        )
    return min(max_message_bytes(budget_of(settings).hard_max_tokens), settings.max_inflight_bytes)


class _Health(Protocol):
    """The parts of grpc_health's asyncio servicer we use (it ships no type hints)."""

    async def set(self, service: str, status: int) -> None: ...

    async def enter_graceful_shutdown(self) -> None: ...


def build_engine(settings: WorkerSettings, model: ModelDir) -> Engine:
    if settings.engine == "null":
        return NullEngine.from_model_dir(
            model, settings.max_input_tokens or None, settings.null_tokens_per_second
        )
    from embedfleet.worker.engine.torch_engine import TorchEngine  # imports torch: only when needed

    return TorchEngine.from_settings(settings)


def reference_fn(settings: WorkerSettings) -> ReferenceFn | None:
    """The engine's float32 eager CPU path, the self-check's yardstick for uncommitted models."""
    if settings.engine == "null":
        return None
    return lambda items: reference_outputs(settings.model, items, settings.max_input_tokens)


async def _set_health(servicer: _Health, status: int) -> None:
    for name in ("", SERVICE_NAME):
        await servicer.set(name, status)


async def warm_graphs(settings: WorkerSettings, engine: Engine) -> None:
    """Capture the engine's CUDA graphs before the first request (an engine that captures none
    has no `warm_graphs`), and report what that took in one line."""
    warm: Callable[[float], GraphWarmup] | None = getattr(engine, "warm_graphs", None)
    if warm is None or settings.graph_warmup_seconds <= 0:
        return
    report = await asyncio.to_thread(warm, settings.graph_warmup_seconds)
    if not report.planned:
        return
    gpu = engine_gpu_memory(engine)
    log.info(
        "CUDA graphs captured",
        extra={
            "graphs_planned": report.planned,
            "graphs_captured": report.captured,
            "graphs_live": report.live,
            "seconds": round(report.seconds, 3),
            "budget_seconds": settings.graph_warmup_seconds,
            "capture_seconds": round(report.capture_seconds, 3),
            "graph_pool_bytes": report.pool_bytes,
            "gpu_reserved_bytes": gpu.reserved if gpu else 0,
        },
    )


def log_device_lost(error: BaseException) -> None:
    """Both fronts' one line when the engine thread finds the device lost."""
    log.error(
        "device lost: not serving; exiting to be restarted",
        extra={"error": str(error).splitlines()[0][:300] if str(error) else repr(error)},
    )


def _device_lost(state: WorkerState, lost: asyncio.Event) -> Callable[[BaseException], None]:
    """What the engine thread reports a lost device to: the worker stops being ready at once,
    and `serve` exits non-zero so the kubelet restarts it."""

    def report(error: BaseException) -> None:
        if lost.is_set():
            return
        log_device_lost(error)
        state.ready = False
        state.metrics.ready.set(0)
        lost.set()

    return report


async def _start_serving(
    settings: WorkerSettings,
    state: WorkerState,
    servicer: _Health,
    loop: asyncio.AbstractEventLoop,
    lost: asyncio.Event,
) -> None:
    t0 = time.monotonic()
    engine = await asyncio.to_thread(load_engine, settings, state.model)
    state.engine = engine  # its counters and GPU memory are scraped from here on
    log.info("warming up", extra={"max_batch_tokens": state.budget.max_tokens})
    await warm_graphs(settings, engine)  # before the engine thread: one caller at a time
    queue: FcfsQueue[Entry] = FcfsQueue(state.budget, settings.max_queue_requests)
    trimmer = memory.Trimmer.for_process(settings.malloc_trim_seconds)
    runner = BatchRunner(
        engine, queue, state.metrics, loop, trimmer, on_device_lost=_device_lost(state, lost)
    )
    runner.start()
    state.runner = runner
    shape = probe_shape(engine, state.budget)
    await warm_and_check(settings, state, shape, settings.capacity_measurement == "startup")
    heap.settle()  # the model, the tokenizer and warm-up's leftovers: never walked again
    state.ready = True
    state.metrics.ready.set(1)
    await _set_health(servicer, health_pb2.HealthCheckResponse.SERVING)
    log.info("serving", extra={"startup_seconds": round(time.monotonic() - t0, 3)})
    if settings.capacity_measurement == "background":
        try:
            await measure_in_background(settings, state, shape)
        except Exception:  # the worker serves on; capacity stays unmeasured (0)
            log.exception("capacity measurement failed")


def load_engine(settings: WorkerSettings, model: ModelDir) -> Engine:
    """`build_engine` between both fronts' progress lines: loading weights, engine loaded."""
    started = time.monotonic()
    if settings.engine != "null":
        size = sum(f.stat().st_size for f in weight_files(model.path))
        log.info(
            "loading weights",
            extra={"model": model.name, "mb": round(size / 1e6, 1), "device": settings.device},
        )
    engine = build_engine(settings, model)
    info = engine.info
    log.info(
        "engine loaded",
        extra={
            "seconds": round(time.monotonic() - started, 3),
            "device": info.device,
            "dtype": info.dtype,
        },
    )
    return engine


def probe_shape(engine: Engine, budget: Budget) -> dict[str, int]:
    """The warm-up's and the capacity probe's request shape for this engine and budget."""
    info = engine.info
    return {
        "vocab_size": info.vocab_size,
        "max_input_tokens": info.max_input_tokens,
        "max_batch_tokens": budget.max_tokens,
    }


async def warm_and_check(
    settings: WorkerSettings, state: WorkerState, shape: dict[str, int], measure: bool
) -> None:
    """Both fronts' start-up work through `state.submit` (its runner): the warm-up (the
    capacity measurement itself when `measure`), then the self-check."""
    started = time.monotonic()
    if measure:
        await _measure(settings, state, shape, stop=None)
    else:
        await warm_up(state.submit, **shape)
    log.info("warm-up done", extra={"seconds": round(time.monotonic() - started, 3)})
    if settings.engine == "null":
        log.info("self-check skipped: the null engine computes nothing to check")
        return
    result = await run_selfcheck(state.submit, state.model, reference_fn(settings))
    log.info(
        "self-check skipped" if result.skipped else "self-check passed",
        extra={"reference": result.source, "min_cosine": round(result.min_cosine, 6)},
    )


class Measured(Protocol):
    """What a capacity measurement runs through and reports to: the Python front's
    WorkerState, or the Rust front's queue (rust_capacity.py)."""

    budget: Budget
    #: set at each real request's arrival: a measurement that yields stops
    arrived: asyncio.Event

    @property
    def requests_inflight(self) -> int: ...

    async def submit(self, item: WorkItem) -> FloatArray: ...

    def computed_tokens(self) -> int: ...

    def publish(self, capacity: float, batches: Budget) -> None: ...


async def _measure(
    settings: WorkerSettings, state: Measured, shape: dict[str, int], stop: asyncio.Event | None
) -> bool:
    """One capacity measurement; publishes it and returns True unless `stop` ended it."""
    started = time.monotonic()
    capacity = await measure_capacity(
        state.submit,
        **shape,
        seconds=settings.warmup_seconds,
        computed=state.computed_tokens,
        stop=stop,
    )
    if capacity is None:
        return False
    batches = paced(state.budget, capacity, settings.max_batch_seconds)
    state.publish(capacity, batches)
    log.info(
        "capacity measured",
        extra={
            "seconds": round(time.monotonic() - started, 3),
            "capacity_tokens_per_second": round(capacity, 1),
            "batch_tokens": batches.max_tokens,
        },
    )
    return True


async def measure_in_background(
    settings: WorkerSettings, state: Measured, shape: dict[str, int]
) -> None:
    """Measures capacity once the worker has been idle for --capacity-idle-seconds, yielding to
    real requests (a stopped run waits for the next idle period) until `yields_to_traffic` says
    a run must go through them. Ends with the process (the startup task is cancelled on drain)."""
    interruptions = 0
    while True:
        idle = await _idle_for(state, settings.capacity_idle_seconds, BUSY_PATIENCE_SECONDS)
        yields = yields_to_traffic(interruptions, idle)
        state.arrived.clear()
        if await _measure(settings, state, shape, stop=state.arrived if yields else None):
            return
        interruptions += 1
        log.info("capacity measurement yielded to a request", extra={"count": interruptions})


async def _idle_for(state: Measured, seconds: float, patience: float) -> bool:
    """True once no real request has been in flight for `seconds`; False if there was no such
    period within `patience` seconds."""
    give_up = time.monotonic() + patience
    while True:
        while state.requests_inflight:
            if time.monotonic() >= give_up:
                return False
            await asyncio.sleep(0.05)
        state.arrived.clear()
        try:
            await asyncio.wait_for(state.arrived.wait(), seconds)
        except TimeoutError:
            if not state.requests_inflight:
                return True
        if time.monotonic() >= give_up:
            return False


async def _drain(
    settings: WorkerSettings, state: WorkerState, servicer: _Health, service: WorkerService
) -> None:
    state.draining = True
    state.metrics.draining.set(1)
    state.metrics.ready.set(0)
    await servicer.enter_graceful_shutdown()
    log.info("draining", extra={"inflight": state.inflight})
    deadline = time.monotonic() + settings.drain_seconds
    while state.inflight and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    if state.inflight:
        log.warning("drain timed out", extra={"inflight": state.inflight})
    # Open EmbedStreams end now rather than hold server.stop's grace period.
    service.close_streams()
    if state.runner is not None:
        state.runner.stop()
        await asyncio.to_thread(state.runner.join, 5.0)


def port_taken(host: str, port: int, flag: str) -> str:
    """What to do when `port` cannot be listened on: one line, no traceback."""
    return (
        f"cannot listen on {host}:{port} ({flag}): another process holds it; stop that process "
        f"or give {flag} a free port (0 picks one)"
    )


def worker_metrics(engine: Callable[[], Engine | None]) -> WorkerMetrics:
    """The worker's metrics; the metrics thread reads the engine's counters and GPU memory at
    scrape time, once `engine()` returns one."""

    def counters() -> GraphCounters:
        current = engine()
        return current.counters() if current is not None else GraphCounters()

    return WorkerMetrics(counters, lambda: engine_gpu_memory(engine()))


def serve_metrics(settings: WorkerSettings, metrics: WorkerMetrics) -> bool:
    """/metrics on --metrics-port (none for 0) from a thread of its own; False after logging
    why the port cannot be had."""
    if not settings.metrics_port:
        return True
    try:
        metrics.serve(settings.host, settings.metrics_port)
    except OSError:
        log.error(port_taken(settings.host, settings.metrics_port, "--metrics-port"))
        return False
    return True


def write_port_file(path: str, port: int, metrics_port: int) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps({"port": port, "metrics_port": metrics_port, "pid": os.getpid()}))
    tmp.replace(path)  # atomic: readers never see a partial file


def opening(settings: WorkerSettings) -> tuple[int, ModelDir] | None:
    """What either front does first: bound the libraries' caches, check the message limit (None
    after logging it when bad: exit 2) and read the model directory. Returns the limit and
    the model."""
    memory.bound_caches(settings.library_cache_capacity)  # before anything imports torch
    try:
        receive = message_limit(settings)
    except ValueError as exc:
        log.error("bad settings: %s", exc)
        return None
    return receive, load_model_dir(resolve_model_path(settings.model), settings.task)


async def serve(settings: WorkerSettings) -> int:
    loop = asyncio.get_running_loop()
    if (opened := opening(settings)) is None:
        return 2
    receive, model = opened
    metrics = worker_metrics(lambda: state.engine)
    tracer = tracing.from_settings(settings)
    state = WorkerState(model=model, budget=budget_of(settings), metrics=metrics, tracer=tracer)
    server = grpc.aio.server(
        interceptors=tracing.server_interceptors(tracer) or None,
        options=[
            ("grpc.so_reuseport", 0),  # a second worker on a taken port must fail, not share it
            # Longer messages are refused by gRPC before they are buffered.
            ("grpc.max_receive_message_length", receive),
            ("grpc.max_send_message_length", _MAX_REPLY),
            # Flow-control windows at gRPC's defaults: its bandwidth-delay probe grew them to
            # megabytes a stream (more the slower a busy machine answered its pings), data the
            # refusal above cannot stop; a worker's messages are kilobytes.
            ("grpc.http2.bdp_probe", 0),
        ],
    )
    service = WorkerService(state, settings.max_inflight_bytes)
    add_to_server(service, server)
    servicer: _Health = health.aio.HealthServicer()  # type: ignore[attr-defined]
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    await _set_health(servicer, health_pb2.HealthCheckResponse.NOT_SERVING)
    try:
        port = server.add_insecure_port(f"{settings.host}:{settings.port}")
    except RuntimeError:  # gRPC's message only says to set GRPC_VERBOSITY
        log.error(port_taken(settings.host, settings.port, "--port"))
        return 2
    if not serve_metrics(settings, metrics):
        return 2
    await server.start()
    if settings.port_file:
        write_port_file(settings.port_file, port, settings.metrics_port)
    log.info("listening", extra={"port": port, "metrics_port": settings.metrics_port})

    stop, lost = asyncio.Event(), asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    startup = asyncio.create_task(_start_serving(settings, state, servicer, loop, lost))
    stopping = asyncio.create_task(stop.wait())
    losing = asyncio.create_task(lost.wait())
    await asyncio.wait({startup, stopping, losing}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if startup.done() and (failure := startup.exception()) is not None:
        if isinstance(failure, UnservableError | ModelDirError):  # what to change, not a bug
            log.error("start-up failed: %s", failure, extra={"error": type(failure).__name__})
        else:
            log.error("start-up failed", exc_info=failure)
        code = 1
    else:
        await asyncio.wait({stopping, losing}, return_when=asyncio.FIRST_COMPLETED)
        if not startup.done():
            startup.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await startup
    if lost.is_set():
        await _set_health(servicer, health_pb2.HealthCheckResponse.NOT_SERVING)
        code = DEVICE_LOST_EXIT
    stopping.cancel()
    losing.cancel()
    await _drain(settings, state, servicer, service)
    await server.stop(grace=1.0)
    tracer.shutdown()
    log.info("stopped", extra={"exit_code": code})
    return code

"""`embedfleet-worker --front rust`: the worker's gRPC front in Rust (worker-front/, the
`embedfleet_front` extension), hosting this process's engine.

The engine is built, warmed up and self-checked here with the Python worker's own code; then
`embedfleet_front.serve` takes the thread: a tonic server with the FCFS queue and byte budget,
and one Rust thread that calls `Batches` once per batch. Each request's options, checks and
reply are the Python front's functions (server.py), so both fronts answer alike.
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
from embedfleet.worker.contract import Engine, Options, WorkItem
from embedfleet.worker.lifecycle import (
    budget_of,
    build_engine,
    opening,
    port_taken,
    reference_fn,
    warm_graphs,
    write_port_file,
)
from embedfleet.worker.scheduler import Budget
from embedfleet.worker.selfcheck import run_selfcheck
from embedfleet.worker.server import (
    POOLING_ENUM,
    Served,
    StatusError,
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
from embedfleet.worker.warmup import warm_up

log = logging.getLogger(__name__)

#: what the extension's batch callable returns per request: the serialized reply, or a refusal
Reply = bytes | tuple[int, str]
_INVALID = grpc.StatusCode.INVALID_ARGUMENT.value[0]
_INTERNAL = grpc.StatusCode.INTERNAL.value[0]


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


class Batches:
    """The Rust engine thread's one Python call per batch: (method, serialized request) pairs
    in, each one's serialized reply (or its refusal) out, in order."""

    def __init__(self, engine: Engine, budget: Budget, model: ModelDir) -> None:
        self.engine = engine
        self.budget = budget
        self.task = model.task
        self.served = served_by(model, engine)

    def __call__(self, calls: list[tuple[str, bytes]]) -> list[Reply]:
        replies: list[Reply] = [(_INTERNAL, "unanswered")] * len(calls)
        admitted: list[tuple[int, Rpc, Any, WorkItem]] = []
        for slot, (method, data) in enumerate(calls):
            rpc = RPCS[method]
            try:
                check_task(self.task, rpc.task)
                request = rpc.request(data)
                item = work_item(request.batch, rpc.options(request), self.budget, self.engine)
            except DecodeError as exc:
                replies[slot] = (_INVALID, malformed_message(method, str(exc) or "undecodable"))
            except StatusError as exc:
                replies[slot] = (exc.code.value[0], exc.message)
            else:
                admitted.append((slot, rpc, request, item))
        if not admitted:
            return replies
        try:
            results = self.engine.step([item for *_, item in admitted]).wait()
        except Exception as exc:
            log.exception("engine step failed")
            for slot, *_ in admitted:
                replies[slot] = (_INTERNAL, f"the engine failed: {exc}")
            return replies
        for (slot, rpc, request, item), result in zip(admitted, results, strict=True):
            replies[slot] = rpc.reply(request, result, item, self.served).SerializeToString()
        return replies


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


async def _prepare(settings: WorkerSettings, engine: Engine, model: ModelDir) -> None:
    """Warm-up and the self-check, as the Python front's start-up runs them, each item computed
    here before the Rust engine thread exists (the engine allows one caller)."""

    async def submit(item: WorkItem) -> FloatArray:
        return engine.step([item]).wait()[0]

    await warm_graphs(settings, engine)
    info = engine.info
    await warm_up(
        submit,
        vocab_size=info.vocab_size,
        max_input_tokens=info.max_input_tokens,
        max_batch_tokens=settings.max_batch_tokens,
    )
    if settings.engine != "null":
        result = await run_selfcheck(submit, model, reference_fn(settings))
        log.info(
            "self-check skipped" if result.skipped else "self-check passed",
            extra={"reference": result.source, "min_cosine": round(result.min_cosine, 6)},
        )


def info_of(model: ModelDir, engine: Engine, budget: Budget) -> bytes:
    """InfoResponse's fixed fields; the extension fills in the queue and readiness per call."""
    info = engine.info
    return pb.InfoResponse(
        model_name=model.name,
        task=model.task,
        max_batch_tokens=budget.max_tokens,
        vocab_size=model.vocab_size,
        default_pooling=POOLING_ENUM[model.pooling],  # type: ignore[arg-type]
        default_normalize=model.normalize,
        instance=secrets.token_hex(8),
        dimensions=info.dimensions,
        max_input_tokens=info.max_input_tokens,
        dtype=info.dtype,
        device=info.device,
    ).SerializeToString()


def _on_listening(settings: WorkerSettings, started: float) -> Callable[[int], None]:
    def listening(port: int) -> None:
        if settings.port_file:
            write_port_file(settings.port_file, port, 0)
        log.info(
            "serving",
            extra={
                "port": port,
                "front": "rust",
                "startup_seconds": round(time.monotonic() - started, 3),
            },
        )

    return listening


def serve(settings: WorkerSettings) -> int:
    """Build and warm the engine, then serve it through the Rust front until SIGTERM."""
    started = time.monotonic()
    if (opened := opening(settings)) is None:
        return 2
    receive, model = opened
    if (refusal := unserved(model)) is not None:
        log.error(refusal)
        return 2
    front = load_front(settings.front_library)
    if settings.metrics_port:
        log.warning("--front rust serves no /metrics yet", extra={"metrics_port": 0})
    engine = build_engine(settings, model)
    asyncio.run(_prepare(settings, engine, model))
    heap.settle()  # the model, the tokenizer and warm-up's leftovers: never walked again
    budget = budget_of(settings)
    try:
        front.serve(
            host=settings.host,
            port=settings.port,
            max_batch_tokens=budget.max_tokens,
            max_batch_sequences=budget.max_sequences,
            hard_max_tokens=budget.hard_max_tokens,
            max_queue_requests=settings.max_queue_requests,
            max_inflight_bytes=settings.max_inflight_bytes,
            max_message_bytes=receive,
            drain_seconds=settings.drain_seconds,
            info=info_of(model, engine, budget),
            run_batch=Batches(engine, budget, model),
            on_listening=_on_listening(settings, started),
            log_level=settings.log_level,
            json_logs=logs.is_json(settings.log_format),
        )
    except OSError:
        log.error(port_taken(settings.host, settings.port, "--port"))
        return 2
    log.info("stopped", extra={"exit_code": 0})
    return 0

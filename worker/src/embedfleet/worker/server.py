"""The worker's gRPC service (asyncio): admission, status codes and replies.

Handlers only decode, validate and queue; the engine thread (runner.py) does the compute. A request
is refused at admission rather than failing later: malformed or out-of-range input ->
INVALID_ARGUMENT, a full queue or too many request bytes held (inflight.py) ->
RESOURCE_EXHAUSTED, warming up or draining -> UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import grpc
import numpy as np
from google.protobuf.message import DecodeError, Message

from embedfleet.common.arrays import FloatArray
from embedfleet.common.codec import FLOAT_DTYPES, CodecError, pack_floats, unpack_tokens
from embedfleet.common.logs import LogLimiter
from embedfleet.common.modeldir import ModelDir, Pooling
from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.common.proto import embedfleet_pb2_grpc as pb_grpc
from embedfleet.common.tracing import OFF, Tracer
from embedfleet.worker.contract import (
    HYBRID_OUTPUTS,
    Engine,
    EngineInfo,
    HybridOutput,
    InvalidInputError,
    Options,
    WorkItem,
    hybrid_parts,
)
from embedfleet.worker.inflight import ByteBudget, Ticket
from embedfleet.worker.metrics import WorkerMetrics
from embedfleet.worker.runner import (
    BatchRunner,
    DeviceLostError,
    DroppedError,
    EngineError,
    Entry,
)
from embedfleet.worker.scheduler import Admission, Budget, DropReason, QueueFullError, admit
from embedfleet.worker.sparse import sparsify
from embedfleet.worker.tracing import record_batch

Code = grpc.StatusCode

_POOLING: dict[int, Pooling | None] = {
    pb.POOLING_DEFAULT: None,
    pb.POOLING_MEAN: "mean",
    pb.POOLING_CLS: "cls",
    pb.POOLING_LAST_TOKEN: "last_token",
    pb.POOLING_MAX: "max",
    pb.POOLING_WEIGHTED_MEAN: "weighted_mean",
    pb.POOLING_MEAN_SQRT_LEN: "mean_sqrt_len",
}
POOLING_ENUM = {v: k for k, v in _POOLING.items() if v is not None}
_TASKS = {
    "Embed": "embed",
    "Score": "score",
    "Classify": "classify",
    "SparseEmbed": "sparse",
    "MultiVectorEmbed": "multivector",
    "HybridEmbed": "hybrid",
}
R = TypeVar("R")


class Observer(Protocol):
    """One stage's histogram (a child of embedfleet_worker_stage_seconds)."""

    def observe(self, amount: float) -> None: ...


class _Unobserved:
    """The stage of a call that is no request's work (Info, the gateway's probe)."""

    def observe(self, amount: float) -> None:
        return None


_UNOBSERVED = _Unobserved()
M = TypeVar("M", bound=Message)
log = logging.getLogger(__name__)
#: one log line per this many seconds about undecodable messages, however many arrive
MALFORMED_LOG_SECONDS = 10.0


class StatusError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class WorkerState:
    """What the handlers and the lifecycle share; mutated on the event loop only."""

    model: ModelDir
    budget: Budget
    metrics: WorkerMetrics
    engine: Engine | None = None
    runner: BatchRunner | None = None
    ready: bool = False
    draining: bool = False
    capacity: float = 0.0
    inflight: int = field(default=0)
    #: real requests in flight (warm-up, self-check and capacity work aside), and an event set
    #: at each one's arrival: the background capacity measurement yields to them
    requests_inflight: int = 0
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    tracer: Tracer = OFF

    async def compute(
        self, item: WorkItem, deadline: float = math.inf, internal: bool = False
    ) -> Entry:
        """Queue `item` on the serving path and wait for its result (also used by warm-up)."""
        if self.runner is None:
            raise StatusError(Code.UNAVAILABLE, "the engine is still loading")
        entry = self.runner.submit(item, deadline, internal)
        self.inflight += 1
        if not internal:
            self.requests_inflight += 1
            self.arrived.set()
        try:
            await entry.future
        except asyncio.CancelledError:
            # Marks it for the engine thread, which drops it before compute if not yet launched.
            entry.cancelled = True
            raise
        finally:
            self.inflight -= 1
            if not internal:
                self.requests_inflight -= 1
        if self.tracer.enabled and not internal:
            record_batch(self.tracer, entry)
        return entry

    async def submit(self, item: WorkItem) -> FloatArray:
        """The warm-up's and self-check's way in: the serving path, not counted as served."""
        entry = await self.compute(item, internal=True)
        return entry.future.result()

    def computed_tokens(self) -> int:
        """Tokens the engine has computed so far, any request's."""
        return self.runner.computed_tokens if self.runner is not None else 0

    def publish(self, capacity: float, batches: Budget) -> None:
        """The capacity measured (Info, the capacity metric) and the batch budget it paces."""
        self.capacity = capacity
        self.metrics.capacity.set(capacity)
        if self.runner is not None:
            self.runner.set_batch_budget(batches)


@dataclass(frozen=True, slots=True)
class Malformed:
    """What the deserializer hands a handler for bytes that are no protobuf message."""

    detail: str


@dataclass(frozen=True, slots=True)
class Refused:
    """What the deserializer hands a handler for a message it did not parse: too many bytes held."""

    detail: str


@dataclass(frozen=True, slots=True)
class Admitted(Generic[M]):
    """A parsed message with its share of the worker's byte budget, held until the call ends."""

    message: M
    ticket: Ticket


def _admitting(
    parse: Callable[[bytes], M], budget: ByteBudget, stage: Observer
) -> Callable[[bytes], Admitted[M] | Malformed | Refused]:
    """gRPC's deserializer, but a message past the byte budget is left unparsed and undecodable
    bytes become a value instead of an exception (which grpc would answer with UNKNOWN and log
    with a traceback, once per message)."""

    def deserialize(data: bytes) -> Admitted[M] | Malformed | Refused:
        ticket = budget.take(len(data))
        if ticket is None:
            return Refused(budget.refusal(len(data)))
        started = time.perf_counter_ns()
        try:
            message = parse(data)
        except DecodeError as exc:
            ticket.release()
            return Malformed(str(exc) or "undecodable message")
        stage.observe((time.perf_counter_ns() - started) * 1e-9)
        return Admitted(message, ticket)

    return deserialize


def _timed(serialize: Callable[[Any], bytes], stage: Observer) -> Callable[[Any], bytes]:
    """gRPC's serializer, its time observed as the `serialize` stage."""

    def timed(message: Any) -> bytes:
        started = time.perf_counter_ns()
        data = serialize(message)
        stage.observe((time.perf_counter_ns() - started) * 1e-9)
        return data

    return timed


class WorkerService(pb_grpc.WorkerServicer):
    def __init__(self, state: WorkerState, max_inflight_bytes: int) -> None:
        self.state = state
        self.bytes = ByteBudget(max_inflight_bytes)
        # Gauges of counts the loop keeps anyway are read at scrape time, not written per call.
        state.metrics.request_bytes.set_function(lambda: self.bytes.held)
        state.metrics.inflight.set_function(lambda: state.inflight)
        self._stages = state.metrics.stages
        self._malformed_log = LogLimiter(MALFORMED_LOG_SECONDS)
        #: InfoResponse.instance: random, so a restart at the same address and pid still differs
        self._instance = secrets.token_hex(8)
        #: (rpc, code) -> its request counter child, resolved once (a label lookup per call
        #: took a lock and built a key; the series are few: the RPCs times the codes)
        self._counted: dict[tuple[str, grpc.StatusCode], Any] = {}
        #: the reply queues of the EmbedStream calls open now (close_streams ends them)
        self._streams: set[asyncio.Queue[Any]] = set()

    async def refuse_overload(
        self, rpc: str, request: Refused, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        # Not logged: the count is in embedfleet_worker_requests_total, and a line per refusal
        # would be a log flood on demand.
        self._record(rpc, Code.RESOURCE_EXHAUSTED, None)
        await context.abort(Code.RESOURCE_EXHAUSTED, request.detail)

    async def refuse_malformed(
        self, rpc: str, request: Malformed, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        self._record(rpc, Code.INVALID_ARGUMENT, None)
        held = self._malformed_log.allow(time.monotonic())
        if held is not None:
            log.warning(
                "undecodable request message",
                extra={"rpc": rpc, "detail": request.detail, "since_last_line": held},
            )
        await context.abort(Code.INVALID_ARGUMENT, malformed_message(rpc, request.detail))

    async def Embed(  # noqa: N802 - gRPC method names
        self,
        request: pb.EmbedRequest,
        context: grpc.aio.ServicerContext[pb.EmbedRequest, pb.EmbedResponse],
    ) -> pb.EmbedResponse:
        return await self._serve(
            "Embed",
            request.batch,
            lambda: embed_options(request),
            lambda entry: _embed_response(request, entry),
            context,
        )

    async def EmbedStream(  # noqa: N802 - gRPC method names
        self,
        calls: AsyncIterator[Admitted[pb.EmbedCall] | Malformed | Refused],
        context: grpc.aio.ServicerContext[Any, pb.EmbedReply],
    ) -> AsyncIterator[pb.EmbedReply]:
        """Embed calls as messages of one stream, each answered by id as it completes (in any
        order), with the status its unary call would have had. A message that cannot be read
        (undecodable, or past the byte budget) ends the stream with that status: its id is
        unknown, so the caller fails every call it has in flight on the stream, as it would if
        the connection broke. The stream ends when the caller stops writing and every call is
        answered, or once the worker has drained (`close_streams`)."""
        replies: asyncio.Queue[pb.EmbedReply | Malformed | Refused | None] = asyncio.Queue()
        answering: set[asyncio.Task[None]] = set()
        self._streams.add(replies)
        self.state.metrics.streams.inc()

        async def answer(call: Admitted[pb.EmbedCall]) -> None:
            replies.put_nowait(await self._answer_call(call.message))

        async def read() -> None:
            try:
                async for call in calls:
                    if not isinstance(call, Admitted):
                        replies.put_nowait(call)
                        return
                    task = asyncio.create_task(answer(call))
                    answering.add(task)
                    task.add_done_callback(answering.discard)
                    # A callback, not a finally: a task cancelled before its first step runs none.
                    task.add_done_callback(_releasing(call.ticket))
                while answering:
                    await asyncio.wait(set(answering))
            finally:
                # However reading ends (the caller done, or the read failing), the replies do.
                replies.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (reply := await replies.get()) is not None:
                if isinstance(reply, Malformed):
                    await self.refuse_malformed("EmbedStream", reply, context)
                elif isinstance(reply, Refused):
                    await self.refuse_overload("EmbedStream", reply, context)
                else:
                    yield reply
        finally:
            self._streams.discard(replies)
            self.state.metrics.streams.dec()
            reader.cancel()
            for task in list(answering):
                task.cancel()

    def close_streams(self) -> None:
        """Ends every open EmbedStream once its calls are answered (the drain: the callers
        then reach other workers; a call on a stream while draining is refused UNAVAILABLE)."""
        for replies in self._streams:
            replies.put_nowait(None)

    async def _answer_call(self, call: pb.EmbedCall) -> pb.EmbedReply:
        """One EmbedStream message's reply: Embed's work, outcome counted as an Embed call."""
        request = call.request
        deadline = time.monotonic() + call.timeout_seconds if call.timeout_seconds > 0 else math.inf
        try:
            response, _ = await self._answered(
                "Embed",
                request.batch,
                lambda: embed_options(request),
                lambda entry: _embed_response(request, entry),
                deadline,
                # Cancelled with its stream (the caller gone, or the server stopping), as a
                # unary call would be when its caller leaves.
                lambda: Code.CANCELLED,
            )
        except StatusError as failure:
            code: int = failure.code.value[0]
            return pb.EmbedReply(id=call.id, code=code, message=failure.message)
        return pb.EmbedReply(id=call.id, response=response)

    async def Score(  # noqa: N802 - gRPC method names
        self,
        request: pb.ScoreRequest,
        context: grpc.aio.ServicerContext[pb.ScoreRequest, pb.ScoreResponse],
    ) -> pb.ScoreResponse:
        def reply(entry: Entry) -> pb.ScoreResponse:
            return score_response(request, entry.future.result(), entry.item)

        options = score_options(request)
        return await self._serve("Score", request.batch, lambda: options, reply, context)

    async def Classify(  # noqa: N802 - gRPC method names
        self,
        request: pb.ClassifyRequest,
        context: grpc.aio.ServicerContext[pb.ClassifyRequest, pb.ClassifyResponse],
    ) -> pb.ClassifyResponse:
        def reply(entry: Entry) -> pb.ClassifyResponse:
            return classify_response(request, entry.future.result(), entry.item)

        options = score_options(request)
        return await self._serve("Classify", request.batch, lambda: options, reply, context)

    async def SparseEmbed(  # noqa: N802 - gRPC method names
        self,
        request: pb.SparseEmbedRequest,
        context: grpc.aio.ServicerContext[pb.SparseEmbedRequest, pb.SparseEmbedResponse],
    ) -> pb.SparseEmbedResponse:
        def reply(entry: Entry) -> pb.SparseEmbedResponse:
            return sparse_embed_response(request, entry.future.result(), entry.item)

        return await self._serve(
            "SparseEmbed", request.batch, lambda: sparse_options(request), reply, context
        )

    async def MultiVectorEmbed(  # noqa: N802 - gRPC method names
        self,
        request: pb.MultiVectorEmbedRequest,
        context: grpc.aio.ServicerContext[pb.MultiVectorEmbedRequest, pb.MultiVectorEmbedResponse],
    ) -> pb.MultiVectorEmbedResponse:
        def reply(entry: Entry) -> pb.MultiVectorEmbedResponse:
            served = self._served()
            return multi_vector_embed_response(request, entry.future.result(), entry.item, served)

        return await self._serve(
            "MultiVectorEmbed", request.batch, lambda: multi_vector_options(request), reply, context
        )

    async def HybridEmbed(  # noqa: N802 - gRPC method names
        self,
        request: pb.HybridEmbedRequest,
        context: grpc.aio.ServicerContext[pb.HybridEmbedRequest, pb.HybridEmbedResponse],
    ) -> pb.HybridEmbedResponse:
        def reply(entry: Entry) -> pb.HybridEmbedResponse:
            served = self._served()
            return hybrid_embed_response(request, entry.future.result(), entry.item, served)

        return await self._serve(
            "HybridEmbed", request.batch, lambda: hybrid_options(request), reply, context
        )

    async def Info(  # noqa: N802 - gRPC method names
        self,
        request: pb.InfoRequest,
        context: grpc.aio.ServicerContext[pb.InfoRequest, pb.InfoResponse],
    ) -> pb.InfoResponse:
        state = self.state
        runner = state.runner
        queued_requests, queued_tokens = runner.queued() if runner else (0, 0)
        budget = runner.batch_budget() if runner else state.budget
        reply = pb.InfoResponse(
            model_name=state.model.name,
            task=state.model.task,
            max_batch_tokens=budget.max_tokens,
            vocab_size=state.model.vocab_size,
            capacity_tokens_per_second=state.capacity,
            saturated_tokens_per_second=runner.saturated_rate if runner else 0.0,
            default_pooling=POOLING_ENUM[state.model.pooling],  # type: ignore[arg-type]
            default_normalize=state.model.normalize,
            queued_requests=queued_requests,
            queued_tokens=queued_tokens,
            ready=state.ready and not state.draining,
            draining=state.draining,
            instance=self._instance,
        )
        if state.engine is not None:
            info = state.engine.info
            reply.dimensions = info.dimensions
            reply.max_input_tokens = info.max_input_tokens
            reply.dtype = info.dtype
            reply.device = info.device
        self._record("Info", Code.OK, None)
        return reply

    # --- helpers -----------------------------------------------------------------------------

    async def _serve(
        self,
        rpc: str,
        batch: pb.TokenBatch,
        options: Callable[[], Options],
        reply: Callable[[Entry], R],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> R:
        """A unary call's `_answered`, its failure the call's status and its batch in the
        trailing metadata."""
        remaining = context.time_remaining()
        deadline = math.inf if remaining is None else time.monotonic() + remaining
        try:
            answer, entry = await self._answered(
                rpc, batch, options, reply, deadline, lambda: _cancel_code(context)
            )
        except StatusError as failure:
            await context.abort(failure.code, failure.message)
            raise AssertionError("unreachable: abort raises") from None
        context.set_trailing_metadata(
            (("embedfleet-batch", str(entry.batch_no)), ("embedfleet-arrival", str(entry.seq)))
        )
        return answer

    async def _answered(
        self,
        rpc: str,
        batch: pb.TokenBatch,
        options: Callable[[], Options],
        reply: Callable[[Entry], R],
        deadline: float,
        cancel_code: Callable[[], grpc.StatusCode] | None,
    ) -> tuple[R, Entry]:
        """Admission, queueing and the reply, shared by every RPC and EmbedStream's calls;
        counts the outcome (a failure is raised as StatusError; a cancellation is counted with
        `cancel_code()` when given).

        Each outcome is counted before the client can see it, so a client that reads the metrics
        right after its answer finds its own call counted."""
        started = time.perf_counter()
        try:
            self._check_task(_TASKS[rpc])
            entry = await self._run(batch, options(), deadline)
            replying = time.perf_counter_ns()
            answer = reply(entry)
            self._stages["reply"].observe((time.perf_counter_ns() - replying) * 1e-9)
        except StatusError as failure:
            self._record(rpc, failure.code, started)
            raise
        except asyncio.CancelledError:
            if cancel_code is not None:
                self._record(rpc, cancel_code(), started)
            raise
        self._record(rpc, Code.OK, started)
        return answer, entry

    def _served(self) -> Served:
        engine = self.state.engine
        assert engine is not None  # a request ran on it
        return served_by(self.state.model, engine)

    def _check_task(self, task: str) -> None:
        check_task(self.state.model.task, task)

    async def _run(self, batch: pb.TokenBatch, options: Options, deadline: float) -> Entry:
        validating = time.perf_counter_ns()
        state = self.state
        if state.draining:
            raise StatusError(Code.UNAVAILABLE, "the worker is draining")
        if not state.ready or state.engine is None:
            raise StatusError(Code.UNAVAILABLE, "the worker is warming up")
        item = work_item(batch, options, state.budget, state.engine)
        self._stages["validate"].observe((time.perf_counter_ns() - validating) * 1e-9)
        try:
            entry = await state.compute(item, deadline)
        except QueueFullError as exc:
            raise StatusError(
                Code.RESOURCE_EXHAUSTED, f"the worker's queue is full: {exc}"
            ) from None
        except DroppedError as exc:
            if exc.reason is DropReason.DEADLINE:
                raise StatusError(Code.DEADLINE_EXCEEDED, "deadline passed while queued") from None
            raise StatusError(Code.CANCELLED, "cancelled while queued") from None
        except DeviceLostError as exc:
            # UNAVAILABLE, as a draining worker's: the gateway retries elsewhere while this
            # worker exits to be restarted.
            raise StatusError(Code.UNAVAILABLE, str(exc)) from None
        except EngineError as exc:
            raise StatusError(Code.INTERNAL, f"the engine failed: {exc}") from None
        return entry

    def _record(self, rpc: str, code: grpc.StatusCode, started: float | None) -> None:
        metrics = self.state.metrics
        counter = self._counted.get((rpc, code))
        if counter is None:
            counter = self._counted[(rpc, code)] = metrics.requests.labels(rpc, code.name)
        counter.inc()
        if started is not None:
            metrics.request.observe(time.perf_counter() - started)


def check_task(own: str, task: str) -> None:
    """FAILED_PRECONDITION unless a worker serving an `own` model can do `task`."""
    # A hybrid model's dense vector is an embedder's: it answers Embed with that alone.
    if own != task and (own, task) != ("hybrid", "embed"):
        raise StatusError(
            Code.FAILED_PRECONDITION, f"this worker serves a {own} model; it cannot {task}"
        )


def work_item(batch: pb.TokenBatch, options: Options, budget: Budget, engine: Engine) -> WorkItem:
    """A request's work for the engine, or StatusError(INVALID_ARGUMENT) saying what is wrong
    with it (both fronts' checks: the Rust front calls this per batch)."""
    try:
        tokens = unpack_tokens(batch)
    except CodecError as exc:
        raise StatusError(Code.INVALID_ARGUMENT, f"malformed token batch: {exc}") from None
    if admit(tokens.total, tokens.count, budget) is Admission.REJECT:
        raise StatusError(
            Code.INVALID_ARGUMENT,
            f"the request has {tokens.total} tokens; the limit is {budget.hard_max_tokens}",
        )
    dims = engine.info.dimensions
    if options.dimensions > dims:
        raise StatusError(
            Code.INVALID_ARGUMENT, f"dimensions {options.dimensions} exceeds the model's {dims}"
        )
    item = WorkItem(tokens, options)
    try:
        engine.validate(item)
    except InvalidInputError as exc:
        raise StatusError(Code.INVALID_ARGUMENT, str(exc)) from None
    return item


def malformed_message(rpc: str, detail: str) -> str:
    return f"malformed {rpc} request: {detail}"


def _check_format(fmt: int) -> None:
    if fmt not in FLOAT_DTYPES:
        raise StatusError(Code.INVALID_ARGUMENT, f"unknown float format {fmt}")


def embed_options(request: pb.EmbedRequest) -> Options:
    _check_format(request.format)
    if request.pooling not in _POOLING:
        raise StatusError(Code.INVALID_ARGUMENT, f"unknown pooling {request.pooling}")
    return Options(
        pooling=_POOLING[request.pooling],
        normalize=request.normalize if request.HasField("normalize") else None,
        dimensions=int(request.dimensions),
    )


def _embed_response(request: pb.EmbedRequest, entry: Entry) -> pb.EmbedResponse:
    return embed_response(request, entry.future.result(), entry.item)


def embed_response(
    request: pb.EmbedRequest, result: FloatArray, item: WorkItem
) -> pb.EmbedResponse:
    # [count, dimensions]; a hybrid model's come as its flat row of that one output.
    rows = result.reshape(item.tokens.count, -1)
    return _dense_response(rows, request.format, item.tokens.total)


def _dense_response(rows: FloatArray, fmt: pb.FloatFormat, tokens: int) -> pb.EmbedResponse:
    return pb.EmbedResponse(
        embeddings=pack_floats(rows, fmt),
        count=int(rows.shape[0]),
        dimensions=int(rows.shape[1]),
        format=fmt,
        prompt_tokens=tokens,
    )


def score_options(request: pb.ScoreRequest | pb.ClassifyRequest) -> Options:
    return Options(activate=request.activate)


def score_response(
    request: pb.ScoreRequest, result: FloatArray, item: WorkItem
) -> pb.ScoreResponse:
    return pb.ScoreResponse(
        scores=pack_floats(result.reshape(-1)),
        count=int(result.size),
        prompt_tokens=item.tokens.total,
    )


def classify_response(
    request: pb.ClassifyRequest, result: FloatArray, item: WorkItem
) -> pb.ClassifyResponse:
    # [count, labels]
    return pb.ClassifyResponse(
        scores=pack_floats(result),
        count=int(result.shape[0]),
        labels=int(result.shape[1]),
        prompt_tokens=item.tokens.total,
    )


def sparse_options(request: pb.SparseEmbedRequest) -> Options:
    _check_threshold(request.threshold)
    return Options()


def sparse_embed_response(
    request: pb.SparseEmbedRequest, result: FloatArray, item: WorkItem
) -> pb.SparseEmbedResponse:
    # [count, vocab], dense
    return _sparse_response(result, request, item.tokens.total)


@dataclass(frozen=True, slots=True)
class Served:
    """What the multi-vector and hybrid replies need of the model being served."""

    info: EngineInfo
    #: the leading tokens of each sequence that get no per-token vector (bge-m3: its CLS)
    skip: int


def served_by(model: ModelDir, engine: Engine) -> Served:
    layout = model.multivector
    return Served(engine.info, layout.skip if layout is not None else 0)


def multi_vector_options(request: pb.MultiVectorEmbedRequest) -> Options:
    _check_format(request.format)
    return Options()


def multi_vector_embed_response(
    request: pb.MultiVectorEmbedRequest, result: FloatArray, item: WorkItem, served: Served
) -> pb.MultiVectorEmbedResponse:
    # [vectors, dimensions], every sequence's in order
    return _multi_vector_response(result, item, served.skip, request.format)


def _hybrid_outputs(request: pb.HybridEmbedRequest) -> frozenset[HybridOutput]:
    asked = frozenset(name for name in HYBRID_OUTPUTS if getattr(request, name))
    return asked or frozenset(HYBRID_OUTPUTS)  # none set asks for all three


def hybrid_options(request: pb.HybridEmbedRequest) -> Options:
    _check_format(request.format)
    _check_threshold(request.threshold)
    return Options(outputs=_hybrid_outputs(request))


def hybrid_embed_response(
    request: pb.HybridEmbedRequest, result: FloatArray, item: WorkItem, served: Served
) -> pb.HybridEmbedResponse:
    tokens = item.tokens.total
    parts = hybrid_parts(result, item.tokens.count, served.info, _hybrid_outputs(request))
    out = pb.HybridEmbedResponse(prompt_tokens=tokens)
    if "dense" in parts:
        out.dense.CopyFrom(_dense_response(parts["dense"], request.format, tokens))
    if "sparse" in parts:
        out.sparse.CopyFrom(_sparse_response(parts["sparse"], request, tokens))
    if "multi_vector" in parts:
        vectors = parts["multi_vector"]
        out.multi_vector.CopyFrom(
            _multi_vector_response(vectors, item, served.skip, request.format)
        )
    return out


def _check_threshold(threshold: float) -> None:
    if not math.isfinite(threshold) or threshold < 0:
        raise StatusError(Code.INVALID_ARGUMENT, f"threshold must be >= 0, got {threshold}")


def _sparse_response(
    rows: FloatArray, request: pb.SparseEmbedRequest | pb.HybridEmbedRequest, tokens: int
) -> pb.SparseEmbedResponse:
    """`rows` [count, vocab] (dense, zeros for absent ids) as SparseEmbed replies them."""
    sparse = sparsify(rows, int(request.top_k), float(request.threshold))
    return pb.SparseEmbedResponse(
        offsets=sparse.offsets.astype("<i4").tobytes(),
        indices=sparse.indices.astype("<i4").tobytes(),
        values=pack_floats(sparse.values),
        count=int(rows.shape[0]),
        dimensions=int(rows.shape[1]),
        prompt_tokens=tokens,
    )


def _multi_vector_response(
    vectors: FloatArray, item: WorkItem, skip: int, fmt: pb.FloatFormat
) -> pb.MultiVectorEmbedResponse:
    """The item's token `vectors` [vectors, dimensions] as MultiVectorEmbed replies them, each
    sequence's first `skip` tokens having none."""
    counts = np.maximum(item.tokens.lengths.astype(np.int64) - skip, 0)
    offsets = np.zeros(counts.size + 1, "<i4")
    np.cumsum(counts, out=offsets[1:])
    return pb.MultiVectorEmbedResponse(
        vectors=pack_floats(vectors, fmt),
        offsets=offsets.tobytes(),
        count=int(counts.size),
        dimensions=int(vectors.shape[1]),
        format=fmt,
        prompt_tokens=item.tokens.total,
    )


def _releasing(ticket: Ticket) -> Callable[[object], None]:
    def release(_: object) -> None:
        ticket.release()

    return release


def _cancel_code(context: grpc.aio.ServicerContext[Any, Any]) -> grpc.StatusCode:
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        return Code.DEADLINE_EXCEEDED
    return Code.CANCELLED


def _guarded(
    service: WorkerService,
    rpc: str,
    handler: Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]],
) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]:
    async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if isinstance(request, Malformed):
            await service.refuse_malformed(rpc, request, context)
        if isinstance(request, Refused):
            await service.refuse_overload(rpc, request, context)
        try:
            return await handler(request.message, context)
        finally:
            request.ticket.release()

    return handle


def add_to_server(service: WorkerService, server: grpc.aio.Server) -> None:
    """Register the Worker service as the generated code would, but with deserializers that count
    each message against the service's byte budget (RESOURCE_EXHAUSTED past it) and turn
    undecodable bytes into INVALID_ARGUMENT with one rate-limited log line."""
    methods: dict[str, tuple[Any, Callable[[bytes], Any], Callable[[Any], bytes]]] = {
        "Embed": (service.Embed, pb.EmbedRequest.FromString, pb.EmbedResponse.SerializeToString),
        "Score": (service.Score, pb.ScoreRequest.FromString, pb.ScoreResponse.SerializeToString),
        "Info": (service.Info, pb.InfoRequest.FromString, pb.InfoResponse.SerializeToString),
        "Classify": (
            service.Classify,
            pb.ClassifyRequest.FromString,
            pb.ClassifyResponse.SerializeToString,
        ),
        "SparseEmbed": (
            service.SparseEmbed,
            pb.SparseEmbedRequest.FromString,
            pb.SparseEmbedResponse.SerializeToString,
        ),
        "MultiVectorEmbed": (
            service.MultiVectorEmbed,
            pb.MultiVectorEmbedRequest.FromString,
            pb.MultiVectorEmbedResponse.SerializeToString,
        ),
        "HybridEmbed": (
            service.HybridEmbed,
            pb.HybridEmbedRequest.FromString,
            pb.HybridEmbedResponse.SerializeToString,
        ),
    }
    stages = service.state.metrics.stages

    def stage(name: str, rpc: str) -> Observer:
        return _UNOBSERVED if rpc == "Info" else stages[name]

    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        name: grpc.unary_unary_rpc_method_handler(
            _guarded(service, name, method),
            request_deserializer=_admitting(parse, service.bytes, stage("parse", name)),
            response_serializer=_timed(serialize, stage("serialize", name)),
        )
        for name, (method, parse, serialize) in methods.items()
    }
    handlers["EmbedStream"] = grpc.stream_stream_rpc_method_handler(
        service.EmbedStream,
        request_deserializer=_admitting(pb.EmbedCall.FromString, service.bytes, stages["parse"]),
        response_serializer=_timed(pb.EmbedReply.SerializeToString, stages["serialize"]),
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


SERVICE = "embedfleet.v1.Worker"

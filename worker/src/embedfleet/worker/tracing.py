"""The worker's traces: a SERVER span per call, continuing the caller's W3C trace context from the
gRPC metadata, with children `queue` (waiting in the FCFS scheduler until its batch launched) and
`compute` (that batch on the engine, shared with the requests batched alongside).

The engine thread takes no part: it stores monotonic timestamps on the request's Entry (as it
always does), and the request's own handler draws the two spans from them once its result is
back, so tracing adds nothing to the engine's loop and nothing at all when it is off. Warm-up and
self-check work, and calls whose trace is not sampled, make no spans. Attributes are counts and
sizes, never token ids.

The Rust front (rust_front.py) records the same three spans after the fact, at the end of the
batch call, from each traced call's metadata and the batch's timestamps (`record_call`); a call
its Rust half refuses before queueing it (draining, byte budget, full queue) makes none.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias, cast

import grpc
import grpc.aio

from embedfleet.common.tracing import RecordingTracer, Tracer, start, trace_config, wall_ns
from embedfleet.worker.runner import Entry
from embedfleet.worker.settings import WorkerSettings

SCOPE = "embedfleet.worker"
_SERVICE = "/embedfleet.v1.Worker/"
#: the gateway's readiness probe, every few seconds: never traced
_UNTRACED = frozenset({_SERVICE + "Info"})

Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"  # generic in the stubs only
Behavior: TypeAlias = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]


def from_settings(settings: WorkerSettings) -> Tracer:
    config = trace_config(
        settings.tracing_endpoint,
        settings.tracing_service_name,
        settings.tracing_sample_ratio,
        "embedfleet-worker",
    )
    return start(config, SCOPE)


class _ServerInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    def __init__(self, tracer: RecordingTracer) -> None:
        self._tracer = tracer

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(details)
        method: str = details.method
        if (
            handler is None
            or handler.unary_unary is None
            or not method.startswith(_SERVICE)
            or method in _UNTRACED
        ):
            return handler
        return grpc.unary_unary_rpc_method_handler(
            # The aio server runs async behaviors; the stubs type the field as the sync one.
            self._traced(method, cast(Behavior, handler.unary_unary)),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _traced(self, method: str, behavior: Behavior) -> Behavior:
        tracer = self._tracer
        name = method.lstrip("/")
        service, _, rpc = name.partition("/")

        async def traced(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            metadata = context.invocation_metadata() or ()
            with tracer.server_span(name, metadata) as span:
                span.set_attribute("rpc.system", "grpc")
                span.set_attribute("rpc.service", service)
                span.set_attribute("rpc.method", rpc)
                try:
                    return await behavior(request, context)
                finally:
                    code = context.code()
                    if isinstance(code, grpc.StatusCode):
                        span.set_attribute("rpc.grpc.status_code", code.value[0])

        return traced


def server_interceptors(tracer: Tracer) -> list[grpc.aio.ServerInterceptor[Any, Any]]:
    """What the gRPC server runs its calls through: nothing when tracing is off."""
    if not isinstance(tracer, RecordingTracer):
        return []
    return [_ServerInterceptor(tracer)]


@dataclass(frozen=True, slots=True)
class Computed:
    """One request's part of a batch, as monotonic seconds and counts: what its `queue` and
    `compute` spans say."""

    arrival: float
    launched: float
    computed: float
    batch_no: int
    batch_tokens: int
    batch_sequences: int
    tokens: int
    sequences: int


def record_batch(tracer: Tracer, entry: Entry) -> None:
    """The `queue` and `compute` spans of a computed request, under the current (SERVER) span."""
    if not isinstance(tracer, RecordingTracer):
        return
    from opentelemetry import trace

    if not trace.get_current_span().is_recording():
        return  # not sampled, or no call around it (warm-up)
    computed = Computed(
        entry.arrival,
        entry.launched,
        entry.computed,
        entry.batch_no,
        entry.batch_tokens,
        entry.batch_sequences,
        entry.tokens,
        entry.sequences,
    )
    _children(tracer, computed, None)


def _children(tracer: RecordingTracer, computed: Computed, context: Any) -> None:
    """`queue` and `compute` under `context`'s span (None: the current one)."""
    otel = tracer.otel
    queue = otel.start_span(
        "queue",
        context=context,
        start_time=wall_ns(computed.arrival),
        attributes={
            "embedfleet.tokens": computed.tokens,
            "embedfleet.sequences": computed.sequences,
        },
    )
    queue.end(end_time=wall_ns(computed.launched))
    compute = otel.start_span(
        "compute",
        context=context,
        start_time=wall_ns(computed.launched),
        attributes={
            "embedfleet.batch": computed.batch_no,
            "embedfleet.batch_tokens": computed.batch_tokens,
            "embedfleet.batch_sequences": computed.batch_sequences,
            "embedfleet.tokens": computed.tokens,
        },
    )
    compute.end(end_time=wall_ns(computed.computed))


def record_call(
    tracer: Tracer,
    method: str,
    carrier: tuple[tuple[str, str], ...],
    arrival: float,
    code: int,
    computed: Computed | None,
) -> None:
    """A call's SERVER span, recorded after the fact (the Rust front): from its arrival to now,
    continuing the trace context in `carrier` (its metadata's traceparent and tracestate), with
    `queue` and `compute` under it when it was computed. Nothing when the trace is not sampled."""
    if not isinstance(tracer, RecordingTracer):
        return
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind

    server = tracer.otel.start_span(
        _SERVICE.strip("/") + "/" + method,
        context=tracer.extract(carrier),
        kind=SpanKind.SERVER,
        start_time=wall_ns(arrival),
        attributes={
            "rpc.system": "grpc",
            "rpc.service": _SERVICE.strip("/"),
            "rpc.method": method,
            "rpc.grpc.status_code": code,
        },
    )
    if not server.is_recording():
        return
    if computed is not None:
        _children(tracer, computed, trace.set_span_in_context(server))
    server.end()

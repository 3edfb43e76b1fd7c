"""The gateway's traces: which spans a request makes and how its context reaches the workers.

A traced request is one SERVER span (`POST /v1/embeddings`, continuing a client's traceparent
when it sends one) with children `tokenize` (the tokenizer's run), `compute` (the fan-out of its
chunks over the workers) and, under that, one CLIENT span per worker call
(`embedfleet.v1.Worker/Embed`: the network leg, with retries as separate spans). That call carries
W3C trace context in its gRPC metadata, so the worker's own spans (its queue wait and its batch's
compute) are children of it. There is no gateway `queue` span: admission decides at once (a 429
or go), it never waits. Attributes are counts and sizes only, never request text.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

from embedfleet.common.tracing import RecordingTracer, Tracer, start, trace_config
from embedfleet.gateway.settings import GatewaySettings

SCOPE = "embedfleet.gateway"
#: the probe the pool sends every few seconds per worker: not a request's work, never traced
_UNTRACED = frozenset({"/embedfleet.v1.Worker/Info"})


def from_settings(settings: GatewaySettings) -> Tracer:
    config = trace_config(
        settings.tracing_endpoint,
        settings.tracing_service_name,
        settings.tracing_sample_ratio,
        "embedfleet-gateway",
    )
    return start(config, SCOPE)


class _ClientInterceptor(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    """A CLIENT span per worker call, its traceparent sent in the call's metadata."""

    def __init__(self, tracer: RecordingTracer, address: str) -> None:
        self._tracer = tracer
        self._address = address

    async def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]],
        details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        if method in _UNTRACED:
            return await continuation(details, request)
        from opentelemetry.trace import SpanKind, StatusCode

        service, _, rpc = method.lstrip("/").partition("/")
        attrs: dict[str, str | int] = {
            "rpc.system": "grpc",
            "rpc.service": service,
            "rpc.method": rpc,
            "server.address": self._address,
        }
        batch = getattr(request, "batch", None)
        if batch is not None:
            attrs["embedfleet.sequences"] = len(batch.lengths) // 4
            attrs["embedfleet.tokens"] = len(batch.token_ids) // 4
            attrs["rpc.request.size"] = request.ByteSize()
        with self._tracer.otel.start_as_current_span(
            method.lstrip("/"), kind=SpanKind.CLIENT, attributes=attrs
        ) as span:
            metadata = grpc.aio.Metadata(*(details.metadata or ()), *self._tracer.inject())
            traced = grpc.aio.ClientCallDetails(
                details.method,
                details.timeout,
                metadata,
                details.credentials,
                details.wait_for_ready,
            )
            call = await continuation(traced, request)
            code = await call.code()
            span.set_attribute("rpc.grpc.status_code", code.value[0])
            if code != grpc.StatusCode.OK:
                span.set_status(StatusCode.ERROR, code.name)
            return call


def client_interceptors(tracer: Tracer, address: str) -> list[grpc.aio.ClientInterceptor]:
    """What the WorkerClient for `address` runs its calls through: nothing when tracing is off."""
    if not isinstance(tracer, RecordingTracer):
        return []
    # The stubs type this list loosely; grpc accepts any ClientInterceptor subclass.
    return [_ClientInterceptor(tracer, address)]  # type: ignore[list-item]

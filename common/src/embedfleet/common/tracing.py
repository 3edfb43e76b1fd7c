"""The worker's OpenTelemetry traces; off unless an endpoint is set (the gateway, a Rust binary,
traces with the same settings: docs/gateway.md, "Tracing").

Off (the default) costs nothing on the hot path: `Tracer.server_span` hands back one shared null
span, no span object is made and `opentelemetry` is never imported. On, spans go to an OTLP/gRPC
collector through the SDK's batch processor (exported off the request path, on its own thread).

Which settings win (documented in docs/worker.md and docs/gateway.md, "Tracing"):
- the endpoint is the component's --tracing-endpoint; empty falls back to the standard
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, then OTEL_EXPORTER_OTLP_ENDPOINT, so a pod that an
  OpenTelemetry operator injected is traced without embedfleet settings; none set: off;
- OTEL_SDK_DISABLED=true turns tracing off whatever else is set (the SDK's own kill switch);
- service.name is --tracing-service-name, else OTEL_SERVICE_NAME, else the component's name.

The provider is this object's own, never the process-global one: nothing else in the process (a
library that traces itself) starts exporting because embedfleet enabled tracing.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from embedfleet.common.settings import SettingsError

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span
    from opentelemetry.trace import Tracer as OtelTracer

ENDPOINT_HELP = (
    "OTLP/gRPC endpoint that receives OpenTelemetry traces, e.g. http://otel-collector:4317 "
    "(http:// plaintext, https:// TLS). Empty: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or "
    "OTEL_EXPORTER_OTLP_ENDPOINT when set, else tracing is off."
)
SAMPLE_HELP = (
    "Fraction of new traces recorded, 0 to 1. A call that arrives with a W3C traceparent keeps "
    "its caller's decision, so a gateway's sampled request is traced in its workers too."
)
SERVICE_HELP = "service.name of this process's spans; empty: OTEL_SERVICE_NAME, else {default}."

AttributeValue = str | int | float | bool


class SpanLike(Protocol):
    """What the request path does with a span: the real one, or the null one when off."""

    def set_attribute(self, key: str, value: AttributeValue) -> None: ...


@dataclass(frozen=True, slots=True)
class TraceConfig:
    endpoint: str
    service_name: str
    sample_ratio: float


def trace_config(
    endpoint: str,
    service_name: str,
    sample_ratio: float,
    default_service: str,
    environ: Mapping[str, str] | None = None,
) -> TraceConfig | None:
    """The tracing a component runs with (None: off), from its settings and the OTEL_ env."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    chosen = (
        endpoint.strip()
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    )
    if not chosen:
        return None
    if not (math.isfinite(sample_ratio) and 0.0 <= sample_ratio <= 1.0):
        raise SettingsError(f"tracing sample ratio must be between 0 and 1, got {sample_ratio}")
    name = service_name.strip() or env.get("OTEL_SERVICE_NAME", "").strip() or default_service
    return TraceConfig(chosen, name, sample_ratio)


class _NullSpan:
    """The one span object tracing-off code ever sees: a context manager that does nothing."""

    __slots__ = ()

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        pass

    def __enter__(self) -> _NullSpan:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


NULL_SPAN = _NullSpan()


class Tracer:
    """Tracing off: every span is NULL_SPAN. `start()` returns the recording subclass when on."""

    enabled = False

    def server_span(
        self, name: str, carrier: Iterable[tuple[str | bytes, str | bytes]]
    ) -> AbstractContextManager[SpanLike]:
        """A SERVER span continuing the W3C trace context found in `carrier` (headers or gRPC
        metadata), current for the block."""
        return NULL_SPAN

    def shutdown(self) -> None:
        """Export what is buffered and stop the exporter."""


OFF = Tracer()


class RecordingTracer(Tracer):
    """Tracing on: spans from this component's own provider, exported over OTLP/gRPC."""

    enabled = True

    def __init__(self, provider: TracerProvider, scope: str) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.otel: OtelTracer = provider.get_tracer(scope)
        self.propagator = TraceContextTextMapPropagator()

    def server_span(
        self, name: str, carrier: Iterable[tuple[str | bytes, str | bytes]]
    ) -> AbstractContextManager[Span]:
        from opentelemetry.trace import SpanKind

        return self.otel.start_as_current_span(
            name, context=self.extract(carrier), kind=SpanKind.SERVER
        )

    def extract(self, carrier: Iterable[tuple[str | bytes, str | bytes]]) -> Context:
        """The caller's context from `traceparent`/`tracestate` (names compared lower-case)."""
        found: dict[str, str] = {}
        for key, value in carrier:
            name = (key.decode("latin-1") if isinstance(key, bytes) else key).lower()
            if name in ("traceparent", "tracestate"):
                found[name] = value.decode("latin-1") if isinstance(value, bytes) else value
        return self.propagator.extract(found)

    def shutdown(self) -> None:
        self.provider.shutdown()


def start(config: TraceConfig | None, scope: str) -> Tracer:
    """OFF for None; else a RecordingTracer exporting to `config.endpoint`. The SDK and exporter
    are imported here only (the `tracing` extra of embedfleet-worker)."""
    if config is None:
        return OFF
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError as exc:
        raise SettingsError(
            f"tracing to {config.endpoint} needs the OpenTelemetry SDK, which is not installed "
            f"({exc.name}): install the `tracing` extra, e.g. embedfleet-worker[tracing]"
        ) from None

    provider = TracerProvider(
        resource=Resource.create({"service.name": config.service_name}),
        sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
    )
    exporter = OTLPSpanExporter(
        endpoint=config.endpoint, insecure=config.endpoint.startswith("http://")
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return RecordingTracer(provider, scope)


def wall_ns(monotonic_seconds: float) -> int:
    """A time.monotonic() reading as the epoch nanoseconds spans carry (for spans recorded after
    the fact from timestamps another thread took)."""
    return time.time_ns() - time.monotonic_ns() + int(monotonic_seconds * 1e9)

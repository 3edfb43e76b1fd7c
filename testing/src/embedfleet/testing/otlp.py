"""A tiny OTLP/gRPC trace collector on 127.0.0.1, for tests and benchmarks that check what the
gateway and workers export (docs/gateway.md, "Tracing").

    with running_collector() as (sink, endpoint):   # endpoint: http://127.0.0.1:PORT
        ... start processes with --tracing-endpoint endpoint ...
        spans = sink.snapshot()

`keep=False` counts exports and bytes without decoding them, so a benchmark's collector costs
next to nothing beside the processes it measures.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from embedfleet.testing.polling import wait_for

#: a request text the tracing tests send: it must never appear in a span
SECRET_TEXT = "a secret sentence that must never appear in a span"
#: the trace and span ids of the `traceparent` the tracing tests' client sends
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"

_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_EMPTY_REPLY = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    start_ns: int
    end_ns: int


class Collector:
    """Keeps every span it is sent (or, with keep=False, only counts exports and bytes)."""

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self.spans: list[Span] = []
        self.exports = 0
        self.bytes = 0
        self._lock = threading.Lock()

    def export(self, data: bytes, context: Any) -> bytes:
        with self._lock:
            self.exports += 1
            self.bytes += len(data)
        if self.keep:
            self._decode(trace_service_pb2.ExportTraceServiceRequest.FromString(data))
        return _EMPTY_REPLY

    def _decode(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        got = []
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    attrs = {a.key: _value(a.value) for a in s.attributes}
                    got.append(
                        Span(
                            resource.get("service.name", ""),
                            s.name,
                            s.kind,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            attrs,
                            s.start_time_unix_nano,
                            s.end_time_unix_nano,
                        )
                    )
        with self._lock:
            self.spans += got

    def clear(self) -> None:
        """Forget the spans kept so far (a module's next set of processes starts afresh)."""
        with self._lock:
            self.spans.clear()

    def snapshot(self) -> list[Span]:
        with self._lock:
            return list(self.spans)

    def trace(self, trace_id: str, want: int, timeout: float = 30.0) -> list[Span]:
        """The spans of `trace_id` once at least `want` have arrived (exports are batched, so
        a trace's spans come in over several exports)."""

        def spans() -> list[Span] | None:
            found = [s for s in self.snapshot() if s.trace_id == trace_id]
            return found if len(found) >= want else None

        return wait_for(f"{want} spans of trace {trace_id}", spans, timeout=timeout, interval=0.02)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@contextlib.contextmanager
def running_collector(keep: bool = True) -> Iterator[tuple[Collector, str]]:
    """A collector listening on a free 127.0.0.1 port, and its endpoint URL."""
    sink = Collector(keep)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.unary_unary_rpc_method_handler(sink.export)  # raw bytes in and out
    service, _, method = _EXPORT.lstrip("/").partition("/")
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service, {method: handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield sink, f"http://127.0.0.1:{port}"
    finally:
        server.stop(None)

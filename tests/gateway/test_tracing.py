"""OpenTelemetry traces through real processes: the gateway and a worker (null engine) export over
OTLP/gRPC to the collector of embedfleet.testing.otlp, and one request comes back as one trace:
its spans, parents, kinds and counts, across the gRPC boundary into the worker; a refused request
is a span with its status; probes make no spans; sampling is decided where the trace starts and
followed by the worker; the request's text is in no span. Each with the worker's Rust front and
its Python one: the same spans either way."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from embedfleet.testing.gateway import GatewayProcess, running_gateway
from embedfleet.testing.otlp import (
    CLIENT_SPAN,
    CLIENT_TRACE,
    SECRET_TEXT,
    Collector,
)
from embedfleet.testing.workers import WorkerProcess, front_library, running_worker

from .helpers import wait_until

TEXT = SECRET_TEXT


@pytest.fixture(scope="module", params=["rust", "python"])
def worker(
    collector: tuple[Collector, str],
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[WorkerProcess]:
    sink, endpoint = collector
    sink.clear()  # the other front's processes, stopped by now, used the same trace ids
    front: tuple[str, ...] = ("--front", request.param)
    if request.param == "rust":
        front += ("--front-library", str(front_library()))
    with pytest.MonkeyPatch.context() as mp:
        # The batch processors' own setting: export every 50 ms instead of 5 s.
        mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        args = ("--engine", "null", "--warmup-seconds", "0.2", "--tracing-endpoint", endpoint)
        workdir = tmp_path_factory.mktemp("traced-worker")
        with running_worker(workdir, *args, *front) as running:
            yield running


@pytest.fixture(scope="module")
def gateway(
    collector: tuple[Collector, str],
    worker: WorkerProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    _, endpoint = collector
    log = tmp_path_factory.mktemp("traced-gateway") / "gateway.log"
    flags = ("--tracing-endpoint", endpoint, "--probe-seconds", "0.2")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        with running_gateway([worker.address], *flags, log=log) as running:
            yield running


def test_one_request_is_one_trace_across_gateway_and_worker(
    gateway: GatewayProcess, worker: WorkerProcess, collector: tuple[Collector, str]
) -> None:
    sink, _ = collector
    reply = httpx.post(
        gateway.url + "/v1/embeddings",
        json={"input": [TEXT, TEXT + " again"]},
        headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
        timeout=30,
    )
    assert reply.status_code == 200, reply.text
    # gateway: request, tokenize, compute, call; worker: call, queue, compute
    spans = sink.trace(CLIENT_TRACE, want=7)
    assert len(spans) == 7, [(s.service, s.name) for s in spans]
    by_name = {(s.service, s.name): s for s in spans}
    request = by_name[("embedfleet-gateway", "POST /v1/embeddings")]
    tokenize = by_name[("embedfleet-gateway", "tokenize")]
    fanout = by_name[("embedfleet-gateway", "compute")]
    call = by_name[("embedfleet-gateway", "embedfleet.v1.Worker/Embed")]
    served = by_name[("embedfleet-worker", "embedfleet.v1.Worker/Embed")]
    queue = by_name[("embedfleet-worker", "queue")]
    batch = by_name[("embedfleet-worker", "compute")]

    assert request.parent_id == CLIENT_SPAN
    assert tokenize.parent_id == request.span_id
    assert fanout.parent_id == request.span_id
    assert call.parent_id == fanout.span_id
    assert served.parent_id == call.span_id  # across the gRPC boundary, via metadata
    assert queue.parent_id == served.span_id
    assert batch.parent_id == served.span_id
    assert (request.kind, tokenize.kind, call.kind, served.kind) == (2, 1, 3, 2)

    assert request.attributes["http.response.status_code"] == 200
    assert tokenize.attributes["embedfleet.inputs"] == 2
    tokens = tokenize.attributes["embedfleet.tokens"]
    assert tokens > 4
    assert fanout.attributes["embedfleet.chunks"] == 1
    assert call.attributes["embedfleet.tokens"] == tokens
    assert call.attributes["embedfleet.sequences"] == 2
    assert call.attributes["rpc.grpc.status_code"] == 0
    assert call.attributes["server.address"] == worker.address
    assert batch.attributes["embedfleet.tokens"] == tokens
    assert tokenize.end_ns <= call.start_ns
    assert request.start_ns <= tokenize.start_ns
    assert fanout.end_ns <= request.end_ns
    assert call.start_ns <= served.start_ns <= served.end_ns <= call.end_ns + 1_000_000

    for s in spans:
        for value in s.attributes.values():
            assert "secret" not in str(value)


def test_a_refused_requests_span_carries_its_status(
    gateway: GatewayProcess, collector: tuple[Collector, str]
) -> None:
    """A request refused with 400 (dimensions past the model's) is still one span, with the
    status it was answered."""
    sink, _ = collector
    trace = "5bf92f3577b34da6a3ce929d0e0e4737"
    reply = httpx.post(
        gateway.url + "/v1/embeddings",
        json={"input": "hi", "dimensions": 100_000},
        headers={"traceparent": f"00-{trace}-{CLIENT_SPAN}-01"},
        timeout=30,
    )
    assert reply.status_code == 400, reply.text
    spans = sink.trace(trace, want=1)
    (request,) = [s for s in spans if s.name == "POST /v1/embeddings"]
    assert request.attributes["http.response.status_code"] == 400


def test_probes_make_no_spans_and_requests_without_traceparent_start_their_own(
    gateway: GatewayProcess, collector: tuple[Collector, str]
) -> None:
    sink, _ = collector
    for path in ("/ready", "/metrics", "/health"):
        assert httpx.get(gateway.url + path, timeout=10).status_code == 200
    reply = httpx.post(gateway.url + "/v1/embeddings", json={"input": "hi"}, timeout=30)
    assert reply.status_code == 200
    wait_until(
        "a new root request span",
        lambda: any(s.name == "POST /v1/embeddings" and s.parent_id == "" for s in sink.snapshot()),
        timeout=30,
    )
    (root,) = [s for s in sink.snapshot() if s.name == "POST /v1/embeddings" and not s.parent_id]
    spans = sink.trace(root.trace_id, want=7)
    assert {s.service for s in spans} == {"embedfleet-gateway", "embedfleet-worker"}
    time.sleep(0.5)  # a few probe rounds at --probe-seconds 0.2, each exported within 50 ms
    names = {s.name for s in sink.snapshot()}
    assert "embedfleet.v1.Worker/Info" not in names
    assert not [n for n in names if n.startswith("GET ")]
    worker_roots = [
        s for s in sink.snapshot() if s.service == "embedfleet-worker" and not s.parent_id
    ]
    assert worker_roots == []


def test_the_worker_follows_an_unsampled_trace(
    collector: tuple[Collector, str], worker: WorkerProcess, tmp_path: Path
) -> None:
    """A gateway at ratio 0 starts no recorded trace, and its unsampled traceparent keeps
    the worker (ratio 1) from recording; a client's sampled traceparent is followed by both."""
    sink, endpoint = collector
    flags = ("--tracing-endpoint", endpoint, "--tracing-sample-ratio", "0")
    flags += ("--tracing-service-name", "gateway-at-zero")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        with running_gateway([worker.address], *flags, log=tmp_path / "gw.log") as gw:
            before = len(sink.snapshot())
            for _ in range(5):
                assert httpx.post(gw.url + "/v1/embeddings", json={"input": "x"}).status_code == 200
            trace = "6bf92f3577b34da6a3ce929d0e0e4738"
            sampled = {"traceparent": f"00-{trace}-{CLIENT_SPAN}-01"}
            reply = httpx.post(gw.url + "/v1/embeddings", json={"input": "y"}, headers=sampled)
            assert reply.status_code == 200
            spans = sink.trace(trace, want=7)
    assert {s.service for s in spans} == {"gateway-at-zero", "embedfleet-worker"}
    # Only the sampled request's seven spans came in since `before`.
    assert len(sink.snapshot()) - before == 7

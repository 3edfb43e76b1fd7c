"""OpenTelemetry traces through real processes: a gateway and a worker (null engine) export over
OTLP/gRPC to a collector this test runs on 127.0.0.1, and one HTTP request must come back as one
trace whose links cross both process boundaries (client -> gateway -> worker).

Also: tracing off imports no OpenTelemetry and makes no span objects, and which settings win."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from embedfleet.common.net import free_ports
from embedfleet.common.settings import SettingsError
from embedfleet.common.tracing import (
    NULL_SPAN,
    OFF,
    RecordingTracer,
    TraceConfig,
    start,
    trace_config,
)
from embedfleet.gateway.fleet import Fleet
from embedfleet.testing.otlp import (
    CLIENT_SPAN,
    CLIENT_TRACE,
    SECRET_TEXT,
    Collector,
)

from .helpers import wait_until

TEXT = SECRET_TEXT


@pytest.fixture(scope="module")
def traced_fleet(
    collector: tuple[Collector, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    _, endpoint = collector
    (port,) = free_ports(1)
    tracing = ("--tracing-endpoint", endpoint)
    with pytest.MonkeyPatch.context() as mp:
        # The SDK's own setting: export every 50 ms instead of 5 s, so the test waits less.
        mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        fleet = Fleet(
            workers=1,
            port=port,
            gateway_args=(*tracing, "--probe-seconds", "0.2"),
            worker_args=("--engine", "null", "--warmup-seconds", "0.2", *tracing),
            log_dir=tmp_path_factory.mktemp("traced-fleet"),
        )
        with fleet:
            yield fleet


def test_one_request_is_one_trace_across_gateway_and_worker(
    traced_fleet: Fleet, collector: tuple[Collector, str]
) -> None:
    sink, _ = collector
    reply = httpx.post(
        traced_fleet.url + "/v1/embeddings",
        json={"input": [TEXT, TEXT + " again"]},
        headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
        timeout=30,
    )
    assert reply.status_code == 200, reply.text
    # gateway: request, tokenize, compute, call; worker: call, queue, compute
    spans = sink.trace(CLIENT_TRACE, want=7)
    by_name = {(s.service, s.name): s for s in spans}
    request = by_name[("embedfleet-gateway", "POST /v1/embeddings")]
    tokenize = by_name[("embedfleet-gateway", "tokenize")]
    fanout = by_name[("embedfleet-gateway", "compute")]
    call = by_name[("embedfleet-gateway", "embedfleet.v1.Worker/Embed")]
    served = by_name[("embedfleet-worker", "embedfleet.v1.Worker/Embed")]
    queue = by_name[("embedfleet-worker", "queue")]
    batch = by_name[("embedfleet-worker", "compute")]

    # The client's traceparent is honoured, and every link crosses where it should.
    assert request.parent_id == CLIENT_SPAN
    assert tokenize.parent_id == request.span_id
    assert fanout.parent_id == request.span_id
    assert call.parent_id == fanout.span_id
    assert served.parent_id == call.span_id  # across the gRPC boundary, via metadata
    assert queue.parent_id == served.span_id
    assert batch.parent_id == served.span_id
    assert (request.kind, call.kind, served.kind) == (2, 3, 2)  # SERVER, CLIENT, SERVER

    # Counts and sizes, in the order the stages ran.
    assert request.attributes["http.response.status_code"] == 200
    assert tokenize.attributes["embedfleet.inputs"] == 2
    tokens = tokenize.attributes["embedfleet.tokens"]
    assert tokens > 4
    assert call.attributes["embedfleet.tokens"] == tokens
    assert call.attributes["embedfleet.sequences"] == 2
    assert call.attributes["rpc.grpc.status_code"] == 0
    assert batch.attributes["embedfleet.tokens"] == tokens
    assert batch.attributes["embedfleet.batch_tokens"] >= tokens
    assert tokenize.end_ns <= call.start_ns
    assert queue.end_ns <= batch.start_ns + 1_000  # compute begins where the queue wait ends
    assert call.start_ns <= served.start_ns <= served.end_ns <= call.end_ns + 1_000_000

    # The request's text is nowhere in what was exported.
    for s in spans:
        for value in s.attributes.values():
            assert "secret" not in str(value)


def test_probes_and_warm_up_make_no_spans(
    traced_fleet: Fleet, collector: tuple[Collector, str]
) -> None:
    sink, _ = collector
    time.sleep(0.5)  # a few probe rounds at --probe-seconds 0.2, each exported within 50 ms
    names = {s.name for s in sink.snapshot()}
    assert "embedfleet.v1.Worker/Info" not in names
    # The fleet polled /ready and /metrics to start: no span for those either.
    assert not [n for n in names if n.startswith("GET ")]
    worker_roots = [
        s for s in sink.snapshot() if s.service == "embedfleet-worker" and s.parent_id == ""
    ]
    assert worker_roots == []


def test_a_request_without_traceparent_starts_its_own_trace(
    traced_fleet: Fleet, collector: tuple[Collector, str]
) -> None:
    sink, _ = collector
    reply = httpx.post(traced_fleet.url + "/v1/embeddings", json={"input": "hi"}, timeout=30)
    assert reply.status_code == 200
    wait_until(
        "a new root request span",
        lambda: any(s.name == "POST /v1/embeddings" and s.parent_id == "" for s in sink.snapshot()),
        timeout=30,
    )
    (root,) = [s for s in sink.snapshot() if s.name == "POST /v1/embeddings" and not s.parent_id]
    spans = sink.trace(root.trace_id, want=7)
    assert {s.service for s in spans} == {"embedfleet-gateway", "embedfleet-worker"}


OFF_PROBE = """
import sys
from embedfleet.common.modeldir import default_model_path, load_model_dir
from embedfleet.gateway.app import Gateway
from embedfleet.gateway.settings import GatewaySettings
from embedfleet.worker import lifecycle, tracing
from embedfleet.worker.settings import WorkerSettings

app = Gateway(GatewaySettings(), load_model_dir(default_model_path()))
assert not app.tracer.enabled
assert not tracing.from_settings(WorkerSettings()).enabled
loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
print(loaded)
sys.exit(1 if loaded else 0)
"""


def test_tracing_off_imports_no_opentelemetry() -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", OFF_PROBE],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_tracing_off_spans_are_one_shared_null_object() -> None:
    assert OFF.span("tokenize") is NULL_SPAN
    assert OFF.server_span("POST /v1/embeddings", [(b"traceparent", b"x")]) is NULL_SPAN
    with OFF.span("compute") as span:
        span.set_attribute("embedfleet.chunks", 1)
        assert span is NULL_SPAN


def test_which_settings_turn_tracing_on() -> None:
    default = "embedfleet-gateway"
    assert trace_config("", "", 1.0, default, {}) is None
    own = trace_config("http://c:4317", "", 0.5, default, {"OTEL_SERVICE_NAME": "gw"})
    assert own is not None
    assert (own.endpoint, own.service_name, own.sample_ratio) == ("http://c:4317", "gw", 0.5)
    std = trace_config("", "", 1.0, default, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://o:4317"})
    assert std is not None
    assert std.endpoint == "http://o:4317"
    assert std.service_name == default
    traces_first = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://o:4317",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:4317",
    }
    picked = trace_config("", "mine", 1.0, default, traces_first)
    assert picked is not None
    assert (picked.endpoint, picked.service_name) == ("http://t:4317", "mine")
    assert trace_config("http://c:4317", "", 1.0, default, {"OTEL_SDK_DISABLED": "true"}) is None
    with pytest.raises(SettingsError):
        trace_config("http://c:4317", "", 1.5, default, {})


def test_an_endpoint_without_the_sdk_is_refused_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As if the `tracing` extra were not installed: importing the SDK fails.
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    config = trace_config("http://127.0.0.1:4317", "", 1.0, "embedfleet-gateway", {})
    with pytest.raises(SettingsError, match=r"`tracing` extra"):
        start(config, "embedfleet.gateway")


def test_a_worker_follows_the_gateways_sampling_decision() -> None:
    """Sampling is decided once, where the trace starts: a gateway at ratio 0 sends an unsampled
    traceparent, and a worker at ratio 1 records nothing for it (and everything for a sampled
    one)."""

    def tracer(ratio: float) -> RecordingTracer:
        traced = start(TraceConfig("http://127.0.0.1:9", "t", ratio), "test")
        assert isinstance(traced, RecordingTracer)
        return traced

    gateway, worker = tracer(0.0), tracer(1.0)
    try:
        with gateway.server_span("POST /v1/embeddings", []) as request:
            assert not request.is_recording()
            carrier = gateway.inject()
        assert carrier[0][0] == "traceparent"
        assert int(carrier[0][1].rsplit("-", 1)[1], 16) & 1 == 0  # the sampled flag is clear
        with worker.server_span("embedfleet.v1.Worker/Embed", carrier) as served:
            assert not served.is_recording()
        sampled = [("traceparent", f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")]
        with worker.server_span("embedfleet.v1.Worker/Embed", sampled) as served:
            assert served.is_recording()
    finally:
        gateway.provider.shutdown()
        worker.provider.shutdown()

"""The worker's tracing settings and its off path (common/tracing.py): which settings turn tracing
on, off making no span objects and importing no OpenTelemetry, a missing SDK refused by name,
and the worker following its caller's sampling decision. Traces through real processes:
tests/gateway/test_tracing.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from embedfleet.common.settings import SettingsError
from embedfleet.common.tracing import (
    NULL_SPAN,
    OFF,
    RecordingTracer,
    TraceConfig,
    start,
    trace_config,
)
from embedfleet.testing.otlp import CLIENT_SPAN, CLIENT_TRACE

OFF_PROBE = """
import sys
from embedfleet.worker import tracing
from embedfleet.worker.settings import WorkerSettings

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
    with OFF.server_span("embedfleet.v1.Worker/Embed", [(b"traceparent", b"x")]) as span:
        span.set_attribute("rpc.system", "grpc")
        assert span is NULL_SPAN


def test_which_settings_turn_tracing_on() -> None:
    default = "embedfleet-worker"
    assert trace_config("", "", 1.0, default, {}) is None
    own = trace_config("http://c:4317", "", 0.5, default, {"OTEL_SERVICE_NAME": "w"})
    assert own is not None
    assert (own.endpoint, own.service_name, own.sample_ratio) == ("http://c:4317", "w", 0.5)
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
    config = trace_config("http://127.0.0.1:4317", "", 1.0, "embedfleet-worker", {})
    with pytest.raises(SettingsError, match=r"`tracing` extra"):
        start(config, "embedfleet.worker")


def test_a_worker_follows_its_callers_sampling_decision() -> None:
    """Sampling is decided once, where the trace starts: a worker at ratio 1 records nothing for
    an unsampled traceparent, and everything for a sampled one."""
    traced = start(TraceConfig("http://127.0.0.1:9", "t", 1.0), "test")
    assert isinstance(traced, RecordingTracer)
    try:
        unsampled = [("traceparent", f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00")]
        with traced.server_span("embedfleet.v1.Worker/Embed", unsampled) as served:
            assert not served.is_recording()
        sampled = [("traceparent", f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")]
        with traced.server_span("embedfleet.v1.Worker/Embed", sampled) as served:
            assert served.is_recording()
    finally:
        traced.provider.shutdown()

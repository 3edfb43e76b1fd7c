"""/metrics as Prometheus reads it (prometheus_client's text parser, histogram bounds as numbers):
which series the requests move and by how much, the per-stage histograms, the worker gauges."""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from embedfleet.operator.autoscaling import signals

from .helpers import Gateway, sample

LONG = "the quick brown fox jumps over the lazy dog " * 40  # 362 tokens: over 256


def test_requests_count_by_route_and_code(fakes: Gateway) -> None:
    series = [
        ("embedfleet_gateway_requests_total", {"route": "/v1/embeddings", "code": "200"}),
        ("embedfleet_gateway_requests_total", {"route": "/v1/embeddings", "code": "400"}),
        ("embedfleet_gateway_requests_total", {"route": "other", "code": "404"}),
        ("embedfleet_gateway_request_seconds_count", {"route": "/v1/embeddings"}),
        ("embedfleet_gateway_request_seconds_bucket", {"route": "/v1/embeddings", "le": "+Inf"}),
        ("embedfleet_gateway_input_tokens_total", {}),
        # parsed: the three answered and the empty input (refused after parsing); answered
        ("embedfleet_gateway_stage_seconds_count", {"stage": "parse"}),
        ("embedfleet_gateway_stage_seconds_bucket", {"stage": "parse", "le": float("inf")}),
        ("embedfleet_gateway_stage_seconds_count", {"stage": "respond"}),
    ]
    before = fakes.values(series)
    for _ in range(3):
        fakes.post("/v1/embeddings", {"input": "Hello, world!"})  # 6 tokens
    fakes.post("/v1/embeddings", {"input": ""})
    fakes.request("GET", "/nowhere")
    fakes.post("/v1/embeddings", {"input": 5})  # refused by the parser: no parse stage
    fakes.request("GET", "/health")  # no stage either
    moved = tuple(a - b for a, b in zip(fakes.values(series), before, strict=True))
    assert moved == (3, 2, 1, 5, 5, 18, 4, 4, 3)
    assert fakes.value("embedfleet_gateway_inflight_requests") == 1  # the scrape itself
    fakes.calls()


def test_tokenizing_chunks_calls_and_split_inputs_are_counted(fakes: Gateway) -> None:
    series = [
        ("embedfleet_gateway_tokenize_seconds_count", {}),
        ("embedfleet_gateway_upstream_seconds_count", {}),
        ("embedfleet_gateway_chunks_per_request_count", {}),
        ("embedfleet_gateway_chunks_per_request_sum", {}),
        ("embedfleet_gateway_chunks_per_request_bucket", {"le": 1.0}),
        ("embedfleet_gateway_split_inputs_total", {}),
        ("embedfleet_gateway_retries_total", {}),
        ("embedfleet_gateway_worker_ejections_total", {}),
    ]
    moved = fakes.deltas(
        series,
        [
            ("/v1/embeddings", {"input": ["a", "b"]}),  # tokenized once, one chunk, one call
            ("/v1/embeddings", {"input": [LONG, "x"], "split_long_inputs": True}),  # one split
            ("/v1/embeddings", {"input": [list(range(1, 151))] * 60}),  # ids: two chunks
        ],
    )
    assert moved == (2, 4, 3, 4, 2, 1, 0, 0)
    fakes.calls()
    text = fakes.metrics()
    assert sample(text, "embedfleet_gateway_workers", state="ready") == 2
    assert sample(text, "embedfleet_gateway_workers", state="unready") == 0
    for worker in fakes.workers:  # every call answered: nothing outstanding, each worker listed
        outstanding = [
            s
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "embedfleet_gateway_worker_outstanding_tokens"
            and s.labels.get("worker") == worker.address
        ]
        assert [s.value for s in outstanding] == [0]


def test_stage_histograms_have_their_series_and_buckets(fakes: Gateway) -> None:
    bounds: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(fakes.metrics()):
        if family.name == "embedfleet_gateway_stage_seconds":
            for s in family.samples:
                if s.name.endswith("_bucket"):
                    bounds.setdefault(s.labels["stage"], []).append(float(s.labels["le"]))
    assert sorted(bounds) == ["parse", "respond"]
    assert bounds["parse"] == bounds["respond"]
    assert bounds["parse"][:3] == [1e-05, 2.5e-05, 5e-05]
    assert bounds["parse"][-1] == float("inf")


def test_every_family_a_dashboard_reads_is_served(fakes: Gateway) -> None:
    names = {f.name for f in text_string_to_metric_families(fakes.metrics())}
    assert {
        "embedfleet_gateway_requests",
        "embedfleet_gateway_request_seconds",
        "embedfleet_gateway_tokenize_seconds",
        "embedfleet_gateway_upstream_seconds",
        "embedfleet_gateway_input_tokens",
        "embedfleet_gateway_chunks_per_request",
        "embedfleet_gateway_retries",
        "embedfleet_gateway_inflight_requests",
        "embedfleet_gateway_worker_ejections",
        "embedfleet_gateway_worker_outstanding_tokens",
        "embedfleet_gateway_workers",
        "embedfleet_gateway_queued_work_seconds",
        "embedfleet_gateway_held_requests",
        "embedfleet_gateway_held_tokens",
    } <= names


def test_the_operator_reads_the_load_it_scales_on(fakes: Gateway) -> None:
    """The autoscaler's parser (operator/autoscaling/signals.py) on this /metrics: accepted
    tokens, the request histogram over every route, held requests."""
    before = signals.parse_gateway(fakes.metrics(), 0.0)
    fakes.ok("/v1/embeddings", {"input": "Hello, world!"})  # 6 tokens
    fakes.ok("/v1/score", {"text_1": "a", "text_2": "b"})  # 6 tokens
    after = signals.parse_gateway(fakes.metrics(), 1.0)
    assert after.tokens - before.tokens == 12
    # the two requests, and the scrape before them (observed once it was answered)
    assert after.buckets[math.inf] - before.buckets[math.inf] == 3
    assert (after.held_requests, after.held_tokens) == (0, 0)
    fakes.calls()

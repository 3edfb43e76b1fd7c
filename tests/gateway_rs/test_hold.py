"""Scale from zero (--hold-requests): while no worker is ready both gateways stay ready, hold
requests up to the bound and answer them once a worker is, or refuse them alike when the hold
is full or its time is up. Each gateway is in front of its own FAKE worker, numbered alike."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest

from embedfleet.common.modeldir import ModelDir
from embedfleet.gateway.settings import GatewaySettings
from embedfleet.testing.workers import metric_value
from tests.gateway.fakes import FakeWorker
from tests.gateway.helpers import wait_until

from .conftest import LIMITS, flags
from .pair import Answer, Pair, gateways

HOLD = {**LIMITS, "hold_requests": 2, "hold_seconds": 1.5}
BODY = orjson.dumps({"input": ["held one", "held two"]})


@pytest.fixture
def held_pair(minilm: ModelDir, tmp_path: Path) -> Iterator[Pair]:
    """Both gateways holding, in front of one worker each that is not ready yet."""
    py_workers = [FakeWorker(0, ready=False).start()]
    rs_workers = [FakeWorker(0, ready=False).start()]
    settings = GatewaySettings(workers=(py_workers[0].address,), **HOLD)  # type: ignore[arg-type]
    rust = ["--workers", rs_workers[0].address, *flags(HOLD)]
    try:
        # Holding, both are ready at once: no worker to wait for.
        with gateways(
            minilm, settings, rust, tmp_path / "rs.log", (py_workers, rs_workers)
        ) as pair:
            yield pair
    finally:
        for w in py_workers + rs_workers:
            w.stop()


def _gauges(pair: Pair, name: str) -> list[float]:
    return [
        metric_value(one.request("GET", "/metrics").body.decode(), name)
        for one in (pair.python(), pair.rust())
    ]


def _send(pool: ThreadPoolExecutor, pair: Pair) -> list[Future[Answer]]:
    return [
        pool.submit(one.request, "POST", "/v1/embeddings", content=BODY)
        for one in (pair.python(), pair.rust())
    ]


def _workers(pair: Pair, ready: bool) -> None:
    for w in pair.python_workers + pair.rust_workers:
        w.ready = ready


def test_held_requests_are_answered_once_a_worker_is_ready(held_pair: Pair) -> None:
    pair = held_pair
    assert [one.request("GET", "/ready").status for one in (pair.python(), pair.rust())] == [
        200,
        200,
    ]
    with ThreadPoolExecutor(4) as pool:
        first = _send(pool, pair)
        wait_until(
            "one held each", lambda: _gauges(pair, "embedfleet_gateway_held_requests") == [1, 1]
        )
        held_tokens = _gauges(pair, "embedfleet_gateway_held_tokens")
        assert held_tokens[0] == held_tokens[1] > 0  # demand the autoscaler reads
        second = _send(pool, pair)
        wait_until(
            "two held each", lambda: _gauges(pair, "embedfleet_gateway_held_requests") == [2, 2]
        )
        # The hold is full: a third is refused at once, alike.
        doc = pair.embed({"input": "third"})
        assert doc["error"]["message"] == (
            "No worker is ready yet (the fleet is starting); 2 requests are already waiting for "
            "it. Retry later."
        )
        refused = [
            metric_value(
                one.request("GET", "/metrics").body.decode(),
                "embedfleet_gateway_hold_refused_total",
                reason="full",
            )
            for one in (pair.python(), pair.rust())
        ]
        assert refused == [1, 1]
        _workers(pair, True)
        answers = [f.result(timeout=10) for f in first + second]
    assert [a.status for a in answers] == [200] * 4
    assert answers[0].json() == answers[1].json()
    assert _gauges(pair, "embedfleet_gateway_held_requests") == [0, 0]
    assert _gauges(pair, "embedfleet_gateway_held_tokens") == [0, 0]
    assert _gauges(pair, "embedfleet_gateway_hold_seconds_count") == [2, 2]


def test_a_hold_that_times_out_is_refused_alike(held_pair: Pair) -> None:
    pair = held_pair
    start = time.monotonic()
    doc = pair.embed({"input": "waits"})
    waited = time.monotonic() - start
    assert doc["error"]["message"] == (
        "No worker is ready yet (the fleet is starting); none became ready within 1.5 s. "
        "Retry later."
    )
    assert waited >= 2 * 1.5  # each gateway held it for its bound, one after the other
    refused = [
        metric_value(
            one.request("GET", "/metrics").body.decode(),
            "embedfleet_gateway_hold_refused_total",
            reason="timeout",
        )
        for one in (pair.python(), pair.rust())
    ]
    assert refused == [1, 1]


def test_scores_are_held_and_a_client_that_leaves_frees_its_place(held_pair: Pair) -> None:
    pair = held_pair
    for one in (pair.python(), pair.rust()):
        # A client that gives up while held: its place and tokens are released.
        with pytest.raises(httpx.TimeoutException):
            httpx.post(one.url() + "/v1/embeddings", json={"input": "gone"}, timeout=0.5)
    wait_until(
        "the held gauges back to zero",
        lambda: (
            _gauges(pair, "embedfleet_gateway_held_requests") == [0, 0]
            and _gauges(pair, "embedfleet_gateway_held_tokens") == [0, 0]
        ),
    )
    # Dropped when its client left, not held on to its time bound and refused then.
    time.sleep(float(HOLD["hold_seconds"]))
    timed_out = [
        metric_value(
            one.request("GET", "/metrics").body.decode(),
            "embedfleet_gateway_hold_refused_total",
            reason="timeout",
        )
        for one in (pair.python(), pair.rust())
    ]
    assert timed_out == [0, 0]
    score = orjson.dumps({"text_1": "a question", "text_2": ["an answer", "another"]})
    with ThreadPoolExecutor(2) as pool:
        replies = [
            pool.submit(one.request, "POST", "/v1/score", content=score)
            for one in (pair.python(), pair.rust())
        ]
        wait_until(
            "a score request held by each",
            lambda: _gauges(pair, "embedfleet_gateway_held_requests") == [1, 1],
        )
        _workers(pair, True)
        answers = [r.result(timeout=10) for r in replies]
    assert [a.status for a in answers] == [200, 200]
    assert answers[0].json() == answers[1].json()

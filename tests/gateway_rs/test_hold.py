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

HOLD_SECONDS = 1.5
#: Retry-After 7, not the default 1: the hold's 503s carry the setting
HOLD: dict[str, object] = {
    **LIMITS,
    "hold_requests": 2,
    "hold_seconds": HOLD_SECONDS,
    "retry_after_seconds": 7,
}
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


def _gauges(pair: Pair, name: str, **labels: str) -> list[float]:
    return [
        metric_value(one.request("GET", "/metrics").body.decode(), name, **labels)
        for one in (pair.python(), pair.rust())
    ]


def _refused(pair: Pair, reason: str) -> list[float]:
    """Each gateway's count of held requests refused for `reason` ("full", "timeout")."""
    return _gauges(pair, "embedfleet_gateway_hold_refused_total", reason=reason)


def _refusal(pair: Pair) -> str:
    """A request that both gateways refuse alike, with the 503 and Retry-After of HOLD; its
    message."""
    py, rs = pair.both("POST", "/v1/embeddings", content=BODY)
    assert py.status == rs.status == 503, (py.body, rs.body)
    assert py.headers["retry-after"] == rs.headers["retry-after"] == "7"
    assert py.headers["content-type"] == rs.headers["content-type"]
    assert py.json() == rs.json()
    error = py.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "no_workers")
    return str(error["message"])


def _held(
    pool: ThreadPoolExecutor,
    pair: Pair,
    held: int,
    path: str = "/v1/embeddings",
    body: bytes = BODY,
) -> list[Future[Answer]]:
    """The request sent to both from `pool`, once each gateway holds `held` requests with it."""
    replies = [
        pool.submit(one.request, "POST", path, content=body) for one in (pair.python(), pair.rust())
    ]
    wait_until(
        f"{held} held by each",
        lambda: _gauges(pair, "embedfleet_gateway_held_requests") == [held, held],
    )
    return replies


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
        first = _held(pool, pair, 1)
        held_tokens = _gauges(pair, "embedfleet_gateway_held_tokens")
        assert held_tokens[0] == held_tokens[1] > 0  # demand the autoscaler reads
        second = _held(pool, pair, 2)
        # The hold is full: a third is refused at once, alike.
        assert _refusal(pair) == (
            "No worker is ready yet (the fleet is starting); 2 requests are already waiting for "
            "it. Retry later."
        )
        assert _refused(pair, "full") == [1, 1]
        _workers(pair, True)
        answers = [f.result(timeout=10) for f in first + second]
    assert [a.status for a in answers] == [200] * 4
    assert answers[0].json() == answers[1].json()
    assert _gauges(pair, "embedfleet_gateway_held_requests") == [0, 0]
    assert _gauges(pair, "embedfleet_gateway_held_tokens") == [0, 0]
    assert _gauges(pair, "embedfleet_gateway_hold_seconds_count") == [2, 2]
    # Written alike, line for line (a dashboard's or a test's text match reads either): an
    # unlabelled histogram's count and sum without braces, as prometheus_client writes them.
    for text in pair.scrape():
        lines = text.splitlines()
        assert "embedfleet_gateway_hold_seconds_count 2.0" in lines, text
        assert any(line.startswith("embedfleet_gateway_hold_seconds_sum ") for line in lines)
        assert not [line for line in lines if "{}" in line]


def test_a_hold_that_times_out_is_refused_alike(held_pair: Pair) -> None:
    pair = held_pair
    start = time.monotonic()
    message = _refusal(pair)
    waited = time.monotonic() - start
    assert message == (
        "No worker is ready yet (the fleet is starting); none became ready within 1.5 s. "
        "Retry later."
    )
    assert waited >= 2 * HOLD_SECONDS  # each gateway held it for its bound, one after the other
    assert _refused(pair, "timeout") == [1, 1]


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
    time.sleep(HOLD_SECONDS)
    assert _refused(pair, "timeout") == [0, 0]
    score = orjson.dumps({"text_1": "a question", "text_2": ["an answer", "another"]})
    with ThreadPoolExecutor(2) as pool:
        replies = _held(pool, pair, 1, "/v1/score", score)
        _workers(pair, True)
        answers = [r.result(timeout=10) for r in replies]
    assert [a.status for a in answers] == [200, 200]
    assert answers[0].json() == answers[1].json()


def test_a_split_request_is_held_on_its_windows_and_an_oversized_one_refused_at_once(
    held_pair: Pair,
) -> None:
    # Both gateways cut it into windows first, so the demand held and the tokens counted are
    # the windows' (the Python gateway once held it whole, counted nothing until a worker was
    # ready, and held an oversized one until the hold timed out instead of the 413).
    pair = held_pair
    split = orjson.dumps({"input": "word " * 600, "split_long_inputs": True})
    counted = _gauges(pair, "embedfleet_gateway_input_tokens_total")
    with ThreadPoolExecutor(2) as pool:
        replies = _held(pool, pair, 1, body=split)
        held = _gauges(pair, "embedfleet_gateway_held_tokens")
        assert held[0] == held[1] > 602  # the windows overlap: more than the text's 602 tokens
        now = _gauges(pair, "embedfleet_gateway_input_tokens_total")
        assert [n - c for n, c in zip(now, counted, strict=True)] == held
        # Windows past --max-request-tokens: refused before any hold, not after it.
        start = time.monotonic()
        oversized = pair.compare(
            "POST",
            "/v1/embeddings",
            content=orjson.dumps({"input": "word " * 12_000, "split_long_inputs": True}),
        )
        assert time.monotonic() - start < HOLD_SECONDS
        assert oversized["error"]["param"] == "input"
        assert _refused(pair, "timeout") == [0, 0]
        _workers(pair, True)
        answers = [r.result(timeout=10) for r in replies]
    assert [a.status for a in answers] == [200, 200]
    same_rows = answers[0].json() == answers[1].json()
    assert same_rows, (answers[0].body[:200], answers[1].body[:200])
    assert answers[0].json()["usage"]["prompt_tokens"] == held[0]

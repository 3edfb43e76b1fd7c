"""Scale from zero (--hold-requests): while no worker is ready the gateway stays ready, holds
requests up to the bound, counts them as demand on /metrics and answers them once a worker is;
past the count or the time bound it refuses with 503 and Retry-After. In front of a FAKE worker
(fakes.py) whose readiness the test sets."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from embedfleet.common.modeldir import ModelDir

from .fakes import FakeWorker
from .helpers import LIMITS, Gateway, Reply, serving, wait_until

HOLD_SECONDS = 1.5
#: Retry-After 7, not the default 1: the hold's 503s carry the setting
HOLD: dict[str, object] = {
    **LIMITS,
    "hold_requests": 2,
    "hold_seconds": HOLD_SECONDS,
    "retry_after_seconds": 7,
}
BODY: dict[str, list[str]] = {"input": ["held one", "held two"]}
HELD = "embedfleet_gateway_held_requests"
HELD_TOKENS = "embedfleet_gateway_held_tokens"


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Gateway]:
    """The gateway holding, in front of one worker that is not ready yet; ready at once itself."""
    worker = FakeWorker(0, ready=False).start()
    try:
        with serving(HOLD, tmp_path / "gateway.log", [worker], ready=0) as gateway:
            yield gateway
    finally:
        worker.stop()


def _refusal(gateway: Gateway) -> str:
    reply = gateway.post("/v1/embeddings", BODY)
    assert reply.status == 503, reply.body
    assert reply.headers["retry-after"] == "7"
    error = reply.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "no_workers")
    return str(error["message"])


def _held(
    pool: ThreadPoolExecutor, gateway: Gateway, count: int, path: str = "/v1/embeddings",
    body: Any = BODY,
) -> Future[Reply]:  # fmt: skip
    """The request sent from `pool`, once the gateway holds `count` requests with it."""
    reply = pool.submit(gateway.post, path, body)
    wait_until(f"{count} held", lambda: gateway.value(HELD) == count)
    return reply


def test_held_requests_are_answered_once_a_worker_is_ready(held: Gateway, minilm: ModelDir) -> None:
    assert held.request("GET", "/ready").status == 200
    with ThreadPoolExecutor(4) as pool:
        first = _held(pool, held, 1)
        tokens = held.value(HELD_TOKENS)
        # Tokenized and counted before they wait: the autoscaler sees demand at zero.
        assert tokens == sum(len(minilm.tokenizer().encode(t).ids) for t in BODY["input"])
        assert held.value("embedfleet_gateway_input_tokens_total") == tokens
        second = _held(pool, held, 2)
        assert _refusal(held) == (
            "No worker is ready yet (the fleet is starting); 2 requests are already waiting for "
            "it. Retry later."
        )
        assert held.value("embedfleet_gateway_hold_refused_total", reason="full") == 1
        assert not first.done()
        held.set_workers(ready=True)
        answers = [f.result(timeout=10) for f in (first, second)]
    assert [a.status for a in answers] == [200, 200]
    assert all(len(a.json()["data"]) == 2 for a in answers)
    assert (held.value(HELD), held.value(HELD_TOKENS)) == (0, 0)
    assert held.value("embedfleet_gateway_hold_seconds_count") == 2
    # With a worker ready nothing waits.
    assert held.post("/v1/embeddings", BODY).status == 200
    assert held.value("embedfleet_gateway_hold_seconds_count") == 2


def test_a_hold_that_times_out_is_refused(held: Gateway) -> None:
    start = time.monotonic()
    assert _refusal(held) == (
        "No worker is ready yet (the fleet is starting); none became ready within 1.5 s. "
        "Retry later."
    )
    assert time.monotonic() - start >= HOLD_SECONDS
    assert held.value("embedfleet_gateway_hold_refused_total", reason="timeout") == 1
    assert (held.value(HELD), held.value(HELD_TOKENS)) == (0, 0)


def test_scores_are_held_and_a_client_that_leaves_frees_its_place(held: Gateway) -> None:
    with pytest.raises(httpx.TimeoutException):
        httpx.post(held.url + "/v1/embeddings", json={"input": "gone"}, timeout=0.5)
    wait_until(
        "the held gauges back to zero",
        lambda: (held.value(HELD), held.value(HELD_TOKENS)) == (0, 0),
    )
    # Dropped when its client left, not held on to its time bound and refused then.
    time.sleep(HOLD_SECONDS)
    assert held.value("embedfleet_gateway_hold_refused_total", reason="timeout") == 0
    score = {"text_1": "a question", "text_2": ["an answer", "another"]}
    with ThreadPoolExecutor(1) as pool:
        reply = _held(pool, held, 1, "/v1/score", score)
        held.set_workers(ready=True)
        assert reply.result(timeout=10).status == 200


def test_a_split_request_is_held_on_its_windows_and_an_oversized_one_refused_at_once(
    held: Gateway,
) -> None:
    """The request is cut into windows first: the demand held and the tokens counted are the
    windows'; windows past --max-request-tokens are refused before any hold."""
    split = {"input": "word " * 600, "split_long_inputs": True}
    counted = held.value("embedfleet_gateway_input_tokens_total")
    with ThreadPoolExecutor(1) as pool:
        reply = _held(pool, held, 1, body=split)
        tokens = held.value(HELD_TOKENS)
        assert tokens > 602  # the windows overlap: more than the text's 602 tokens
        assert held.value("embedfleet_gateway_input_tokens_total") - counted == tokens
        start = time.monotonic()
        oversized = {"input": "word " * 12_000, "split_long_inputs": True}
        assert held.error("/v1/embeddings", oversized, 413)["param"] == "input"
        assert time.monotonic() - start < HOLD_SECONDS
        held.set_workers(ready=True)
        answer = reply.result(timeout=10)
    assert answer.status == 200
    assert answer.json()["usage"]["prompt_tokens"] == tokens

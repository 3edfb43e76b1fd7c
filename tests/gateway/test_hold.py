"""Scale from zero at the gateway (hold.py): with no ready worker, requests are held (bounded),
counted as demand on /metrics, and answered once a worker is ready; /ready stays OK. Through the
real gateway app against a FAKE in-process gRPC worker whose readiness the test sets."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import pytest

from embedfleet.common.modeldir import ModelDir
from embedfleet.gateway.settings import GatewaySettings

from .fakes import FakeWorker
from .helpers import GatewayThread, metric, wait_until

TEXT = "a sentence the tokenizer makes eleven tokens of"


@pytest.fixture
def idle() -> Iterator[FakeWorker]:
    """A worker that is up but not ready, as a fleet's first pod is while it starts."""
    worker = FakeWorker(0, ready=False).start()
    yield worker
    worker.stop()


def _gateway(minilm: ModelDir, worker: FakeWorker, **overrides: object) -> GatewayThread:
    settings = GatewaySettings(
        workers=(worker.address,),
        probe_seconds=0.1,
        **overrides,  # type: ignore[arg-type]
    )
    return GatewayThread(settings, minilm).start()


def _metrics(gw: GatewayThread) -> str:
    return httpx.get(gw.url + "/metrics").text


def _held(gw: GatewayThread) -> tuple[float, float]:
    text = _metrics(gw)
    return metric(text, "embedfleet_gateway_held_requests"), metric(
        text, "embedfleet_gateway_held_tokens"
    )


def _post(gw: GatewayThread, pool: ThreadPoolExecutor) -> Future[httpx.Response]:
    return pool.submit(httpx.post, gw.url + "/v1/embeddings", json={"input": TEXT}, timeout=30)


def test_held_requests_are_demand_and_answered_once_a_worker_is_ready(
    minilm: ModelDir, idle: FakeWorker
) -> None:
    gw = _gateway(minilm, idle, hold_requests=4, hold_seconds=30)
    try:
        # Ready with no ready worker: the Service keeps the gateway, so requests reach it.
        assert httpx.get(gw.url + "/ready").status_code == 200
        with ThreadPoolExecutor(2) as pool:
            replies = [_post(gw, pool), _post(gw, pool)]
            wait_until("two requests held", lambda: _held(gw)[0] == 2)
            tokens = _held(gw)[1]
            # Tokenized and counted before they wait: the autoscaler sees demand at zero.
            assert tokens >= 2 * 5
            assert metric(_metrics(gw), "embedfleet_gateway_input_tokens_total") == tokens
            assert not any(r.done() for r in replies)
            idle.ready = True
            answers = [r.result(timeout=30) for r in replies]
        assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
        assert all(len(a.json()["data"]) == 1 for a in answers)
        assert _held(gw) == (0.0, 0.0)
        assert metric(_metrics(gw), "embedfleet_gateway_hold_seconds_count") == 2
        # With a worker ready nothing waits.
        reply = httpx.post(gw.url + "/v1/embeddings", json={"input": TEXT}, timeout=30)
        assert reply.status_code == 200
        assert metric(_metrics(gw), "embedfleet_gateway_hold_seconds_count") == 2
    finally:
        gw.stop()


def test_past_the_count_bound_a_503_with_retry_after(minilm: ModelDir, idle: FakeWorker) -> None:
    gw = _gateway(minilm, idle, hold_requests=1, hold_seconds=30, retry_after_seconds=7)
    try:
        with ThreadPoolExecutor(1) as pool:
            first = _post(gw, pool)
            wait_until("one request held", lambda: _held(gw)[0] == 1)
            refused = httpx.post(gw.url + "/v1/embeddings", json={"input": TEXT}, timeout=30)
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "7"
            error = refused.json()["error"]
            assert (error["type"], error["code"]) == ("server_error", "no_workers")
            assert "already waiting" in error["message"]
            assert not first.done()
            idle.ready = True
            assert first.result(timeout=30).status_code == 200
        text = _metrics(gw)
        assert 'embedfleet_gateway_hold_refused_total{reason="full"} 1.0' in text
    finally:
        gw.stop()


def test_past_the_time_bound_a_503_with_retry_after(minilm: ModelDir, idle: FakeWorker) -> None:
    gw = _gateway(minilm, idle, hold_requests=4, hold_seconds=0.3, retry_after_seconds=5)
    try:
        reply = httpx.post(gw.url + "/v1/embeddings", json={"input": TEXT}, timeout=30)
        assert reply.status_code == 503
        assert reply.headers["retry-after"] == "5"
        assert "within 0.3 s" in reply.json()["error"]["message"]
        assert _held(gw) == (0.0, 0.0)
        assert 'embedfleet_gateway_hold_refused_total{reason="timeout"} 1.0' in _metrics(gw)
    finally:
        gw.stop()


def test_a_held_request_whose_client_leaves_is_no_longer_counted(
    minilm: ModelDir, idle: FakeWorker
) -> None:
    gw = _gateway(minilm, idle, hold_requests=4, hold_seconds=30)
    try:
        gone = threading.Event()

        def leave_early() -> None:
            try:
                httpx.post(gw.url + "/v1/embeddings", json={"input": TEXT}, timeout=0.5)
            except httpx.TimeoutException:
                gone.set()

        thread = threading.Thread(target=leave_early)
        thread.start()
        thread.join(10)
        assert gone.is_set()
        wait_until("the held gauges back to zero", lambda: _held(gw) == (0.0, 0.0))
    finally:
        gw.stop()


def test_scores_are_held_too(minilm: ModelDir, idle: FakeWorker) -> None:
    gw = _gateway(minilm, idle, hold_requests=4, hold_seconds=30)
    try:
        with ThreadPoolExecutor(1) as pool:
            reply = pool.submit(
                httpx.post,
                gw.url + "/v1/score",
                json={"text_1": "a question", "text_2": ["an answer", "another"]},
                timeout=30,
            )
            wait_until("the score request held", lambda: _held(gw)[0] == 1)
            idle.ready = True
            assert reply.result(timeout=30).status_code == 200
    finally:
        gw.stop()

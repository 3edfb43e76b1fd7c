"""The Rust gateway's small calls as messages of one EmbedStream per worker (stream.rs), against
real null-engine worker processes: the same answers as unary calls, one stream per worker, and
no request lost when a worker drains under load. The fall-back to unary calls, for a worker
without EmbedStream, runs in every test here against FAKE workers (tests/gateway/fakes.py has
none)."""

from __future__ import annotations

import signal
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from embedfleet.testing.gateway_rs import running_gateway_rs
from embedfleet.testing.workers import WorkerProcess, running_worker
from tests.gateway.fakes import FakeWorker

TEXTS = [f"short query number {i}" for i in range(48)]
NULL = ("--engine", "null", "--warmup-seconds", "0.2")


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[WorkerProcess]]:
    with ExitStack() as stack:
        yield [
            stack.enter_context(running_worker(tmp_path / f"w{n}", *NULL, name=f"w{n}"))
            for n in range(2)
        ]


def _embed_all(url: str, texts: list[str], clients: int = 12) -> list[list[float]]:
    """Each text alone in its request, `clients` at a time; all must answer 200."""
    with httpx.Client(base_url=url, timeout=60) as client:

        def one(text: str) -> list[float]:
            reply = client.post("/v1/embeddings", json={"input": text})
            assert reply.status_code == 200, reply.text
            return list(reply.json()["data"][0]["embedding"])

        with ThreadPoolExecutor(clients) as pool:
            return list(pool.map(one, texts))


def _streams(workers: list[WorkerProcess]) -> list[float]:
    return [w.metric("embedfleet_worker_embed_streams") for w in workers]


def test_streamed_calls_answer_as_unary_calls_do(
    workers: list[WorkerProcess], tmp_path: Path
) -> None:
    addresses = [w.address for w in workers]
    served = [w.metric("embedfleet_worker_requests_total", rpc="Embed", code="OK") for w in workers]
    with running_gateway_rs(addresses, "--coalesce-stream", "0", log=tmp_path / "unary.log") as gw:
        unary = _embed_all(gw.url, TEXTS)
        assert _streams(workers) == [0, 0]
    with running_gateway_rs(addresses, log=tmp_path / "stream.log") as gw:
        streamed = _embed_all(gw.url, TEXTS)
        # one stream to each worker the gateway sent small calls to, however many calls
        assert _streams(workers) == [1, 1]
    assert streamed == unary
    after = [w.metric("embedfleet_worker_requests_total", rpc="Embed", code="OK") for w in workers]
    # every request was one call or part of a merged one; merged calls make fewer
    assert 2 <= sum(after) - sum(served) <= 2 * len(TEXTS)


def test_a_worker_draining_under_load_loses_no_request(
    workers: list[WorkerProcess], tmp_path: Path
) -> None:
    """SIGTERM to one of two workers while 12 clients send short queries through the Rust
    gateway: the calls it refuses while draining (UNAVAILABLE on the stream) and those on its
    stream when the stream ends are retried on the other; every request answers 200."""
    addresses = [w.address for w in workers]
    texts = TEXTS * 10  # 480 requests, bounded
    answered = Counter[str]()
    refused: list[str] = []  # the bodies of any non-200 answers, for the failure message
    lock = threading.Lock()
    with (
        running_gateway_rs(addresses, log=tmp_path / "gw.log") as gw,
        httpx.Client(base_url=gw.url, timeout=60) as client,
    ):

        def one(text: str) -> int:
            reply = client.post("/v1/embeddings", json={"input": text})
            with lock:
                answered[str(reply.status_code)] += 1
                if reply.status_code != 200:
                    refused.append(reply.text)
                if sum(answered.values()) == 120:
                    workers[0].signal(signal.SIGTERM)
            return reply.status_code

        with ThreadPoolExecutor(12) as pool:
            codes = list(pool.map(one, texts))
        log = (tmp_path / "gw.log").read_text()
    assert Counter(codes) == {200: len(texts)}, (answered, refused[:5], log[-3000:])
    code = workers[0].stop()
    assert code == 0, workers[0].log.read_text()[-3000:]


def test_a_worker_without_embed_stream_gets_unary_calls(tmp_path: Path) -> None:
    """A FAKE worker (an older worker's protocol: no EmbedStream) answers UNIMPLEMENTED to the
    stream; the gateway sends it unary calls from then on, and each request is answered."""
    fake = FakeWorker(3).start()
    try:
        with running_gateway_rs([fake.address], log=tmp_path / "gw.log") as gw:
            rows = _embed_all(gw.url, TEXTS)
        assert len(rows) == len(TEXTS)
        assert all(row[3] == 3 for row in rows)  # the fake's number, in every row
        assert sum(fake.calls) == len(TEXTS)  # every text reached it as unary Embed calls
    finally:
        fake.stop()

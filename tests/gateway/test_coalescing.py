"""Small calls to a busy worker merged into one: how many are kept in flight (by the device the
worker reports, unless --coalesce-inflight says), every client still getting its own row, an
invalid one failing alone; and the merged calls as messages of one EmbedStream per real worker,
answering as unary calls do and losing nothing when a worker drains under load. The FAKE workers
(fakes.py) have no EmbedStream: the gateway sends them unary calls."""

from __future__ import annotations

import signal
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from embedfleet.testing.workers import WorkerProcess, running_worker

from .fakes import FakeWorker
from .helpers import LIMITS, Gateway, fake_fleet, serving

QUERIES = 10


def _each_alone(gateway: Gateway, bodies: list[Any]) -> list[Any]:
    """Each body in a request of its own, all at once."""
    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda b: gateway.post("/v1/embeddings", b), bodies))


@pytest.mark.parametrize(
    ("device", "settings", "most"),
    [("cpu", {}, 1), ("null", {}, 1), ("cuda:0", {}, 2), ("cpu", {"coalesce_inflight": 2}, 2),
     ("cpu", {"coalesce_inflight": ""}, 1)],
    ids=["cpu", "null-engine", "cuda", "cpu-set-to-2", "empty-is-unset"],
)  # fmt: skip
def test_calls_in_flight_follow_the_workers_device(
    tmp_path: Path, device: str, settings: dict[str, object], most: int
) -> None:
    def make(number: int) -> FakeWorker:
        return FakeWorker(number, delay=0.5, device=device)

    with fake_fleet({**LIMITS, **settings}, tmp_path / "gateway.log", make) as gateway:
        texts = [" ".join(["word"] * n) for n in range(1, QUERIES + 1)]
        answers = _each_alone(gateway, [{"input": t} for t in texts])
        assert [a.status for a in answers] == [200] * QUERIES
        # Every query answered with its own row: n words are n + 2 tokens.
        assert [a.json()["data"][0]["embedding"][2] for a in answers] == [
            n + 2 for n in range(1, QUERIES + 1)
        ]
        assert sum(gateway.calls()) == QUERIES
        assert max(w.most_running for w in gateway.workers) == most


@pytest.mark.parametrize("inflight", [1, 0])
def test_concurrent_queries_share_calls_unless_coalescing_is_off(
    tmp_path: Path, inflight: int
) -> None:
    settings = {**LIMITS, "coalesce_inflight": inflight}
    make = lambda n: FakeWorker(n, delay=0.3)  # noqa: E731
    with fake_fleet(settings, tmp_path / "gateway.log", make, (0,)) as gateway:
        bodies = [{"input": [[100 + i, 7, 200 + i]]} for i in range(16)]
        answers = _each_alone(gateway, bodies)
        assert [a.json()["data"][0]["embedding"] for a in answers] == [
            [100 + i, 200 + i, 3, 0] for i in range(16)
        ]
        calls = gateway.calls()
        assert sum(calls) == 16
        if inflight:
            assert len(calls) < 16, calls  # merged while the first call was held
        else:
            assert calls == [1] * 16


def test_a_large_requests_small_chunks_go_at_once(tmp_path: Path) -> None:
    """A request over --min-chunk-tokens cut into chunks under it (as a slow worker's paced
    chunks are): all of them reach the worker together, none waiting in the gateway for the
    one call a CPU worker gets, so the backlog is the worker's to queue (and to report)."""
    settings = {**LIMITS, "chunk_tokens": 6, "min_chunk_tokens": 16}
    make = lambda n: FakeWorker(n, delay=0.3)  # noqa: E731
    with fake_fleet(settings, tmp_path / "gateway.log", make, (0,)) as gateway:
        inputs = [[100 + i, 7, 200 + i] for i in range(12)]  # 36 tokens: 6 chunks of 6
        answer = gateway.post("/v1/embeddings", {"input": inputs})
        assert answer.status == 200, answer.body
        assert [d["embedding"] for d in answer.json()["data"]] == [
            [100 + i, 200 + i, 3, 0] for i in range(12)
        ]
        assert gateway.calls() == [2] * 6
        (worker,) = gateway.workers
        assert worker.most_running == 6


def test_an_invalid_query_merged_with_others_fails_alone(tmp_path: Path) -> None:
    make = lambda n: FakeWorker(n, delay=0.3, reject_id=999)  # noqa: E731
    with fake_fleet(LIMITS, tmp_path / "gateway.log", make, (0,)) as gateway:
        bodies = [{"input": [[100 + i, 7]]} for i in range(8)] + [{"input": [[999, 7]]}]
        answers = _each_alone(gateway, bodies)
        assert [a.status for a in answers] == [200] * 8 + [400]
        assert [a.json()["data"][0]["embedding"][0] for a in answers[:8]] == [
            100 + i for i in range(8)
        ]
        assert "rejected the input" in answers[8].json()["error"]["message"]


# --- one EmbedStream per real worker -------------------------------------------------------------

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
    embeds = [w.metric("embedfleet_worker_requests_total", rpc="Embed", code="OK") for w in workers]
    unary_settings = {"coalesce_stream": 0}
    with serving(unary_settings, tmp_path / "unary.log", addresses=addresses) as gateway:
        unary = _embed_all(gateway.url, TEXTS)
        assert _streams(workers) == [0, 0]
    with serving({}, tmp_path / "stream.log", addresses=addresses) as gateway:
        streamed = _embed_all(gateway.url, TEXTS)
        # one stream to each worker the gateway sent small calls to, however many calls
        assert _streams(workers) == [1, 1]
    assert streamed == unary
    after = [w.metric("embedfleet_worker_requests_total", rpc="Embed", code="OK") for w in workers]
    # every request was one call or part of a merged one; merged calls make fewer
    assert 2 <= sum(after) - sum(embeds) <= 2 * len(TEXTS)


def test_a_worker_draining_under_load_loses_no_request(
    workers: list[WorkerProcess], tmp_path: Path
) -> None:
    """SIGTERM to one of two workers while 12 clients send short queries: the calls it refuses
    while draining and those on its stream when the stream ends are retried on the other."""
    addresses = [w.address for w in workers]
    texts = TEXTS * 10  # 480 requests, bounded
    answered = Counter[str]()
    refused: list[str] = []
    lock = threading.Lock()
    with (
        serving({}, tmp_path / "gw.log", addresses=addresses) as gateway,
        httpx.Client(base_url=gateway.url, timeout=60) as client,
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
    assert Counter(codes) == {200: len(texts)}, (answered, refused[:5])
    # It drains and exits on its own (a second SIGTERM, as stop() sends, could race its exit).
    assert workers[0].proc.wait(30) == 0, workers[0].log.read_text()[-3000:]


def test_a_worker_without_embed_stream_gets_unary_calls(tmp_path: Path) -> None:
    """A FAKE worker (an older worker's protocol: no EmbedStream) answers UNIMPLEMENTED to the
    stream; the gateway sends it unary calls from then on, and each request is answered."""
    with fake_fleet(LIMITS, tmp_path / "gateway.log", numbers=(3,)) as gateway:
        rows = _embed_all(gateway.url, TEXTS)
        assert [row[3] for row in rows] == [3] * len(TEXTS)
        assert sum(gateway.calls()) == len(TEXTS)

"""Splitting, ordering, retries, backpressure and cancellation through the real gateway app,
against FAKE in-process workers (fakes.py) whose failures and delays the tests control."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator

import grpc
import httpx
import pytest

from embedfleet.common.modeldir import ModelDir
from embedfleet.gateway.settings import GatewaySettings
from embedfleet.testing.workers import metric_value

from .fakes import FakeWorker
from .helpers import GatewayThread, metric, wait_until


@pytest.fixture
def fakes() -> Iterator[list[FakeWorker]]:
    workers = [FakeWorker(i).start() for i in range(2)]
    yield workers
    for w in workers:
        w.stop()


def _gateway(minilm: ModelDir, fakes: list[FakeWorker], **overrides: object) -> GatewayThread:
    settings = GatewaySettings(
        workers=tuple(w.address for w in fakes),
        probe_seconds=0.1,
        chunk_tokens=10,
        min_chunk_tokens=1,
        **overrides,  # type: ignore[arg-type]
    )
    gw = GatewayThread(settings, minilm).start()
    wait_until("workers ready", lambda: len(gw.app.balancer.usable()) == len(fakes))
    return gw


@pytest.fixture
def gateway(minilm: ModelDir, fakes: list[FakeWorker]) -> Iterator[GatewayThread]:
    gw = _gateway(minilm, fakes)
    yield gw
    gw.stop()


def _inputs(n: int) -> list[list[int]]:
    return [[i + 1] * 3 for i in range(n)]  # 3 tokens each, ids 1..n


def test_chunks_reassembled_in_input_order(gateway: GatewayThread, fakes: list[FakeWorker]) -> None:
    reply = httpx.post(gateway.url + "/v1/embeddings", json={"input": _inputs(40)}, timeout=30)
    assert reply.status_code == 200, reply.text
    doc = reply.json()
    rows = [d["embedding"] for d in doc["data"]]
    assert [d["index"] for d in doc["data"]] == list(range(40))
    assert [int(r[0]) for r in rows] == list(range(1, 41))
    assert all(int(r[2]) == 3 for r in rows)
    assert doc["usage"] == {"prompt_tokens": 120, "total_tokens": 120}
    # 10-token budget -> 3 inputs per chunk -> 14 chunks, spread over both workers.
    calls = fakes[0].calls + fakes[1].calls
    assert sorted(calls) == sorted([3] * 13 + [1])
    assert fakes[0].calls
    assert fakes[1].calls
    assert {int(r[3]) for r in rows} == {0, 1}


def test_unavailable_chunk_is_retried_on_the_other_worker(
    gateway: GatewayThread, fakes: list[FakeWorker]
) -> None:
    fakes[0].fail_code = grpc.StatusCode.UNAVAILABLE
    fakes[0].fail_count = 1000
    for _ in range(5):
        reply = httpx.post(gateway.url + "/v1/embeddings", json={"input": _inputs(12)}, timeout=30)
        assert reply.status_code == 200, reply.text
        assert [int(d["embedding"][0]) for d in reply.json()["data"]] == list(range(1, 13))
    metrics = httpx.get(gateway.url + "/metrics").text
    assert "embedfleet_gateway_retries_total" in metrics
    assert metric(metrics, "embedfleet_gateway_retries_total") >= 1
    assert metric(metrics, "embedfleet_gateway_worker_ejections_total") >= 1
    assert 'embedfleet_gateway_workers{state="ejected"} 1.0' in metrics


def test_worker_rejection_is_a_400_not_a_retry(
    gateway: GatewayThread, fakes: list[FakeWorker]
) -> None:
    for w in fakes:
        w.fail_code, w.fail_count = grpc.StatusCode.INVALID_ARGUMENT, 1
    reply = httpx.post(gateway.url + "/v1/embeddings", json={"input": [[5, 6]]}, timeout=30)
    assert reply.status_code == 400
    assert "rejected the input" in reply.json()["error"]["message"]
    assert metric(httpx.get(gateway.url + "/metrics").text, "embedfleet_gateway_retries_total") == 0


def test_work_queued_past_the_bound_gives_429_before_tokenization(
    minilm: ModelDir, fakes: list[FakeWorker]
) -> None:
    gw = _gateway(minilm, fakes, max_queue_seconds=10, retry_after_seconds=3)
    try:
        for w in fakes:
            w.capacity, w.queued_tokens = 1000.0, 15_000  # another gateway's: 15 s ahead
        wait_until("load seen", lambda: gw.app.pool is not None and gw.app.pool.capacity() > 0)
        wait_until("queue seen", lambda: not _admits(gw))
        before = _tokenized(gw)
        reply = httpx.post(gw.url + "/v1/embeddings", json={"input": "a b c"}, timeout=30)
        assert reply.status_code == 429
        assert reply.headers["retry-after"] == "5"  # 15 s ahead, back within 10 s in 5
        assert reply.json()["error"]["type"] == "rate_limit_error"
        assert _tokenized(gw) == before  # shed on the estimate: never tokenized
        metrics = httpx.get(gw.url + "/metrics").text
        assert metric(metrics, "embedfleet_gateway_shed_requests_total") >= 1
        assert metric(metrics, "embedfleet_gateway_queued_work_seconds") == 15.0
        fakes[1].queued_tokens = 0  # 7.5 s ahead now, within the bound
        wait_until("room seen", lambda: _admits(gw))
        ok = httpx.post(gw.url + "/v1/embeddings", json={"input": "a b c"}, timeout=30)
        assert ok.status_code == 200
    finally:
        gw.stop()


def test_admitted_work_counts_until_answered_at_its_true_size(
    minilm: ModelDir, fakes: list[FakeWorker]
) -> None:
    gw = _gateway(minilm, fakes)
    try:
        for w in fakes:
            w.delay = 0.5
        texts = ["the quick brown fox jumps"] * 4  # 5 tokens + [CLS]/[SEP] each
        with httpx.Client(timeout=30) as client:
            reply: list[httpx.Response] = []
            t = threading.Thread(
                target=lambda: reply.append(
                    client.post(gw.url + "/v1/embeddings", json={"input": texts})
                )
            )
            t.start()
            assert gw.app.admission is not None
            admission = gw.app.admission
            wait_until("tokenized and sent", lambda: any(w.calls for w in fakes))
            # 25 characters estimate as 9 tokens each; the checkpoint corrected that to 7.
            assert admission.queued_tokens == 4 * 7
            t.join(30)
        assert reply[0].status_code == 200
        assert admission.queued_tokens == 0
    finally:
        gw.stop()


def _admits(gw: GatewayThread) -> bool:
    assert gw.app.admission is not None
    return gw.app.admission.queued_seconds() <= gw.app.settings.max_queue_seconds


def _tokenized(gw: GatewayThread) -> float:
    text = httpx.get(gw.url + "/metrics").text
    return metric(text, "embedfleet_gateway_tokenize_seconds_count")


def test_client_disconnect_cancels_chunks(gateway: GatewayThread, fakes: list[FakeWorker]) -> None:
    for w in fakes:
        w.delay = 5.0
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(gateway.url + "/v1/embeddings", json={"input": _inputs(12)}, timeout=0.5)
    wait_until("workers saw the cancellation", lambda: fakes[0].cancelled + fakes[1].cancelled >= 2)
    wait_until(
        "gateway counted it",
        lambda: (
            metric(
                httpx.get(gateway.url + "/metrics").text,
                "embedfleet_gateway_cancelled_requests_total",
            )
            == 1
        ),
    )
    assert all(e.outstanding_tokens == 0 for e in gateway.app.balancer.endpoints.values())


def test_no_ready_worker_gives_503_and_not_ready(minilm: ModelDir, fakes: list[FakeWorker]) -> None:
    for w in fakes:
        w.ready = False
    gw = GatewayThread(
        GatewaySettings(workers=tuple(w.address for w in fakes), probe_seconds=0.1), minilm
    ).start()
    try:
        time.sleep(0.3)
        assert httpx.get(gw.url + "/ready").status_code == 503
        assert httpx.get(gw.url + "/health").status_code == 200
        reply = httpx.post(gw.url + "/v1/embeddings", json={"input": "hi"}, timeout=30)
        assert reply.status_code == 503
        fakes[0].ready = True
        wait_until("ready", lambda: httpx.get(gw.url + "/ready").status_code == 200)
    finally:
        gw.stop()


def test_workers_file_changes_are_picked_up(
    minilm: ModelDir, fakes: list[FakeWorker], tmp_path: object
) -> None:
    from pathlib import Path

    listing = Path(str(tmp_path)) / "workers"
    listing.write_text(f"# one worker\n{fakes[0].address}\n")
    gw = GatewayThread(
        GatewaySettings(
            workers_file=str(listing), probe_seconds=0.1, chunk_tokens=10, min_chunk_tokens=1
        ),
        minilm,
    ).start()
    try:
        wait_until("first worker", lambda: len(gw.app.balancer.usable()) == 1)
        listing.write_text(f"{fakes[0].address}\n{fakes[1].address}  # added\n")
        wait_until("second worker", lambda: len(gw.app.balancer.usable()) == 2)
        reply = httpx.post(gw.url + "/v1/embeddings", json={"input": _inputs(40)}, timeout=30)
        assert {int(d["embedding"][3]) for d in reply.json()["data"]} == {0, 1}
        listing.write_text(f"{fakes[1].address}\n")
        wait_until("first removed", lambda: set(gw.app.balancer.endpoints) == {fakes[1].address})
        reply = httpx.post(gw.url + "/v1/embeddings", json={"input": _inputs(40)}, timeout=30)
        assert {int(d["embedding"][3]) for d in reply.json()["data"]} == {1}
    finally:
        gw.stop()


def test_cross_encoder_rerank_uses_score_rpc_with_pair_encodings(
    minilm: ModelDir, fakes: list[FakeWorker]
) -> None:
    cross = dataclasses.replace(minilm, task="score")
    gw = GatewayThread(
        GatewaySettings(workers=tuple(w.address for w in fakes), probe_seconds=0.1,
                        chunk_tokens=16, min_chunk_tokens=1),
        cross,
    ).start()  # fmt: skip
    try:
        wait_until("ready", lambda: len(gw.app.balancer.usable()) == 2)
        docs = ["one", "one two three four", "one two", "one two three four five six seven"]
        body = {"query": "a query", "documents": docs, "top_n": 3}
        reply = httpx.post(gw.url + "/v1/rerank", json=body, timeout=30)
        assert reply.status_code == 200, reply.text
        doc = reply.json()
        tok = minilm.tokenizer()
        pairs = [tok.encode("a query", d) for d in docs]
        # The fake scores a pair by its document-segment tokens ([SEP] included).
        want = [sum(p.type_ids) for p in pairs]
        assert [r["index"] for r in doc["results"]] == [3, 1, 2]
        assert [r["relevance_score"] for r in doc["results"]] == [want[3], want[1], want[2]]
        assert doc["usage"]["total_tokens"] == sum(len(p.ids) for p in pairs)
        assert len(fakes[0].calls) + len(fakes[1].calls) >= 2  # split into several chunks
        refused = httpx.post(gw.url + "/v1/embeddings", json={"input": "x"}, timeout=30)
        assert refused.status_code == 400
        assert "cross-encoder" in refused.json()["error"]["message"]
    finally:
        gw.stop()


def test_each_post_observes_its_parse_and_respond_stages_once(
    gateway: GatewayThread, fakes: list[FakeWorker]
) -> None:
    def counts() -> tuple[float, float]:
        text = httpx.get(gateway.url + "/metrics").text
        name = "embedfleet_gateway_stage_seconds_count"
        return metric_value(text, name, stage="parse"), metric_value(text, name, stage="respond")

    before = counts()
    for _ in range(2):
        reply = httpx.post(gateway.url + "/v1/embeddings", json={"input": _inputs(2)}, timeout=30)
        assert reply.status_code == 200
    httpx.get(gateway.url + "/health")
    after = counts()
    assert (after[0] - before[0], after[1] - before[1]) == (2, 2)


def test_a_slow_fleets_chunks_hold_about_a_second_of_a_workers_work(
    minilm: ModelDir, fakes: list[FakeWorker]
) -> None:
    # Two workers that measured 2 tokens/s each: with `--chunk-seconds 3`, 6-token chunks (two
    # inputs), where the token budget alone (10) made 3-input chunks.
    for fake in fakes:
        fake.capacity = 2.0
    gw = _gateway(minilm, fakes, chunk_seconds=3.0)
    try:
        pool = gw.app.pool
        assert pool is not None
        wait_until("capacities probed", lambda: pool.capacity() == 4.0)
        reply = httpx.post(gw.url + "/v1/embeddings", json={"input": _inputs(40)}, timeout=30)
        assert reply.status_code == 200, reply.text
        assert [int(d["embedding"][0]) for d in reply.json()["data"]] == list(range(1, 41))
        assert sorted(fakes[0].calls + fakes[1].calls) == [2] * 20
    finally:
        gw.stop()

"""EmbedStream against a real worker process (null engine: the server's own paths): each call is
answered by id with what the unary Embed answers for it, a bad call fails alone with Embed's
status, unreadable bytes end the stream, and a draining worker ends its streams."""

from __future__ import annotations

import queue
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.testing.polling import wait_for
from embedfleet.testing.workers import WorkerProcess, start_worker, worker_stub

from .helpers import embed_request, vectors

SEQUENCES = [[101, 7 + i, 8, 9 + i, 102] for i in range(12)]


@pytest.fixture
def worker(null_worker: WorkerProcess) -> WorkerProcess:
    return null_worker


def _stream(channel: grpc.Channel) -> grpc.StreamStreamMultiCallable[pb.EmbedCall, pb.EmbedReply]:
    return channel.stream_stream(
        "/embedfleet.v1.Worker/EmbedStream",
        request_serializer=pb.EmbedCall.SerializeToString,
        response_deserializer=pb.EmbedReply.FromString,
    )


def test_each_call_is_answered_by_id_as_embed_answers_it(worker: WorkerProcess) -> None:
    stub = worker_stub(worker.channel())
    before = worker.metric("embedfleet_worker_requests_total", rpc="Embed", code="OK")
    calls = [
        pb.EmbedCall(id=1000 + i, request=embed_request([seq]), timeout_seconds=30)
        for i, seq in enumerate(SEQUENCES)
    ]
    replies = list(_stream(worker.channel())(iter(calls), timeout=30))
    assert sorted(r.id for r in replies) == [c.id for c in calls]
    for reply in replies:
        assert reply.code == 0, reply.message
        want = stub.Embed(embed_request([SEQUENCES[reply.id - 1000]]), timeout=30)
        np.testing.assert_array_equal(vectors(reply.response), vectors(want))
        assert reply.response.prompt_tokens == 5
    after = worker.metric("embedfleet_worker_requests_total", rpc="Embed", code="OK")
    # each stream call counts as one Embed call, beside the unary ones made here
    assert after - before == 2 * len(calls)


def test_a_bad_call_fails_alone_with_embeds_status(worker: WorkerProcess) -> None:
    calls = [
        pb.EmbedCall(id=1, request=embed_request([SEQUENCES[0]])),
        pb.EmbedCall(id=2, request=embed_request([SEQUENCES[1]], dimensions=100_000)),
        pb.EmbedCall(id=3, request=pb.EmbedRequest(batch=pb.TokenBatch(lengths=b"\x01"))),
        pb.EmbedCall(id=4, request=embed_request([SEQUENCES[2]])),
    ]
    replies = {r.id: r for r in _stream(worker.channel())(iter(calls), timeout=30)}
    assert replies[1].code == replies[4].code == 0
    for bad in (2, 3):
        assert replies[bad].code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert not replies[bad].HasField("response")
    assert "exceeds the model's" in replies[2].message
    assert "malformed token batch" in replies[3].message


def test_unreadable_bytes_end_the_stream_with_invalid_argument(worker: WorkerProcess) -> None:
    # No serializers: the bytes go out exactly as given.
    raw = worker.channel().stream_stream("/embedfleet.v1.Worker/EmbedStream", None, None)
    good = pb.EmbedCall(id=1, request=embed_request([SEQUENCES[0]])).SerializeToString()
    with pytest.raises(grpc.RpcError) as caught:
        list(raw(iter([good, b"\x12\xff\xff\xff\x0f"]), timeout=30))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed EmbedStream request" in (caught.value.details() or "")
    # the worker still serves
    assert worker_stub(worker.channel()).Embed(embed_request([[101, 7, 102]]), timeout=30).count


def test_a_queued_call_past_its_timeout_is_deadline_exceeded(worker: WorkerProcess) -> None:
    """The message's timeout is the deadline the unary call's grpc-timeout would be: a call that
    is already late when it reaches the queue is dropped there."""
    calls = [pb.EmbedCall(id=9, request=embed_request([SEQUENCES[0]]), timeout_seconds=1e-9)]
    (reply,) = list(_stream(worker.channel())(iter(calls), timeout=30))
    assert reply.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0], reply.message


@pytest.fixture
def own_worker(tmp_path: Path) -> Iterator[WorkerProcess]:
    proc = start_worker(tmp_path, "--engine", "null", "--warmup-seconds", "0.2")
    try:
        proc.wait_serving(120)
        yield proc
    finally:
        proc.stop()


def test_a_draining_worker_ends_its_open_streams(own_worker: WorkerProcess) -> None:
    """An idle open stream ends with OK once the worker drains, well within the grace period
    server.stop would otherwise hold it for; the process exits 0."""
    outbox: queue.Queue[pb.EmbedCall | None] = queue.Queue()

    def requests() -> Iterator[pb.EmbedCall]:
        while (call := outbox.get(timeout=60)) is not None:
            yield call

    stream = _stream(own_worker.channel())(requests(), timeout=60)
    outbox.put(pb.EmbedCall(id=1, request=embed_request([SEQUENCES[0]])))
    assert next(iter(stream)).code == 0
    own_worker.signal(signal.SIGTERM)
    assert list(stream) == []  # ended by the worker, no error raised
    assert stream.code() == grpc.StatusCode.OK
    outbox.put(None)
    assert own_worker.stop() == 0


@pytest.fixture
def slow_worker(tmp_path: Path) -> Iterator[WorkerProcess]:
    """A null engine asleep 1 s per 200 tokens: a call stays in flight long enough to be left."""
    args = ("--engine", "null", "--null-tokens-per-second", "200", "--warmup-seconds", "0.2")
    proc = start_worker(tmp_path, *args)
    try:
        proc.wait_serving(120)
        yield proc
    finally:
        proc.stop()


def test_a_call_whose_stream_is_cancelled_counts_as_a_cancelled_embed(
    slow_worker: WorkerProcess,
) -> None:
    """The caller cancels the stream while its call computes: the call is counted CANCELLED,
    as a unary Embed whose caller left is."""

    def cancelled() -> float:
        return slow_worker.metric("embedfleet_worker_requests_total", rpc="Embed", code="CANCELLED")

    before = cancelled()
    outbox: queue.Queue[pb.EmbedCall | None] = queue.Queue()

    def requests() -> Iterator[pb.EmbedCall]:
        while (call := outbox.get(timeout=60)) is not None:
            yield call

    stream = _stream(slow_worker.channel())(requests(), timeout=60)
    # 400 tokens (the null model takes 256 a sequence): ~2 s of the paced engine, long past
    # the cancel below.
    sequence = [101, *[7] * 198, 102]
    outbox.put(pb.EmbedCall(id=1, request=embed_request([sequence, sequence])))
    wait_for(
        "the call in flight",
        lambda: slow_worker.metric("embedfleet_worker_inflight_requests") == 1,
        timeout=30,
    )
    stream.cancel()
    outbox.put(None)
    wait_for("the call counted CANCELLED", lambda: cancelled() == before + 1, timeout=30)

"""Bytes that are no protobuf message, sent to a real worker process (null engine: the decoding
path is the server's, not the engine's): INVALID_ARGUMENT each, one log line, no tracebacks."""

from __future__ import annotations

import random
from pathlib import Path

import grpc
import pytest

from embedfleet.testing.workers import WorkerProcess, worker_stub

from .helpers import embed_request

# Each starts a length-delimited field (wire type 2) whose length runs past the end: never valid.
TRUNCATED = [b"\x0a\xff\xff\xff\x0f", b"\x0a\x05ab", b"\x12\x7f" + b"x" * 10]


@pytest.fixture
def worker(null_worker: WorkerProcess) -> WorkerProcess:
    return null_worker


def _raw(channel: grpc.Channel, rpc: str) -> grpc.UnaryUnaryMultiCallable:
    # No serializers: the bytes go out exactly as given.
    return channel.unary_unary(f"/embedfleet.v1.Worker/{rpc}")


def test_undecodable_messages_are_invalid_argument_with_one_log_line(
    worker: WorkerProcess,
) -> None:
    rng = random.Random(8)
    channel = worker.channel()
    payloads = TRUNCATED + [rng.randbytes(rng.randrange(1, 400)) for _ in range(150)]
    codes: dict[grpc.StatusCode, int] = {}
    refused = 0
    for i, payload in enumerate(payloads):
        rpc = ("Embed", "Score", "Info")[i % 3]
        try:
            _raw(channel, rpc)(payload, timeout=10)
        except grpc.RpcError as exc:
            codes[exc.code()] = codes.get(exc.code(), 0) + 1
            if "malformed" in (exc.details() or ""):
                refused += 1
    # Random bytes sometimes happen to decode; those are refused by validation instead. None may
    # end as UNKNOWN (an exception escaping the handler) or INTERNAL.
    assert set(codes) <= {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION}
    assert refused >= len(TRUNCATED)
    assert worker.metric(
        "embedfleet_worker_requests_total", rpc="Embed", code="INVALID_ARGUMENT"
    ) >= sum(1 for i in range(len(TRUNCATED)) if i % 3 == 0)
    text = Path(worker.log).read_text()
    assert "Traceback" not in text
    lines = [r for r in worker.log_records() if r.get("msg") == "undecodable request message"]
    assert len(lines) == 1, lines  # rate-limited: one line per 10 s however many arrive
    # Still serving.
    assert worker_stub(channel).Embed(embed_request([[101, 7, 102]]), timeout=30).count == 1

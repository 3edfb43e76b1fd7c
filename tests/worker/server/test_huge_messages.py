"""Concurrent huge gRPC messages against a real worker process: refused before they are buffered.

A message longer than any request the worker accepts (9 bytes per token of --max-request-tokens,
plus the envelope) is refused by gRPC from its length prefix, so four 64 MiB messages at once must
not raise the worker's peak RSS (VmHWM, which no sampling can miss) by even one of them. Before the
cap the worker took each in whole (256 MiB allowed), copied and parsed it, and only then refused it
by its token count: its peak rose by several hundred MB (the issue saw 1.1 -> 4.1 GB with four
240 MiB ones). Null engine: the path under test is the server's.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from embedfleet.testing.workers import WorkerProcess, health_status, worker_stub

from .helpers import embed_request

HUGE = 64 << 20


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


@pytest.fixture
def worker(null_worker: WorkerProcess) -> WorkerProcess:
    return null_worker


def test_four_concurrent_huge_messages_are_refused_without_being_buffered(
    worker: WorkerProcess,
) -> None:
    stub = worker_stub(worker.channel())
    assert stub.Embed(embed_request([[101, 7, 102]]), timeout=30).count == 1
    before = _status_kb(worker.proc.pid, "VmHWM")
    # Valid token batches (ids 7), just far too long: 16M tokens each.
    payload = embed_request([[7] * (HUGE // 4)]).SerializeToString()
    raw = worker.channel().unary_unary("/embedfleet.v1.Worker/Embed")

    def send(_: int) -> tuple[grpc.StatusCode, str]:
        try:
            raw(payload, timeout=120)
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or ""
        return grpc.StatusCode.OK, ""

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(send, range(4)))
    grown_mb = (_status_kb(worker.proc.pid, "VmHWM") - before) / 1024
    assert grown_mb < HUGE / 2**20, f"peak RSS rose {grown_mb:.0f} MB for refused messages"
    assert {code for code, _ in answers} == {grpc.StatusCode.RESOURCE_EXHAUSTED}, answers
    assert all("larger than max" in details for _, details in answers), answers
    assert health_status(worker.address) == "SERVING"
    assert stub.Embed(embed_request([[101, 7, 102]]), timeout=30).count == 1

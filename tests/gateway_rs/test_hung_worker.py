"""A worker that stops answering (as a SIGSTOPped process: its connection stays open, nothing
comes back): once its Info probe times out, both gateways give up the calls in flight there and
send them to another worker, well within the probe's bound (1 s) rather than the 30 s
--upstream-timeout-seconds, counted alike (one retry, one ejection)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import pytest

from embedfleet.common.modeldir import ModelDir
from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.testing.workers import metric_value
from tests.gateway.fakes import FakeWorker
from tests.gateway.helpers import wait_until

from .conftest import LIMITS, fake_gateways
from .pair import Answer, Pair, same

#: the probe's bound: its period, and its timeout (max(1 s, the period)); the upstream timeout
#: a stopped worker's calls would otherwise wait out
SETTINGS = {**LIMITS, "probe_seconds": 0.2, "upstream_timeout_seconds": 30.0}
#: how long each gateway may take to answer once the worker stops: well under 30 s, and more
#: than the 1 s probe timeout plus a period with room for a loaded machine
BOUND = 10.0


@dataclass
class StoppingWorker(FakeWorker):
    """FAKE worker whose Embed calls stall while `stall` is set and whose Info calls stall too
    while `stopped` is set (each until its caller gives up); `stalled` counts Embed calls that
    began stalling."""

    stall: threading.Event = field(default_factory=threading.Event)
    stopped: threading.Event = field(default_factory=threading.Event)
    stalled: int = 0

    def _wait(self, event: threading.Event, context: grpc.ServicerContext) -> bool:
        """Waits while `event` is set; False when the caller gave up meanwhile."""
        end = time.monotonic() + 60  # bounded: a test that fails leaves no thread behind
        while event.is_set() and context.is_active() and time.monotonic() < end:
            time.sleep(0.01)
        return bool(context.is_active())

    def Embed(self, request: pb.EmbedRequest, context: grpc.ServicerContext) -> pb.EmbedResponse:
        if self.stall.is_set():
            with self._lock:
                self.stalled += 1
            if not self._wait(self.stall, context):
                with self._lock:
                    self.cancelled += 1
                context.abort(grpc.StatusCode.CANCELLED, "client went away")
        return super().Embed(request, context)

    def Info(self, request: pb.InfoRequest, context: grpc.ServicerContext) -> pb.InfoResponse:
        if not self._wait(self.stopped, context):
            context.abort(grpc.StatusCode.CANCELLED, "client went away")
        return super().Info(request, context)


@pytest.fixture
def stopping_pair(minilm: ModelDir, rust_binary: Path, tmp_path: Path) -> Iterator[Pair]:
    """Each gateway in front of two StoppingWorkers numbered 0 and 1."""
    workers: list[StoppingWorker] = []

    def make(number: int) -> StoppingWorker:
        workers.append(StoppingWorker(number))
        return workers[-1]

    try:
        with fake_gateways(minilm, SETTINGS, tmp_path / "gateway-rs.log", make, (0, 1)) as pair:
            yield pair
    finally:
        for w in workers:  # release any call still stalled, so the fakes stop at once
            w.stall.clear()
            w.stopped.clear()


def _workers(pair: Pair) -> list[list[StoppingWorker]]:
    out = []
    for ws in (pair.python_workers, pair.rust_workers):
        assert all(isinstance(w, StoppingWorker) for w in ws)
        out.append([w for w in ws if isinstance(w, StoppingWorker)])
    return out


def _counters(pair: Pair) -> list[tuple[float, ...]]:
    names = (
        "embedfleet_gateway_retries_total",
        "embedfleet_gateway_worker_ejections_total",
        "embedfleet_gateway_cancelled_calls_total",
    )
    out = []
    for one in (pair.python(), pair.rust()):
        text = one.request("GET", "/metrics").body.decode()
        out.append(tuple(metric_value(text, n) for n in names))
    return out


def _post(url: str) -> tuple[Answer, float]:
    """One embedding request, its answer and the monotonic time it came."""
    with httpx.Client(base_url=url, timeout=60) as client:
        reply = client.post("/v1/embeddings", json={"input": "x"})
    return Answer(reply.status_code, dict(reply.headers), reply.content), time.monotonic()


def test_a_stopped_worker_s_calls_fail_over_within_the_probe_bound(stopping_pair: Pair) -> None:
    pair = stopping_pair
    (py0, py1), (rs0, rs1) = _workers(pair)
    before = _counters(pair)
    # Worker 1 unready for now, so that each gateway's request lands on worker 0 and stalls.
    py1.ready = rs1.ready = False
    wait_until("worker 1 unready", lambda: pair.worker_counts() == [(1, 2)] * 2)
    py0.stall.set()
    rs0.stall.set()
    with ThreadPoolExecutor(2) as pool:
        sent = [pool.submit(_post, url) for url in (pair.python_url, pair.rust_url)]
        wait_until("both calls stalled at worker 0", lambda: py0.stalled == rs0.stalled == 1)
        py1.ready = rs1.ready = True
        wait_until("worker 1 ready", lambda: pair.worker_counts() == [(2, 2)] * 2)
        stopped = time.monotonic()
        py0.stopped.set()  # its probes time out from now on
        rs0.stopped.set()
        answers = [s.result(timeout=45) for s in sent]
    for (answer, at), name in zip(answers, ("python", "rust"), strict=True):
        assert answer.status == 200, (name, answer.body)
        assert at - stopped < BOUND, f"{name} answered {at - stopped:.1f}s after the stop"
        assert [int(d["embedding"][3]) for d in answer.json()["data"]] == [1], name
    same(answers[0][0].json(), answers[1][0].json())
    # Each gateway gave its stalled call up (the fake sees the cancel within a poll of its own).
    wait_until("the calls cancelled", lambda: py0.cancelled == rs0.cancelled == 1, timeout=5)
    assert py0.stalled == rs0.stalled == 1  # and sent nothing more to worker 0
    # One retry and one ejection each; the call given up is not counted as cancelled (its
    # request was answered).
    after = _counters(pair)
    deltas = [
        tuple(a - b for a, b in zip(x, y, strict=True)) for x, y in zip(after, before, strict=True)
    ]
    assert deltas == [(1, 1, 0), (1, 1, 0)]
    assert pair.worker_counts() == [(1, 2)] * 2  # worker 0 unready while it does not answer
    py0.stall.clear()
    rs0.stall.clear()
    py0.stopped.clear()
    rs0.stopped.clear()
    wait_until("worker 0 back", lambda: pair.worker_counts() == [(2, 2)] * 2)

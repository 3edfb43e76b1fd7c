"""FAKE workers for unit tests of splitting, ordering, retries and backpressure (not the engine).

A FakeWorker is an in-process gRPC server speaking the real proto, for tests through the whole
gateway app. An InMemoryFakeWorker is a `pool.Worker` in the test's own event loop (no gRPC), for
tests of the pool and dispatcher alone. Either's "embedding" of a sequence is [first id, last id,
length, worker number], so a test can see which input landed where and in which order.
Integration tests use real worker processes instead (test_fleet.py).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Coroutine, Iterable
from concurrent import futures
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import grpc
import numpy as np

from embedfleet.common.arrays import FloatArray
from embedfleet.common.codec import SparseVector, Tokens, pack_floats, unpack_tokens
from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.common.proto import embedfleet_pb2_grpc as pb_grpc
from embedfleet.gateway.balancer import Balancer
from embedfleet.gateway.pool import WorkerPool
from embedfleet.gateway.upstream import UpstreamError

DIMS = 4


def _rows(tokens: Tokens, number: int) -> FloatArray:
    return np.array([[s[0], s[-1], len(s), number] for s in tokens.sequences()], dtype=np.float32)


def _scores(tokens: Tokens) -> FloatArray:
    """Score = the number of second-segment (document) tokens: shows type ids arrived."""
    assert tokens.type_ids is not None
    bounds = np.cumsum(tokens.lengths)[:-1]
    return np.array([t.sum() for t in np.split(tokens.type_ids, bounds)], dtype=np.float32)


@dataclass
class FakeWorker(pb_grpc.WorkerServicer):
    number: int
    port: int = 0
    host: str = "127.0.0.1"
    #: the next N Embed calls fail with this code
    fail_code: grpc.StatusCode | None = None
    fail_count: int = 0
    delay: float = 0.0
    calls: list[int] = field(default_factory=list)  # sequences per Embed call
    cancelled: int = 0
    queued_tokens: int = 0
    #: the tokens/s it reports as measured at warm-up (0: none)
    capacity: float = 0.0
    saturated: float = 0.0
    ready: bool = True
    #: the device its Info reports (the gateways size coalescing's calls in flight by it)
    device: str = "cpu"
    #: while an unset Event, Embed calls wait for it to be set (still seeing cancellation), so
    #: a test holds admitted requests at the worker for as long as it needs, not for a delay
    gate: threading.Event | None = None
    #: Embed calls being answered now, and the most at once so far
    running: int = 0
    most_running: int = 0
    _server: grpc.Server | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def Embed(self, request: pb.EmbedRequest, context: grpc.ServicerContext) -> pb.EmbedResponse:
        with self._lock:
            failing = self.fail_code is not None and self.fail_count > 0
            if failing:
                self.fail_count -= 1
        if failing:
            assert self.fail_code is not None
            context.abort(self.fail_code, "fake failure")
        tokens = unpack_tokens(request.batch)
        self.calls.append(tokens.count)
        with self._lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        try:
            end = time.monotonic() + self.delay
            while time.monotonic() < end or (self.gate is not None and not self.gate.is_set()):
                if not context.is_active():
                    self.cancelled += 1
                    context.abort(grpc.StatusCode.CANCELLED, "client went away")
                time.sleep(0.01)
        finally:
            with self._lock:
                self.running -= 1
        rows = _rows(tokens, self.number)
        return pb.EmbedResponse(
            embeddings=pack_floats(rows),
            count=rows.shape[0],
            dimensions=DIMS,
            prompt_tokens=tokens.total,
        )

    def Score(self, request: pb.ScoreRequest, context: grpc.ServicerContext) -> pb.ScoreResponse:
        tokens = unpack_tokens(request.batch)
        scores = _scores(tokens)
        self.calls.append(tokens.count)
        return pb.ScoreResponse(
            scores=pack_floats(scores), count=len(scores), prompt_tokens=tokens.total
        )

    def Info(self, request: pb.InfoRequest, context: grpc.ServicerContext) -> pb.InfoResponse:
        return pb.InfoResponse(
            model_name="fake",
            task="embed",
            dimensions=DIMS,
            max_input_tokens=256,
            device=self.device,
            ready=self.ready,
            queued_tokens=self.queued_tokens,
            capacity_tokens_per_second=self.capacity,
            saturated_tokens_per_second=self.saturated,
        )

    def start(self) -> FakeWorker:
        self._server = grpc.server(futures.ThreadPoolExecutor(8))
        pb_grpc.add_WorkerServicer_to_server(self, self._server)  # type: ignore[no-untyped-call]
        self.port = self._server.add_insecure_port(f"{self.host}:{self.port}")
        self._server.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass
class InMemoryFakeWorker:
    """FAKE `pool.Worker`: answers in the test's event loop, fails and stalls on command."""

    number: int
    ready: bool = True
    queued_tokens: int = 0
    capacity: float = 0.0
    saturated: float = 0.0
    #: what Info says the process is (a new value: the worker restarted)
    instance: str = "first"
    #: the next calls fail with these codes, one each, in order
    failures: list[grpc.StatusCode] = field(default_factory=list)
    #: while not None and not set, calls wait on it (a stalled worker)
    gate: asyncio.Event | None = None
    calls: list[int] = field(default_factory=list)  # sequences per call, failed ones included
    cancelled: int = 0
    closed: bool = False
    #: set once a call has begun (reached the gate), so a test can act while it runs
    busy: asyncio.Event = field(default_factory=asyncio.Event)
    #: set on every Info, so a test can wait for the pool's probe instead of sleeping
    probed: asyncio.Event = field(default_factory=asyncio.Event)

    async def _run(self, tokens: Tokens) -> None:
        self.calls.append(tokens.count)
        if self.failures:
            raise UpstreamError(self.failures.pop(0), "fake failure")
        self.busy.set()
        if self.gate is not None:
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise

    async def embed(
        self, batch: pb.TokenBatch, dimensions: int, timeout: float, normalize: bool | None = None
    ) -> tuple[FloatArray, int]:
        tokens = unpack_tokens(batch)
        await self._run(tokens)
        return _rows(tokens, self.number), tokens.total

    async def score(self, batch: pb.TokenBatch, timeout: float) -> tuple[FloatArray, int]:
        tokens = unpack_tokens(batch)
        await self._run(tokens)
        return _scores(tokens), tokens.total

    async def classify(
        self, batch: pb.TokenBatch, activate: bool, timeout: float
    ) -> tuple[FloatArray, int]:
        tokens = unpack_tokens(batch)
        await self._run(tokens)
        return _rows(tokens, self.number), tokens.total

    async def sparse_embed(
        self, batch: pb.TokenBatch, top_k: int, threshold: float, timeout: float
    ) -> tuple[list[SparseVector], int]:
        """Row i: its sequence's distinct token ids, each weighted by its count."""
        tokens = unpack_tokens(batch)
        await self._run(tokens)
        rows: list[SparseVector] = []
        for seq in tokens.sequences():
            ids, counts = np.unique(seq, return_counts=True)
            rows.append((ids.astype(np.int32), counts.astype(np.float32)))
        return rows, tokens.total

    async def info(self, timeout: float) -> pb.InfoResponse:
        self.probed.set()
        return pb.InfoResponse(
            model_name="fake",
            task="embed",
            dimensions=DIMS,
            instance=self.instance,
            ready=self.ready,
            queued_tokens=self.queued_tokens,
            capacity_tokens_per_second=self.capacity,
            saturated_tokens_per_second=self.saturated,
        )

    async def close(self) -> None:
        self.closed = True


class InMemoryFleet:
    """A real WorkerPool and Balancer over InMemoryFakeWorkers named w0, w1, ..."""

    def __init__(self, count: int) -> None:
        self.fakes = {f"w{i}": InMemoryFakeWorker(i) for i in range(count)}
        # Long probe and ejection times: nothing changes behind a test's back.
        self.balancer = Balancer(60, rng=random.Random(0))
        self.pool = WorkerPool(self.balancer, probe_seconds=60, connect=self.fakes.__getitem__)

    async def connect(self, addresses: Iterable[str] | None = None) -> None:
        """Points the pool at `addresses` (default: every fake) and waits for each new one's
        first probe to land."""
        wanted = list(self.fakes if addresses is None else addresses)
        new = [a for a in wanted if a not in self.balancer.endpoints]
        for a in new:
            self.fakes[a].probed.clear()
        self.pool.update(wanted)
        async with asyncio.timeout(5):
            for a in new:
                await self.fakes[a].probed.wait()
        # A probe records the answer before its task next yields, and we resume only after that.

    async def __aenter__(self) -> InMemoryFleet:
        await self.connect()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.pool.close()

    def outstanding(self) -> dict[str, int]:
        return {a: e.outstanding_tokens for a, e in self.balancer.endpoints.items()}

    def cancelled(self) -> int:
        """Calls cancelled while they were stalled, over every fake."""
        return sum(f.cancelled for f in self.fakes.values())

    async def stalled(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Runs `work` with every worker stalling its calls; returns once a call has begun."""
        gate, busy = asyncio.Event(), asyncio.Event()
        for fake in self.fakes.values():
            fake.gate, fake.busy = gate, busy
        task = asyncio.ensure_future(work)
        async with asyncio.timeout(5):
            await busy.wait()
        return task

"""FAKE workers: in-process gRPC servers speaking the real proto, for the cases a real worker
cannot produce on demand (a chosen failure code, a stall, a hung Info, a set capacity or queue).
A fake's "embedding" of a sequence is [first id, last id, length, worker number], so a test sees
which input landed where and in which order; its score of a pair is the pair's second-segment
(document) tokens, so a test sees that type ids arrived. Fakes have no EmbedStream: the gateway
sends them unary calls. Tests of real numbers use real worker processes instead.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass, field

import grpc
import numpy as np

from embedfleet.common.arrays import FloatArray
from embedfleet.common.codec import Tokens, pack_floats, unpack_tokens
from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.common.proto import embedfleet_pb2_grpc as pb_grpc

DIMS = 4


def _rows(tokens: Tokens, number: int) -> FloatArray:
    return np.array([[s[0], s[-1], len(s), number] for s in tokens.sequences()], dtype=np.float32)


def _scores(tokens: Tokens) -> FloatArray:
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
    #: an Embed call holding this token id is refused INVALID_ARGUMENT (a worker's own check)
    reject_id: int = -1
    delay: float = 0.0
    #: sequences per Embed or Score call, failed ones included
    calls: list[int] = field(default_factory=list)
    cancelled: int = 0
    queued_tokens: int = 0
    #: the tokens/s it reports as measured at warm-up (0: none), and saturated on real traffic
    capacity: float = 0.0
    saturated: float = 0.0
    ready: bool = True
    #: the process it says it is: a new value is a restarted worker
    instance: str = "first"
    #: the device its Info reports (the gateway sizes coalescing's calls in flight by it)
    device: str = "cpu"
    #: while an unset Event, Embed calls wait for it (still seeing cancellation)
    gate: threading.Event | None = None
    #: set once an Embed call waits at `gate`; a call refused for `reject_id` waits for it first,
    #: so that a request's other chunk is at its worker when the refusal fails the request (else
    #: the gateway may drop that call before the worker's handler runs, and it never counts)
    waiting: threading.Event | None = None
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
        tokens = unpack_tokens(request.batch)
        self.calls.append(tokens.count)
        if failing:
            assert self.fail_code is not None
            context.abort(self.fail_code, "fake failure")
        if self.reject_id in tokens.ids.tolist():
            if self.waiting is not None:
                self.waiting.wait(timeout=10)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "token id outside the vocabulary")
        with self._lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        try:
            end = time.monotonic() + self.delay
            if self.waiting is not None and self.gate is not None and not self.gate.is_set():
                self.waiting.set()
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
            instance=self.instance,
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
class StoppingWorker(FakeWorker):
    """FAKE worker as a SIGSTOPped process looks: Embed calls stall while `stall` is set and Info
    calls while `stopped` is set (each until its caller gives up); `stalled` counts Embed calls
    that began stalling."""

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

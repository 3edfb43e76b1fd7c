"""FAKE workers for unit tests of splitting, ordering, retries and backpressure (not the engine).

A FakeWorker is an in-process gRPC server speaking the real proto. Its "embedding" of a sequence is
[first id, last id, length, worker number], so a test can see which input landed where and in which
order. Integration tests use real worker processes instead (test_fleet.py).
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass, field

import grpc
import numpy as np
import uvicorn

from embedfleet.common.codec import pack_floats, unpack_tokens
from embedfleet.common.modeldir import ModelDir
from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.common.proto import embedfleet_pb2_grpc as pb_grpc
from embedfleet.gateway.app import Gateway
from embedfleet.gateway.settings import GatewaySettings
from embedfleet.testing.ports import free_ports

DIMS = 4


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
    ready: bool = True
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
        end = time.monotonic() + self.delay
        while time.monotonic() < end:
            if not context.is_active():
                self.cancelled += 1
                context.abort(grpc.StatusCode.CANCELLED, "client went away")
            time.sleep(0.01)
        rows = np.array(
            [[s[0], s[-1], len(s), self.number] for s in tokens.sequences()], dtype=np.float32
        )
        return pb.EmbedResponse(
            embeddings=pack_floats(rows),
            count=rows.shape[0],
            dimensions=DIMS,
            prompt_tokens=tokens.total,
        )

    def Score(self, request: pb.ScoreRequest, context: grpc.ServicerContext) -> pb.ScoreResponse:
        """Score = the number of second-segment (document) tokens: shows type ids arrived."""
        tokens = unpack_tokens(request.batch)
        assert tokens.type_ids is not None
        bounds = np.cumsum(tokens.lengths)[:-1]
        scores = np.array([t.sum() for t in np.split(tokens.type_ids, bounds)], dtype=np.float32)
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
            ready=self.ready,
            queued_tokens=self.queued_tokens,
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


class GatewayThread:
    """The real Gateway app under uvicorn, in a thread of the test process."""

    def __init__(self, settings: GatewaySettings, model: ModelDir) -> None:
        (port,) = free_ports(1)
        self.app = Gateway(GatewaySettings(**{**settings.__dict__, "port": port}), model=model)
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=port, loop="asyncio", lifespan="on", log_config=None
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> GatewayThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("gateway thread did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)

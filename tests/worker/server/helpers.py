"""Shared helpers of the worker server tests: budgets, request builders, traced start-up."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc
import numpy as np
import numpy.typing as npt

from embedfleet.common.codec import pack_tokens, unpack_floats
from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.common.proto import embedfleet_pb2_grpc as pb_grpc
from embedfleet.testing.polling import WaitTimeoutError, wait_for
from embedfleet.testing.workers import WorkerProcess, WorkerStartError, health_status, worker_stub

#: small budgets so that batching decisions show with few, short requests
BUDGET_TOKENS = 512
BUDGET_SEQUENCES = 16
HARD_TOKENS = 4096
QUEUE = 160
WORKER_ARGS = (
    "--max-batch-tokens", str(BUDGET_TOKENS),
    "--max-batch-sequences", str(BUDGET_SEQUENCES),
    "--max-request-tokens", str(HARD_TOKENS),
    "--max-queue-requests", str(QUEUE),
    "--warmup-seconds", "0.5",
    # Info's capacity is asserted on as soon as the worker serves.
    "--capacity-measurement", "startup",
)  # fmt: skip


@dataclass
class Startup:
    """Health as polled while the worker started, and what an early Embed got."""

    statuses: list[tuple[float, str]] = field(default_factory=list)
    early_embed_code: grpc.StatusCode | None = None


@dataclass
class Served:
    worker: WorkerProcess
    startup: Startup
    stub: pb_grpc.WorkerStub


def embed_request(seqs: Sequence[Sequence[int]], **kw: object) -> pb.EmbedRequest:
    return pb.EmbedRequest(batch=pack_tokens(seqs), **kw)  # type: ignore[arg-type]


def vectors(reply: pb.EmbedResponse) -> npt.NDArray[np.floating]:
    return unpack_floats(reply.embeddings, reply.count, reply.dimensions, reply.format)


def wait_serving_traced(worker: WorkerProcess, timeout: float = 240.0) -> Startup:
    trace = Startup()
    worker.wait_port(timeout)
    stub = worker_stub(worker.channel())

    def serving() -> bool:
        worker.check_alive()
        status = health_status(worker.address)
        trace.statuses.append((time.time(), status))
        if status == "NOT_SERVING" and trace.early_embed_code is None:
            try:
                stub.Embed(embed_request([[101, 102]]), timeout=5)
                trace.early_embed_code = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                trace.early_embed_code = exc.code()
        return status == "SERVING"

    try:
        wait_for("the worker to be SERVING", serving, timeout=timeout, interval=0.05)
    except WaitTimeoutError as exc:
        raise WorkerStartError(f"not SERVING after {timeout}s") from exc
    return trace

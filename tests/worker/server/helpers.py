"""Shared helpers of the worker server tests: budgets, request builders, traced start-up."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import numpy.typing as npt

from embedfleet.common.codec import pack_tokens, unpack_floats
from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.common.proto import embedfleet_pb2_grpc as pb_grpc
from embedfleet.testing.polling import WaitTimeoutError, wait_for
from embedfleet.testing.workers import (
    WorkerProcess,
    WorkerStartError,
    front_library,
    health_status,
    worker_stub,
)

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


#: a Rust-front worker on the null engine whose class `Engine` (defined by the source given) is
#: built instead of the real one; argv: the port file, the front library, then the test's own
_RUST_WORKER_WITH = """
import sys
from pathlib import Path
from embedfleet.worker import lifecycle, rust_front
from embedfleet.worker.null_engine import NullEngine
from embedfleet.worker.settings import WorkerSettings
port_file, library, *argv = sys.argv[1:]
{engine}
lifecycle.build_engine = lambda settings, model: Engine.from_model_dir(model)
sys.exit(rust_front.serve(WorkerSettings(
    engine="null", port=0, port_file=port_file, metrics_port=0, front="rust",
    front_library=library, warmup_seconds=0.1, capacity_measurement="startup")))
"""


@dataclass
class RustWorker:
    proc: subprocess.Popen[bytes]
    address: str
    log: Path


@contextlib.contextmanager
def rust_worker_with(tmp: Path, engine: str, *argv: str) -> Iterator[RustWorker]:
    """MOCK engine: a Rust-front worker process serving `engine`'s `class Engine(NullEngine)`
    (its source; `argv` is its `argv`), SERVING for the block, killed after it."""
    port_file, log = tmp / "port.json", tmp / "worker.log"
    script = _RUST_WORKER_WITH.format(engine=engine)
    command = [sys.executable, "-c", script, str(port_file), str(front_library()), *argv]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        started = lambda: port_file.is_file() or proc.poll() is not None  # noqa: E731
        wait_for("the port file", started, timeout=120)
        if not port_file.is_file():
            raise WorkerStartError(f"exited {proc.returncode}: {log.read_text()[-3000:]}")
        address = f"127.0.0.1:{json.loads(port_file.read_text())['port']}"
        wait_for("serving", lambda: health_status(address) == "SERVING", timeout=30)
        yield RustWorker(proc, address, log)
    finally:
        proc.kill()
        proc.wait()

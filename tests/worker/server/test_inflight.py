"""The cap on request bytes a worker holds: the budget's arithmetic, then the real gRPC server code
(an asyncio server in this process) in front of a gated engine, so a request is held in flight
for exactly as long as the test says; last, a real gateway process in front of that server.

MOCK: `GatedEngine` (from test_runner) stands in for the engine: holding a request in flight
deterministically needs a compute that ends when told; the real engine's length is the machine's.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import grpc.aio
import httpx
import pytest

from embedfleet.common.codec import pack_tokens
from embedfleet.common.modeldir import default_model_path, load_model_dir
from embedfleet.common.net import free_ports
from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.common.proto import embedfleet_pb2_grpc as pb_grpc
from embedfleet.testing.gateway import child_env, gateway_binary
from embedfleet.testing.polling import wait_for_async
from embedfleet.testing.workers import metric_value
from embedfleet.worker.contract import EngineInfo
from embedfleet.worker.inflight import ByteBudget, max_message_bytes
from embedfleet.worker.lifecycle import message_limit
from embedfleet.worker.metrics import WorkerMetrics
from embedfleet.worker.runner import BatchRunner, Entry
from embedfleet.worker.scheduler import Budget, FcfsQueue
from embedfleet.worker.server import WorkerService, WorkerState, add_to_server
from embedfleet.worker.settings import WorkerSettings

from .test_runner import GatedEngine

# --- the budget -------------------------------------------------------------------------------


def test_budget_admits_up_to_its_limit_and_takes_back_each_ticket_once() -> None:
    budget = ByteBudget(100)
    a = budget.take(60)
    assert a is not None
    assert budget.take(41) is None  # 101 > 100
    b = budget.take(40)
    assert b is not None
    assert budget.held == 100
    a.release()
    a.release()  # idempotent: a second release must not free bytes still held by b
    assert budget.held == 40
    assert "--max-inflight-bytes" in budget.refusal(80)


def test_a_dropped_ticket_gives_its_bytes_back() -> None:
    """A call cancelled between deserializer and handler never releases; dropping it does."""
    budget = ByteBudget(100)
    ticket = budget.take(70)
    assert budget.held == 70
    del ticket
    gc.collect()
    assert budget.held == 0


def test_message_limit_follows_the_request_limit_and_the_byte_cap() -> None:
    # 65536 tokens by default (4 x the batch budget): ~0.6 MB, not the 256 MiB gRPC allowed.
    default = WorkerSettings()
    assert message_limit(default) == max_message_bytes(4 * default.max_batch_tokens)
    assert message_limit(default) < 1 << 20
    capped = WorkerSettings(max_inflight_bytes=200_000, max_batch_tokens=1000)
    assert message_limit(capped) == max_message_bytes(4000)
    tight = WorkerSettings(max_inflight_bytes=20_000, max_batch_tokens=1000)
    assert message_limit(tight) == 20_000  # the cap, when the request limit would allow more
    with pytest.raises(ValueError, match="one full batch"):
        message_limit(WorkerSettings(max_inflight_bytes=1000, max_batch_tokens=1000))


def test_the_largest_acceptable_request_fits_the_message_limit() -> None:
    """Worst case per token: one-token sequences with type ids."""
    tokens = 4096
    batch = pack_tokens([[5]] * tokens, type_ids=[[1]] * tokens)
    message = pb.EmbedRequest(batch=batch, dimensions=384, format=pb.FLOAT_FORMAT_FLOAT16)
    assert message.ByteSize() <= max_message_bytes(tokens)


# --- the server ---------------------------------------------------------------------------------

CAP = 10_000


def _request(tokens: int) -> pb.EmbedRequest:
    return pb.EmbedRequest(batch=pack_tokens([[7] * tokens]))


@dataclass
class Gated:
    service: WorkerService
    engine: GatedEngine
    metrics: WorkerMetrics
    address: str


@contextlib.asynccontextmanager
async def _gated_worker() -> AsyncIterator[Gated]:
    """The real WorkerService on a real gRPC server, a gated engine behind it."""
    loop = asyncio.get_running_loop()
    model = load_model_dir(default_model_path())
    engine = GatedEngine()
    engine.info = EngineInfo(
        model.name, "embed", 384, 256, model.vocab_size, "none", "gated", "mean", True
    )
    metrics = WorkerMetrics()
    budget = Budget(4096, 64, 4096)
    state = WorkerState(model=model, budget=budget, metrics=metrics)
    runner = BatchRunner(engine, FcfsQueue[Entry](budget, 100), metrics, loop)
    runner.start()
    state.engine, state.runner, state.ready = engine, runner, True  # type: ignore[assignment]
    service = WorkerService(state, CAP)
    server = grpc.aio.server()
    add_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield Gated(service, engine, metrics, f"127.0.0.1:{port}")
    finally:
        for gate in engine.gates:
            gate.event.set()
        await server.stop(None)
        runner.stop()
        await asyncio.to_thread(runner.join, 5)


def _gauge(metrics: WorkerMetrics) -> float:
    value = metrics.registry.get_sample_value("embedfleet_worker_inflight_request_bytes")
    assert value is not None
    return value


async def test_a_message_past_the_cap_is_refused_until_bytes_free_up() -> None:
    async with _gated_worker() as worker:
        engine, service, metrics = worker.engine, worker.service, worker.metrics
        channel = grpc.aio.insecure_channel(worker.address)
        stub = pb_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
        held = stub.Embed(_request(2000), timeout=30)  # ~8 KB, held by the gated engine
        size = _request(2000).ByteSize()
        await wait_for_async("the first request held", lambda: len(engine.gates) == 1, timeout=10)
        assert service.bytes.held == size
        assert _gauge(metrics) == size

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Embed(_request(1000), timeout=30)  # 8 KB + 4 KB > 10 KB
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-inflight-bytes" in (refused.value.details() or "")
        assert len(engine.gates) == 1  # never reached the engine
        counted = metrics.registry.get_sample_value(
            "embedfleet_worker_requests_total", {"rpc": "Embed", "code": "RESOURCE_EXHAUSTED"}
        )
        assert counted == 1
        # Small messages still fit beside the held one (Info is a few bytes).
        assert (await stub.Info(pb.InfoRequest(), timeout=10)).model_name

        engine.release(1)
        assert (await held).count == 1
        assert service.bytes.held == 0
        again = stub.Embed(_request(1000), timeout=30)
        await wait_for_async("the retry launched", lambda: len(engine.gates) == 2, timeout=10)
        engine.release(2)
        assert (await again).count == 1
        assert service.bytes.held == 0
        assert _gauge(metrics) == 0
        await channel.close()


async def test_the_gateway_answers_a_refusal_with_429_and_keeps_the_worker() -> None:
    """A real gateway process in front of the byte-capped server: busy is a 429 with
    Retry-After, the worker stays in rotation, and it serves once bytes are free."""
    async with _gated_worker() as worker:
        (port,) = free_ports(1)
        gateway = subprocess.Popen(
            [str(gateway_binary()), "--port", str(port),
             "--workers", worker.address, "--probe-seconds", "0.2"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=child_env(),
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:

                async def ready() -> bool:
                    try:
                        return (await http.get("/ready")).status_code == 200
                    except httpx.TransportError:
                        return False

                for _ in range(600):
                    if await ready():
                        break
                    assert gateway.poll() is None, "the gateway exited"
                    await asyncio.sleep(0.1)
                text = "hello " * 240  # ~242 tokens, ~1 KB on the wire
                held = asyncio.ensure_future(
                    http.post("/v1/embeddings", json={"input": [text] * 8})
                )
                await wait_for_async(
                    "the first request held", lambda: len(worker.engine.gates) == 1, timeout=30
                )
                busy = await http.post("/v1/embeddings", json={"input": [text] * 4})
                assert busy.status_code == 429, busy.text
                assert busy.headers["retry-after"]
                assert busy.json()["error"]["code"] == "overloaded"
                metrics = (await http.get("/metrics")).text
                assert metric_value(metrics, "embedfleet_gateway_worker_ejections_total") == 0
                assert metric_value(metrics, "embedfleet_gateway_workers", state="ready") == 1

                worker.engine.release(1)
                assert (await held).status_code == 200
                again = asyncio.ensure_future(
                    http.post("/v1/embeddings", json={"input": [text] * 4})
                )
                await wait_for_async(
                    "the retry launched", lambda: len(worker.engine.gates) == 2, timeout=30
                )
                worker.engine.release(2)
                reply = await again
                assert reply.status_code == 200, reply.text
                assert len(reply.json()["data"]) == 4
        finally:
            gateway.terminate()
            gateway.wait(15)

"""WorkerClient against a real gRPC server whose Embed never answers: what closing the channel
under a call means (the pool does that when a worker leaves, e.g. a pod being replaced)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest

from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.gateway.client import WorkerClient
from embedfleet.gateway.upstream import UpstreamError


async def _never(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    await asyncio.sleep(30)
    return b""


@pytest.fixture
async def address() -> AsyncIterator[str]:
    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "embedfleet.v1.Worker", {"Embed": grpc.unary_unary_rpc_method_handler(_never)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)


async def test_a_call_on_a_closed_channel_is_retryable_elsewhere(address: str) -> None:
    client = WorkerClient(address)
    call = asyncio.ensure_future(client.embed(pb.TokenBatch(), 0, timeout=20))
    await asyncio.sleep(0.5)  # the call is in flight
    await client.close()
    with pytest.raises(UpstreamError) as caught:
        await call
    assert caught.value.code == grpc.StatusCode.CANCELLED
    assert caught.value.retryable


async def test_the_callers_cancellation_stays_a_cancellation(address: str) -> None:
    client = WorkerClient(address)
    call = asyncio.ensure_future(client.embed(pb.TokenBatch(), 0, timeout=20))
    await asyncio.sleep(0.5)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await client.close()

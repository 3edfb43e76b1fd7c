"""The gRPC client for one worker (the `pool.Worker` the gateway runs with), and the
classification of its failures."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc
import grpc.aio
import numpy as np

from embedfleet.common.arrays import FloatArray
from embedfleet.common.codec import SparseVector, unpack_floats, unpack_sparse
from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.common.proto import embedfleet_pb2_grpc as pb_grpc
from embedfleet.gateway.coalescing import CPU_INFLIGHT, Coalescer, inflight_for
from embedfleet.gateway.upstream import UpstreamError

T = TypeVar("T")

_MAX_MESSAGE = 512 * 1024 * 1024
_OPTIONS = [
    ("grpc.max_send_message_length", _MAX_MESSAGE),
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
    # Notice a dead peer in seconds rather than waiting on TCP timeouts.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # Reconnect quickly to a worker that comes back on the same address.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


async def _call(call: Awaitable[T]) -> T:
    """Await a unary call, turning gRPC's error into an UpstreamError."""
    try:
        return await call
    except grpc.aio.AioRpcError as exc:
        raise UpstreamError(exc.code(), exc.details() or "") from None
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # our caller gave up (the client went away)
        # The channel was closed under the call (its worker left the pool, e.g. a pod being
        # replaced): grpc cancels the call, which says nothing about the chunk; retry it elsewhere.
        raise UpstreamError(grpc.StatusCode.CANCELLED, "the worker's channel closed") from None


@dataclass(frozen=True)
class Coalescing:
    """When Embed calls to a worker are merged (coalescing.py); `max_inflight` 0: never; None:
    as many as the worker's device wants (coalescing.inflight_for, learned from its Info)."""

    max_inflight: int | None = 0
    max_tokens: int = 8192
    max_sequences: int = 256
    #: chunks of at least this many tokens are never merged
    small_tokens: int = 512


class WorkerClient:
    def __init__(
        self,
        address: str,
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
        coalescing: Coalescing = Coalescing(),
    ) -> None:
        self.address = address
        # Interceptors only when tracing is on (tracing.py): an empty list adds no per-call cost.
        self._channel = grpc.aio.insecure_channel(
            address, options=_OPTIONS, interceptors=list(interceptors) or None
        )
        self._stub = pb_grpc.WorkerStub(self._channel)  # type: ignore[no-untyped-call]
        c = coalescing
        #: the limit follows the worker's device (its Info), not the setting
        self._by_device = c.max_inflight is None
        # Until its first Info answers, the worker takes no calls: the CPU limit is a placeholder.
        inflight = CPU_INFLIGHT if c.max_inflight is None else c.max_inflight
        self._coalescer = (
            Coalescer(self._embed, inflight, c.max_tokens, c.max_sequences, c.small_tokens)
            if inflight > 0
            else None
        )

    async def close(self) -> None:
        if self._coalescer is not None:
            self._coalescer.close()
        await self._channel.close(grace=None)

    async def embed(
        self, batch: pb.TokenBatch, dimensions: int, timeout: float, normalize: bool | None = None
    ) -> tuple[FloatArray, int]:
        if self._coalescer is not None:
            return await self._coalescer.embed(batch, dimensions, timeout, normalize)
        return await self._embed(batch, dimensions, timeout, normalize)

    async def _embed(
        self, batch: pb.TokenBatch, dimensions: int, timeout: float, normalize: bool | None
    ) -> tuple[FloatArray, int]:
        request = pb.EmbedRequest(batch=batch, dimensions=dimensions, normalize=normalize)
        reply: pb.EmbedResponse = await _call(self._stub.Embed(request, timeout=timeout))
        rows = unpack_floats(reply.embeddings, reply.count, reply.dimensions, reply.format)
        return rows.astype(np.float32, copy=False), int(reply.prompt_tokens)

    async def score(self, batch: pb.TokenBatch, timeout: float) -> tuple[FloatArray, int]:
        request = pb.ScoreRequest(batch=batch, activate=True)
        reply: pb.ScoreResponse = await _call(self._stub.Score(request, timeout=timeout))
        scores = unpack_floats(reply.scores, reply.count, 1)[:, 0]
        return scores.astype(np.float32, copy=False), int(reply.prompt_tokens)

    async def classify(
        self, batch: pb.TokenBatch, activate: bool, timeout: float
    ) -> tuple[FloatArray, int]:
        request = pb.ClassifyRequest(batch=batch, activate=activate)
        reply: pb.ClassifyResponse = await _call(self._stub.Classify(request, timeout=timeout))
        scores = unpack_floats(reply.scores, reply.count, reply.labels)
        return scores.astype(np.float32, copy=False), int(reply.prompt_tokens)

    async def sparse_embed(
        self, batch: pb.TokenBatch, top_k: int, threshold: float, timeout: float
    ) -> tuple[list[SparseVector], int]:
        request = pb.SparseEmbedRequest(batch=batch, top_k=top_k, threshold=threshold)
        call = self._stub.SparseEmbed(request, timeout=timeout)
        reply: pb.SparseEmbedResponse = await _call(call)
        rows = unpack_sparse(reply.offsets, reply.indices, reply.values, reply.count)
        return rows, int(reply.prompt_tokens)

    async def info(self, timeout: float) -> pb.InfoResponse:
        reply: pb.InfoResponse = await _call(self._stub.Info(pb.InfoRequest(), timeout=timeout))
        if self._by_device and self._coalescer is not None:
            self._coalescer.max_inflight = inflight_for(reply.device)
        return reply

"""Many small Embed calls to one worker as one gRPC message, while that worker is busy.

Each unary call costs the gateway and the worker front the same few hundred µs of Python whether it
carries one 20-token query or a hundred (docs/benchmarks: "Gateway CPU"), so under load short
queries would spend their CPU on framing. While `max_inflight` calls of small chunks (under
`small_tokens`, the gateway's --min-chunk-tokens) are in flight to a worker, the small chunks that
come next wait, merged into one TokenBatch (bytes joined, no re-encode) up to a chunk's budget
(`max_tokens`, `max_sequences`); when a call returns, the oldest merged message is sent and its
rows are cut back into each chunk's share. With fewer calls in flight a chunk is sent at once,
alone: a lone client never waits for company. Larger chunks are always sent at once and not
counted: they pay their framing well, and a long call never holds short queries up.

What a merged call keeps of a chunk's own call: a failure reaches every chunk in it as its own
`UpstreamError` (the dispatcher retries each elsewhere as before); INVALID_ARGUMENT, which one bad
chunk could cause for all, sends each chunk again alone, so only that chunk gets the 400; a chunk
whose caller gives up leaves the message (cancelling the call once no chunk still wants it).

How many calls may be in flight, unless --coalesce-inflight says: one to a worker that computes
on its CPU, two to one on an accelerator (`inflight_for`, from the device its Info reports). A
second call in flight pays only where the device computes beside the CPU: the worker packs batch
N+1 while the device runs N. A CPU engine shares its cores with the worker front, so a second call
adds a message's framing and wake-ups (a few hundred µs of the worker's CPU) for nothing; measured
on 2 cores, one in flight served 16-24% more 20-token queries/s through the real MiniLM engine at
16 clients, and cut the worker front's CPU per query by a fifth to a third with the null engine
(docs/benchmarks/gateway_cpu.md).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc

from embedfleet.common.arrays import FloatArray
from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.gateway.upstream import UpstreamError

#: (batch, dimensions, timeout, normalize) -> (rows, tokens run): one unary Embed call
Send = Callable[[pb.TokenBatch, int, float, bool | None], Awaitable[tuple[FloatArray, int]]]
Key = tuple[int, bool | None]


class _AloneError(Exception):
    """A merged call was refused as invalid: this chunk goes again on its own."""


@dataclass(eq=False, slots=True)
class _Part:
    batch: pb.TokenBatch
    count: int
    tokens: int
    future: asyncio.Future[tuple[FloatArray, int]]


@dataclass(eq=False, slots=True)
class _Message:
    key: Key
    timeout: float
    parts: list[_Part] = field(default_factory=list)
    tokens: int = 0
    task: asyncio.Task[None] | None = None

    def wanted(self) -> bool:
        return any(not p.future.done() for p in self.parts)


#: calls in flight to a worker that computes on its CPU, and to one on an accelerator
CPU_INFLIGHT = 1
ACCELERATOR_INFLIGHT = 2
#: device types (InfoResponse.device, before any ":index") that compute on the worker's CPU
CPU_DEVICES = frozenset({"", "cpu", "null"})


def inflight_for(device: str) -> int:
    """Small calls in flight to a worker whose Info reports `device` (one engine's, or several
    comma-separated) when --coalesce-inflight is unset. Pure."""
    kinds = {part.strip().split(":", 1)[0] for part in device.split(",")}
    return CPU_INFLIGHT if kinds <= CPU_DEVICES else ACCELERATOR_INFLIGHT


def cut(rows: FloatArray, counts: list[int]) -> list[FloatArray]:
    """Consecutive row blocks of `rows`, `counts` rows each (views, no copy). Pure."""
    out, start = [], 0
    for n in counts:
        out.append(rows[start : start + n])
        start += n
    return out


class Coalescer:
    def __init__(
        self,
        send: Send,
        max_inflight: int,
        max_tokens: int,
        max_sequences: int,
        small_tokens: int = 512,
    ) -> None:
        self._send = send
        self.max_inflight = max_inflight
        self.small_tokens = small_tokens
        self.max_tokens = max_tokens
        self.max_sequences = max_sequences
        #: calls of small chunks in flight (large ones are not counted: they never wait)
        self.inflight = 0
        #: messages waiting for a free slot, oldest first; the last of a key is still open
        self._waiting: deque[_Message] = deque()
        self._open: dict[Key, _Message] = {}
        self._sending: set[asyncio.Task[None]] = set()

    async def embed(
        self, batch: pb.TokenBatch, dimensions: int, timeout: float, normalize: bool | None
    ) -> tuple[FloatArray, int]:
        if len(batch.token_ids) // 4 >= self.small_tokens:
            # A chunk this large carries its own framing cost well, and a large request's chunks
            # must reach the workers together: it never waits, nor holds small ones up.
            return await self._send(batch, dimensions, timeout, normalize)
        if self.inflight < self.max_inflight and not self._waiting:
            return await self._alone(batch, dimensions, timeout, normalize)
        future: asyncio.Future[tuple[FloatArray, int]] = asyncio.get_running_loop().create_future()
        part = _Part(batch, len(batch.lengths) // 4, len(batch.token_ids) // 4, future)
        message = self._message_for((dimensions, normalize), part, timeout)
        message.parts.append(part)
        message.tokens += part.tokens
        try:
            return await part.future
        except _AloneError:
            return await self._alone(batch, dimensions, timeout, normalize)
        except asyncio.CancelledError:
            part.future.cancel()
            if message.task is not None and not message.wanted():
                message.task.cancel()  # nobody waits for it: the worker may drop the work
            raise

    async def _alone(
        self, batch: pb.TokenBatch, dimensions: int, timeout: float, normalize: bool | None
    ) -> tuple[FloatArray, int]:
        self.inflight += 1
        try:
            return await self._send(batch, dimensions, timeout, normalize)
        finally:
            self.inflight -= 1
            self._next()

    def _message_for(self, key: Key, part: _Part, timeout: float) -> _Message:
        message = self._open.get(key)
        if message is not None and (
            message.tokens + part.tokens > self.max_tokens
            or sum(p.count for p in message.parts) + part.count > self.max_sequences
        ):
            message = None
        if message is None:
            message = _Message(key, timeout)
            self._open[key] = message
            self._waiting.append(message)
        message.timeout = min(message.timeout, timeout)
        return message

    def _next(self) -> None:
        """Send waiting messages while slots are free (their chunks' callers gone: dropped)."""
        while self._waiting and self.inflight < self.max_inflight:
            message = self._waiting.popleft()
            if self._open.get(message.key) is message:
                del self._open[message.key]
            if not message.wanted():
                continue
            self.inflight += 1
            message.task = asyncio.get_running_loop().create_task(self._merged(message))
            self._sending.add(message.task)
            message.task.add_done_callback(self._sending.discard)

    async def _merged(self, message: _Message) -> None:
        parts = [p for p in message.parts if not p.future.done()]
        dimensions, normalize = message.key
        try:
            if len(parts) == 1:
                batch = parts[0].batch
            else:
                batch = pb.TokenBatch(
                    token_ids=b"".join(p.batch.token_ids for p in parts),
                    lengths=b"".join(p.batch.lengths for p in parts),
                )
            rows, _ = await self._send(batch, dimensions, message.timeout, normalize)
            if rows.shape[0] != sum(p.count for p in parts):
                raise UpstreamError(
                    grpc.StatusCode.INTERNAL, f"{rows.shape[0]} rows for {len(parts)} chunks"
                )
            shares = cut(rows, [p.count for p in parts])
        except UpstreamError as exc:
            for p in parts:
                if p.future.done():
                    continue
                if exc.code == grpc.StatusCode.INVALID_ARGUMENT and len(parts) > 1:
                    p.future.set_exception(_AloneError())
                else:
                    p.future.set_exception(UpstreamError(exc.code, exc.details))
        except asyncio.CancelledError:
            for p in parts:
                p.future.cancel()
        except Exception as exc:  # a reply that does not decode: every chunk fails alike
            for p in parts:
                if not p.future.done():
                    p.future.set_exception(exc)
        else:
            for p, share in zip(parts, shares, strict=True):
                if not p.future.done():
                    p.future.set_result((share, p.tokens))
        finally:
            self.inflight -= 1
            self._next()

    def close(self) -> None:
        """Fail the chunks still waiting as a closed channel fails calls in flight: retryable
        elsewhere (client.py's CANCELLED)."""
        while self._waiting:
            for p in self._waiting.popleft().parts:
                if not p.future.done():
                    p.future.set_exception(
                        UpstreamError(grpc.StatusCode.CANCELLED, "the worker's channel closed")
                    )
        self._open.clear()

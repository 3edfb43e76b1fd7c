"""Fanning a request's chunks out over workers, with one retry elsewhere for a chunk that failed.

A chunk that fails with UNAVAILABLE (or a broken connection) never reached a live engine, so it is
sent again to a different worker and its first worker is ejected for a while; that is how one dying
worker loses no request. Other failures are the client's (INVALID_ARGUMENT) or final.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc

from embedfleet.common.tracing import OFF, Tracer
from embedfleet.gateway import errors
from embedfleet.gateway.metrics import Metrics
from embedfleet.gateway.pool import NoWorkerError, Worker, WorkerPool
from embedfleet.gateway.splitting import Chunk
from embedfleet.gateway.upstream import UpstreamError

T = TypeVar("T")
log = logging.getLogger(__name__)

ATTEMPTS = 2


def _client_error(exc: UpstreamError, retry_after: int) -> errors.ApiError:
    if exc.code == grpc.StatusCode.INVALID_ARGUMENT:
        return errors.invalid(f"The worker rejected the input: {exc.details}")
    if exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return errors.overloaded(retry_after, "A worker's queue is full; retry later.")
    if exc.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return errors.ApiError(
            504, "A worker did not answer in time.", type="server_error", code="upstream_timeout"
        )
    return errors.ApiError(
        502, f"A worker failed ({exc.code.name}).", type="server_error", code="upstream_error"
    )


class Dispatcher:
    def __init__(
        self, pool: WorkerPool, metrics: Metrics, retry_after: int, tracer: Tracer = OFF
    ) -> None:
        self.pool = pool
        self.metrics = metrics
        self.retry_after = retry_after
        self.tracer = tracer

    def admit(self) -> None:
        """Refuse new work early when no worker is ready (503); how much work to take is
        admission.py's decision, made before this."""
        if not self.pool.ready():
            raise errors.unavailable("No ready worker.")

    async def _attempt(
        self, chunk: Chunk, call: Callable[[Worker], Awaitable[T]], tried: set[str]
    ) -> T:
        """One call on a worker not yet tried; ejects that worker if the failure says it broke."""
        with self.pool.lease(chunk.tokens, exclude=tried) as lease:
            tried.add(lease.address)
            start = time.perf_counter()
            try:
                return await lease.guard(call(lease.worker))
            except asyncio.CancelledError:
                self.metrics.cancelled_calls.inc()
                raise
            except UpstreamError as exc:
                if exc.ejects and lease.eject():
                    self.metrics.ejections.inc()
                    log.warning(
                        "worker ejected", extra={"worker": lease.address, "code": exc.code.name}
                    )
                raise
            finally:
                self.metrics.upstream_seconds.observe(time.perf_counter() - start)

    async def _one(self, chunk: Chunk, call: Callable[[Worker], Awaitable[T]]) -> T:
        tried: set[str] = set()
        busy: UpstreamError | None = None
        for attempt in range(ATTEMPTS):
            try:
                return await self._attempt(chunk, call, tried)
            except NoWorkerError:
                if busy is not None:
                    # The only worker is busy (queue full, bytes in flight): a 429 to retry
                    # later, not a 503 saying there is no worker.
                    raise _client_error(busy, self.retry_after) from None
                raise errors.unavailable("No ready worker left to take the request.") from None
            except UpstreamError as exc:
                if not exc.retryable or attempt + 1 == ATTEMPTS:
                    raise _client_error(exc, self.retry_after) from None
                if exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    busy = exc
                self.metrics.retries.inc()
        raise AssertionError("unreachable")

    async def run(
        self, chunks: Sequence[Chunk], call: Callable[[Chunk, Worker], Awaitable[T]]
    ) -> list[T]:
        """Results in chunk order. Cancelling the caller (client gone) cancels every chunk."""
        if not self.tracer.enabled:
            return await self._run(chunks, call)
        with self.tracer.span("compute") as span:
            span.set_attribute("embedfleet.chunks", len(chunks))
            return await self._run(chunks, call)

    async def _run(
        self, chunks: Sequence[Chunk], call: Callable[[Chunk, Worker], Awaitable[T]]
    ) -> list[T]:
        self.metrics.chunks_per_request.observe(len(chunks))
        if len(chunks) == 1:
            chunk = chunks[0]
            return [await self._one(chunk, functools.partial(call, chunk))]
        tasks = [
            asyncio.ensure_future(self._one(chunk, functools.partial(call, chunk)))
            for chunk in chunks
        ]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()
            # The rest are gone, their tokens no longer outstanding, before the caller answers.
            await asyncio.wait(tasks)

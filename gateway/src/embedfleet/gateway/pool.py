"""The live set of workers: one `Worker` per address, polled for readiness and load, and lent out
one call at a time through `WorkerPool.lease`, which keeps the balancer's token counts right."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Protocol, TypeVar

import grpc

from embedfleet.common.arrays import FloatArray
from embedfleet.common.codec import SparseVector
from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.gateway.admission import fleet_capacity
from embedfleet.gateway.balancer import Balancer, Endpoint
from embedfleet.gateway.client import WorkerClient
from embedfleet.gateway.upstream import UpstreamError

log = logging.getLogger(__name__)
T = TypeVar("T")


class Worker(Protocol):
    """What the gateway asks of one worker. Every failure is an `UpstreamError`."""

    async def embed(
        self, batch: pb.TokenBatch, dimensions: int, timeout: float, normalize: bool | None = None
    ) -> tuple[FloatArray, int]:
        """Rows of `batch`'s embeddings (0 `dimensions`: the model's own; `normalize` None: the
        model's default), and tokens run."""
        ...

    async def score(self, batch: pb.TokenBatch, timeout: float) -> tuple[FloatArray, int]:
        """One activated cross-encoder score per pair in `batch`, and tokens run."""
        ...

    async def classify(
        self, batch: pb.TokenBatch, activate: bool, timeout: float
    ) -> tuple[FloatArray, int]:
        """[inputs, labels] class scores (`activate`: the head's activation applied), and tokens
        run."""
        ...

    async def sparse_embed(
        self, batch: pb.TokenBatch, top_k: int, threshold: float, timeout: float
    ) -> tuple[list[SparseVector], int]:
        """Each input's SPLADE weights above `threshold`, at most `top_k` (0: all), and tokens
        run."""
        ...

    async def info(self, timeout: float) -> pb.InfoResponse:
        """Model facts, readiness and queue depth."""
        ...

    async def close(self) -> None:
        """Release the connection; calls still in flight may fail."""
        ...


WorkerFactory = Callable[[str], Worker]
"""Makes the Worker for one address: the gRPC client in production, a fake in unit tests."""


class NoWorkerError(Exception):
    """No ready worker is left outside the ones the caller excluded."""


class Lease:
    """One worker lent for one call; see `WorkerPool.lease`. A context manager of its own, not
    a generator one: it is entered once per chunk call."""

    __slots__ = ("_balancer", "_endpoint", "_hung", "_tokens", "worker")

    def __init__(
        self,
        worker: Worker,
        endpoint: Endpoint,
        balancer: Balancer,
        hung: asyncio.Future[None],
        tokens: int = 0,
    ) -> None:
        self.worker = worker
        self._endpoint = endpoint
        self._balancer = balancer
        self._hung = hung
        self._tokens = tokens

    def __enter__(self) -> Lease:
        self._endpoint.outstanding_tokens += self._tokens
        return self

    def __exit__(self, *exc: object) -> None:
        self._endpoint.outstanding_tokens -= self._tokens

    @property
    def address(self) -> str:
        return self._endpoint.address

    def eject(self) -> bool:
        """Take this worker out of rotation for a while; True unless it was out already."""
        return self._balancer.eject(self._endpoint)

    async def guard(self, call: Awaitable[T]) -> T:
        """Await `call`, but give it up with a retryable UNAVAILABLE once the pool finds the
        worker hung (its probe timed out): a stopped process never answers, and its connection
        can look alive for as long as the kernel keeps it.

        `call` runs in the caller's task: the hung signal cancels that task (a callback on the
        shared future), and the cancel is taken back here. No task and no asyncio.wait per call
        (docs/benchmarks, "Gateway CPU": they were a tenth of the gateway's CPU per query)."""
        hung = self._hung
        if hung.done():
            close = getattr(call, "close", None)
            if close is not None:
                close()  # a coroutine never awaited would warn
            raise UpstreamError(grpc.StatusCode.UNAVAILABLE, "the worker stopped answering")
        task = asyncio.current_task()
        assert task is not None
        state = [False, False]  # [hung fired and cancelled the task, the call is over]

        def stop(_: asyncio.Future[None]) -> None:
            if not state[1]:
                state[0] = True
                task.cancel()

        hung.add_done_callback(stop)
        try:
            return await call
        except asyncio.CancelledError:
            if not state[0]:
                raise
            # Ours: taken back, unless the caller was cancelled too (then it goes on up).
            if task.uncancel() > 0:
                raise
            raise UpstreamError(
                grpc.StatusCode.UNAVAILABLE, "the worker stopped answering"
            ) from None
        finally:
            state[1] = True
            hung.remove_done_callback(stop)


class WorkerPool:
    def __init__(
        self, balancer: Balancer, probe_seconds: float, connect: WorkerFactory = WorkerClient
    ) -> None:
        self._balancer = balancer
        self._probe_seconds = probe_seconds
        self._connect = connect
        self._workers: dict[str, Worker] = {}
        self._infos: dict[str, pb.InfoResponse] = {}
        self._probes: dict[str, asyncio.Task[None]] = {}
        #: set when a worker's probe fails, giving up the calls in flight there (Lease.guard)
        #: (a future, not an Event: awaiting it needs no task of its own per call)
        self._hung: dict[str, asyncio.Future[None]] = {}
        self._closing: set[asyncio.Task[None]] = set()
        #: set while ready() holds, for wait_ready (requests held while the fleet is at zero)
        self._any_ready = asyncio.Event()

    def update(self, addresses: Collection[str]) -> None:
        added, removed = self._balancer.set_addresses(addresses)
        for address in removed:
            self._probes.pop(address).cancel()
            self._infos.pop(address, None)
            self._hung.pop(address, None)
            worker = self._workers.pop(address)
            # Let calls in flight finish briefly; the rest fail over to other workers.
            task = asyncio.create_task(worker.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        for address in added:
            self._workers[address] = self._connect(address)
            self._hung[address] = asyncio.get_running_loop().create_future()
            self._probes[address] = asyncio.create_task(self._probe_loop(address))
        self._sync_ready()
        if added or removed:
            log.info(
                "workers changed",
                extra={"added": sorted(added), "removed": sorted(removed)},
            )

    def lease(self, tokens: int, exclude: Collection[str] = ()) -> Lease:
        """A worker for one call (`with pool.lease(...) as lease:`), chosen by the balancer from
        the ready ones not in `exclude`.

        `tokens` count as outstanding at that worker until the block exits, however it exits
        (an answer, an error, or the caller's cancellation), so its load is never over-counted.
        Raises NoWorkerError when there is none to choose.
        """
        endpoint = self._balancer.pick(exclude)
        if endpoint is None:
            raise NoWorkerError
        # The balancer's endpoints and the workers change together in update(), so this holds.
        worker = self._workers[endpoint.address]
        return Lease(worker, endpoint, self._balancer, self._hung[endpoint.address], tokens)

    def ready(self) -> bool:
        """At least one worker says it is ready (ejected ones too: ejection is advice)."""
        return any(e.ready for e in self._balancer.endpoints.values())

    async def wait_ready(self) -> None:
        """Returns once ready() holds (at once if it does now)."""
        while not self.ready():
            await self._any_ready.wait()

    def _sync_ready(self) -> None:
        if self.ready():
            self._any_ready.set()
        else:
            self._any_ready.clear()

    def usable_workers(self) -> int:
        """How many workers take new chunks now: ready and not ejected."""
        return len(self._balancer.usable())

    def capacity(self) -> float:
        """Measured tokens/s of the usable workers together (admission.fleet_capacity)."""
        return fleet_capacity([e.capacity for e in self._balancer.usable()])

    def queued_elsewhere(self) -> int:
        """Tokens other gateways queued at the usable workers, as of the last probes."""
        return sum(e.queued_elsewhere for e in self._balancer.usable())

    def info(self) -> pb.InfoResponse | None:
        """Model facts from any worker that has answered."""
        return next(iter(self._infos.values()), None)

    async def _probe_once(self, address: str) -> None:
        endpoint = self._balancer.endpoints.get(address)
        worker = self._workers.get(address)
        if endpoint is None or worker is None:
            return
        try:
            info = await worker.info(timeout=max(1.0, self._probe_seconds))
        except UpstreamError as exc:
            if endpoint.ready:
                log.warning(
                    "worker not answering", extra={"worker": address, "code": exc.code.name}
                )
                # Its calls in flight go elsewhere; later leases wait on a fresh event.
                self._hung[address].set_result(None)
                self._hung[address] = asyncio.get_running_loop().create_future()
            endpoint.ready = False
            self._sync_ready()
            return
        was = endpoint.ready
        previous = self._infos.get(address)
        restarted = previous is not None and previous.instance != info.instance
        endpoint.ready = info.ready and not info.draining
        endpoint.queued_tokens = int(info.queued_tokens)
        endpoint.queued_elsewhere = max(0, endpoint.queued_tokens - endpoint.outstanding_tokens)
        # The rate it sustains on the real traffic and its current share of the machine, once
        # it has been saturated; the warm-up probe's figure until then.
        endpoint.capacity = info.saturated_tokens_per_second or info.capacity_tokens_per_second
        self._infos[address] = info
        self._sync_ready()
        if restarted:
            log.info("worker restarted", extra={"worker": address, "ready": endpoint.ready})
        elif endpoint.ready != was:
            log.info("worker readiness", extra={"worker": address, "ready": endpoint.ready})
        if endpoint.ready and (restarted or not was):
            # Ejection guards against a worker that fails calls while claiming readiness; one
            # that passed its start-up checks again is a fresh process. A restart can be quicker
            # than a probe, so the process's instance tells it, not only a readiness change: the
            # killed worker of `embedfleet serve` was back in 0.5 s and then sat out its ejection.
            self._balancer.readmit(endpoint)

    async def _probe_loop(self, address: str) -> None:
        while True:
            await self._probe_once(address)
            # Poll fast while the worker is not ready, so a new or restarted replica takes
            # traffic as soon as it can.
            endpoint = self._balancer.endpoints.get(address)
            fast = endpoint is not None and not endpoint.ready
            await asyncio.sleep(min(0.2, self._probe_seconds) if fast else self._probe_seconds)

    async def close(self) -> None:
        for task in self._probes.values():
            task.cancel()
        for task in self._probes.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._probes.clear()
        await asyncio.gather(*(w.close() for w in self._workers.values()), *self._closing)
        self._workers.clear()

"""The Rust front's capacity measurement once it serves (`--capacity-measurement background`).

The engine is then the Rust engine thread's, so the probe's requests go through the extension's
own queue (`Server.probe`, by id) and are computed in their turn by `rust_front.Batches`, which
hands each result to its future here. The measurement itself is the Python front's
(`lifecycle.measure_in_background`, on an event loop of its own thread): it waits for an idle
period and yields to requests, which it learns of from the extension's count of arrivals.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from embedfleet.common.arrays import FloatArray
from embedfleet.worker.contract import WorkItem
from embedfleet.worker.lifecycle import measure_in_background
from embedfleet.worker.metrics import WorkerMetrics
from embedfleet.worker.scheduler import Budget
from embedfleet.worker.settings import WorkerSettings

log = logging.getLogger(__name__)

#: how often the extension's count of arrivals is read while a measurement waits or runs: a
#: request arriving finds the probe's queued requests skipped within this
ARRIVALS_POLL_SECONDS = 0.005


class RefusedError(Exception):
    """The extension's queue is full: it took no more probe work."""


class Front(Protocol):
    """The parts of the extension's `Server` a measurement uses (worker-front/src/lib.rs)."""

    def probe(self, id: int, tokens: int, sequences: int) -> bool: ...

    def arrivals(self) -> int: ...

    def publish(self, capacity_tokens_per_second: float, max_batch_tokens: int) -> None: ...

    def stats(self) -> dict[str, Any]: ...


class Probes:
    """Probe items queued in the extension, by id: added on the measurement's event loop,
    taken by the Rust engine thread's batch call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[WorkItem, asyncio.Future[FloatArray]]] = {}
        self._ids = itertools.count(1)

    def add(self, item: WorkItem, future: asyncio.Future[FloatArray]) -> int:
        with self._lock:
            id = next(self._ids)
            self._pending[id] = (item, future)
        return id

    def discard(self, id: int) -> None:
        with self._lock:
            self._pending.pop(id, None)

    def take(self, id: int) -> tuple[WorkItem, asyncio.Future[FloatArray]] | None:
        """`id`'s item and future; None once its submitter stopped waiting (cancelled: the
        batch skips it, as the Python front's queue drops a cancelled probe unrun)."""
        with self._lock:
            return self._pending.pop(id, None)


def resolve(future: asyncio.Future[FloatArray], result: FloatArray | BaseException) -> None:
    """Hand a probe's result (or its batch's failure) to its future, from any thread."""

    def set() -> None:
        if future.done():
            return
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)

    # Its loop closed: the measurement ended (its thread's loop with it) and no one waits.
    with contextlib.suppress(RuntimeError):
        future.get_loop().call_soon_threadsafe(set)


class QueueMeasured:
    """lifecycle.Measured over the extension's queue."""

    def __init__(
        self,
        front: Front,
        probes: Probes,
        computed: Callable[[], int],
        metrics: WorkerMetrics,
        budget: Budget,
    ) -> None:
        self.front, self._probes, self._computed = front, probes, computed
        self._metrics = metrics
        self.budget = budget
        self.arrived = asyncio.Event()

    @property
    def requests_inflight(self) -> int:
        return int(self.front.stats()["inflight"])

    async def submit(self, item: WorkItem) -> FloatArray:
        future: asyncio.Future[FloatArray] = asyncio.get_running_loop().create_future()
        id = self._probes.add(item, future)
        try:
            if not self.front.probe(id, item.tokens.total, item.tokens.count):
                if not self.front.stats()["draining"]:
                    raise RefusedError("the worker's queue is full")
                # Draining: the watcher cancels the measurement, this wait with it.
                await asyncio.get_running_loop().create_future()
            return await future
        finally:
            self._probes.discard(id)

    def computed_tokens(self) -> int:
        return self._computed()

    def publish(self, capacity: float, batches: Budget) -> None:
        self._metrics.capacity.set(capacity)
        self.front.publish(capacity, batches.max_tokens)


async def _watch(front: Front, arrived: asyncio.Event, measuring: asyncio.Task[None]) -> None:
    """Sets `arrived` whenever requests have arrived; cancels `measuring` once the worker
    drains (its queue takes no more probes)."""
    seen = front.arrivals()
    while not front.stats()["draining"]:
        await asyncio.sleep(ARRIVALS_POLL_SECONDS)
        now = front.arrivals()
        if now != seen:
            seen = now
            arrived.set()
    measuring.cancel()


async def _measure(
    settings: WorkerSettings, measured: QueueMeasured, shape: dict[str, int]
) -> None:
    measuring = asyncio.create_task(measure_in_background(settings, measured, shape))
    watcher = asyncio.create_task(_watch(measured.front, measured.arrived, measuring))
    try:
        await measuring
    except asyncio.CancelledError:
        log.info("capacity measurement stopped: the worker drains")
    except Exception:  # the worker serves on; capacity stays unmeasured (0)
        log.exception("capacity measurement failed")
    finally:
        watcher.cancel()


def start(settings: WorkerSettings, measured: QueueMeasured, shape: dict[str, int]) -> None:
    """Measure on a daemon thread of its own (it ends with the process)."""
    thread = threading.Thread(
        target=lambda: asyncio.run(_measure(settings, measured, shape)),
        name="capacity",
        daemon=True,
    )
    thread.start()

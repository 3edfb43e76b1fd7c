"""The engine thread: takes batches off the FCFS queue, launches them, hands results back.

The engine never runs on the event loop. One dedicated thread owns it (the contract allows one
caller only) and pipelines: it launches batch N+1 before waiting on batch N, so on a GPU the
device always has the next batch queued while the CPU packs the one after. With at most two
batches in flight a request waits for at most one batch ahead of its own. Results cross back to
the event loop with one `call_soon_threadsafe` per batch, not per request.

While a batch computes and nothing is queued, the engine thread sleeps until a request arrives or
a waiter thread, blocked on the batch's completion, wakes it: it used to wake every 0.5 ms to look,
which cost up to that much latency at batch 1 and CPU the whole time the device worked.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from embedfleet.common.arrays import FloatArray
from embedfleet.worker.contract import Engine, Pending, WorkItem
from embedfleet.worker.device_errors import device_lost
from embedfleet.worker.memory import Trimmer
from embedfleet.worker.metrics import WorkerMetrics
from embedfleet.worker.scheduler import Batch, Budget, DropReason, FcfsQueue
from embedfleet.worker.throughput import BusyThroughput

log = logging.getLogger(__name__)


class DroppedError(Exception):
    """The request was removed from the queue without compute."""

    def __init__(self, reason: DropReason) -> None:
        super().__init__(reason.value)
        self.reason = reason


class EngineError(Exception):
    """The engine raised while computing this request's batch."""


class DeviceLostError(EngineError):
    """The device's context is lost (a sticky CUDA error): this worker computes nothing more."""


@dataclass(eq=False, slots=True)
class Entry:
    """One queued request. `cancelled` is written by the event loop and read by the engine thread;
    a single attribute store is atomic under the GIL, and a late read only costs one wasted run."""

    item: WorkItem
    future: asyncio.Future[FloatArray]
    arrival: float
    deadline: float = math.inf
    seq: int = 0
    #: warm-up and self-check work: computed like any other, but not counted as served tokens
    internal: bool = False
    cancelled: bool = False
    #: the number of the batch it ran in, set by the engine thread at launch
    batch_no: int = 0
    #: monotonic times its batch was launched and its results were back, and that batch's size
    #: (engine thread; the worker's trace spans are drawn from them after the fact)
    launched: float = 0.0
    computed: float = 0.0
    batch_tokens: int = 0
    batch_sequences: int = 0
    tokens: int = field(init=False)
    sequences: int = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = self.item.tokens.total
        self.sequences = self.item.tokens.count

    def drop_reason(self, now: float) -> DropReason | None:
        # Deadline first: gRPC cancels the handler of an expired call too, setting `cancelled`.
        if now >= self.deadline:
            return DropReason.DEADLINE
        if self.cancelled:
            return DropReason.CANCELLED
        return None


@dataclass(slots=True)
class _Launched:
    entries: list[Entry]
    pending: Pending | None
    started: float
    tokens: int
    #: the budget cut this batch while more work waited: the worker was saturated
    saturated: bool = False
    error: BaseException | None = None


class _Waiter:
    """Blocks on one in-flight batch at a time on its own thread, then wakes the engine thread.

    Only `Pending.wait` blocks without spinning the engine thread; doing it here lets the engine
    thread sleep on its condition for either an arrival or this completion. A batch handed over
    is waited on here alone (two threads in one `wait` would both return its buffers).
    """

    def __init__(self, wake: threading.Condition) -> None:
        self._wake = wake  # the engine thread's condition
        self._lock = threading.Condition(threading.Lock())
        self._pending: Pending | None = None
        self._outcome: tuple[list[FloatArray] | None, BaseException | None] | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="engine-waiter", daemon=True)
        self._thread.start()

    def watch(self, pending: Pending) -> None:
        """Start waiting on `pending` unless it is the one already watched."""
        with self._lock:
            if self._pending is pending:
                return
            self._pending, self._outcome = pending, None
            self._lock.notify()

    def watching(self, pending: Pending | None) -> bool:
        return pending is not None and self._pending is pending

    def done(self, pending: Pending) -> bool:
        with self._lock:
            return self._pending is pending and self._outcome is not None

    def take(self, pending: Pending) -> list[FloatArray]:
        """`pending`'s results (or its error, raised), once the waiter has them."""
        with self._lock:
            while self._outcome is None:
                self._lock.wait()
            results, error = self._outcome
            self._pending = self._outcome = None
        if error is not None:
            raise error
        assert results is not None
        return results

    def close(self) -> None:
        """End the thread once it waits for work (the engine thread has ended)."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def _run(self) -> None:
        while True:
            with self._lock:
                while self._pending is None or self._outcome is not None:
                    if self._closed:
                        return
                    self._lock.wait()
                pending = self._pending
            try:
                outcome: tuple[list[FloatArray] | None, BaseException | None] = (
                    pending.wait(),
                    None,
                )
            except Exception as exc:
                outcome = (None, exc)
            with self._lock:
                self._outcome = outcome
                self._lock.notify_all()
            with self._wake:
                self._wake.notify()


class BatchRunner:
    def __init__(
        self,
        engine: Engine,
        queue: FcfsQueue[Entry],
        metrics: WorkerMetrics,
        loop: asyncio.AbstractEventLoop,
        trimmer: Trimmer | None = None,
        throughput: BusyThroughput | None = None,
        on_device_lost: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.engine = engine
        #: called once on the event loop when the engine's device is lost (device_errors)
        self._on_device_lost = on_device_lost
        #: the sticky error that lost the device; from then on batches fail without compute
        self.device_lost: BaseException | None = None
        self._trimmer = trimmer or Trimmer(0.0)
        self.metrics = metrics
        self._queue = queue
        self._loop = loop
        self._cond = threading.Condition(threading.Lock())
        self._stopping = False
        self._arrivals = 0
        self._batches = 0
        #: tokens computed so far, every request's (the capacity measurement reads it)
        self.computed_tokens = 0
        self._throughput = throughput or BusyThroughput()
        #: when the last batch finished, while the engine has had work since (None: it idled)
        self._last_done: float | None = None
        #: tokens/s over the latest saturated batches (throughput.py); 0 until seen. One float,
        #: stored whole by the engine thread and read by Info on the event loop.
        self.saturated_rate = 0.0
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        #: started on the first batch that is not done on return (a GPU's)
        self._waiter: _Waiter | None = None
        # Read at scrape time (racy by design, as queued()), not written per arrival and batch.
        metrics.queued_requests.set_function(lambda: len(self._queue))
        metrics.queued_tokens.set_function(lambda: self._queue.tokens)

    def start(self) -> None:
        self._thread.start()

    def submit(self, item: WorkItem, deadline: float = math.inf, internal: bool = False) -> Entry:
        """Queue `item` (called on the event loop); raises QueueFullError."""
        entry = Entry(item, self._loop.create_future(), time.monotonic(), deadline)
        entry.internal = internal
        with self._cond:
            self._arrivals += 1
            entry.seq = self._arrivals
            self._queue.push(entry)
            self._cond.notify()
        return entry

    def set_batch_budget(self, budget: Budget) -> None:
        """The budget of batches from now on (the one being computed keeps its size)."""
        with self._cond:
            self._queue.budget = budget

    def batch_budget(self) -> Budget:
        """The budget of the next batch (paced once capacity is measured)."""
        return self._queue.budget

    def queued(self) -> tuple[int, int]:
        """(requests, tokens) waiting; racy by design, for Info and balancing."""
        return len(self._queue), self._queue.tokens

    def stop(self) -> None:
        """Finish everything queued and in flight, then end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # --- engine thread -------------------------------------------------------------------------

    def _run(self) -> None:
        prev: _Launched | None = None
        while True:
            if prev is not None and self._complete(prev.pending):
                self._finish(prev)
                prev = None
            with self._cond:
                batch = self._queue.next_batch(time.monotonic())
                if not batch.items and not batch.dropped:
                    if prev is None:
                        if self._stopping:
                            if self._waiter is not None:
                                self._waiter.close()
                            return
                        self._last_done = None  # idle: the next batch's wait is not compute
                        self._cond.wait()
                    elif self._watch(prev.pending):
                        self._cond.wait()  # until an arrival (submit) or the batch's end
                    continue
                saturated = len(self._queue) > 0
            self._drop(batch)
            if not batch.items:
                continue
            launched = self._launch(batch, saturated)
            if prev is not None:
                self._finish(prev)
            prev = launched

    def _complete(self, pending: Pending | None) -> bool:
        """Whether a launched batch's results can be read without blocking."""
        if pending is None:
            return True
        if self._waiter is not None and self._waiter.watching(pending):
            return self._waiter.done(pending)
        return pending.ready()

    def _watch(self, pending: Pending | None) -> bool:
        """Hand an unfinished batch to the waiter (under the condition); False if it is done,
        so the caller does not sleep through a wake-up that came before it slept."""
        if pending is None:
            return False
        if self._waiter is None:
            self._waiter = _Waiter(self._cond)
        self._waiter.watch(pending)
        return not self._waiter.done(pending)

    def _results(self, pending: Pending) -> list[FloatArray]:
        if self._waiter is not None and self._waiter.watching(pending):
            return self._waiter.take(pending)
        return pending.wait()

    def _drop(self, batch: Batch[Entry]) -> None:
        if not batch.dropped:
            return
        for _, reason in batch.dropped:
            self.metrics.dropped.labels(reason.value).inc()
        self._loop.call_soon_threadsafe(_fail, [e for e, _ in batch.dropped], None, batch.dropped)

    def _launch(self, batch: Batch[Entry], saturated: bool) -> _Launched:
        self._batches += 1
        started = time.monotonic()
        for entry in batch.items:
            entry.batch_no = self._batches
            entry.launched = started
            entry.batch_tokens, entry.batch_sequences = batch.tokens, batch.sequences
            self.metrics.queue_wait.observe(started - entry.arrival)
        self.metrics.observe_batch(batch.tokens, batch.sequences)
        launched = _Launched(batch.items, None, started, batch.tokens, saturated)
        if self.device_lost is not None:
            launched.error = DeviceLostError(f"the device is lost: {self.device_lost}")
            return launched
        try:
            launched.pending = self.engine.step([e.item for e in batch.items])
        except Exception as exc:
            log.exception("engine step failed", extra={"batch": self._batches})
            launched.error = self._classified(exc)
        return launched

    def _classified(self, exc: Exception) -> Exception:
        """`exc`, or a DeviceLostError for a sticky CUDA error, reported once to the worker."""
        if not device_lost(exc):
            return exc
        if self.device_lost is None:
            self.device_lost = exc
            if self._on_device_lost is not None:
                self._loop.call_soon_threadsafe(self._on_device_lost, exc)
        return DeviceLostError(f"the device is lost: {exc}")

    def _finish(self, launched: _Launched) -> None:
        results: list[FloatArray] | None = None
        if launched.pending is not None:
            try:
                results = self._results(launched.pending)
            except Exception as exc:
                log.exception("engine results failed")
                launched.error = self._classified(exc)
        done = time.monotonic()
        self.metrics.compute.observe(done - launched.started)
        # Optional in the contract (StageTimes): an engine that reports none costs one getattr.
        self.metrics.observe_stages(getattr(launched.pending, "stages", ()))
        for entry in launched.entries:
            entry.computed = done
        if results is None or len(results) != len(launched.entries):
            error = launched.error or RuntimeError("engine returned a wrong number of results")
            self._loop.call_soon_threadsafe(_fail, launched.entries, error, None)
            self._last_done = done  # its time was spent, but on no tokens: not a sample
            return
        self.computed_tokens += launched.tokens
        self._time(launched, done)
        served = sum(e.tokens for e in launched.entries if not e.internal)
        if served:
            self.metrics.tokens.inc(served)
        self._loop.call_soon_threadsafe(_deliver, launched.entries, results)
        # After the results are on their way, so the trim delays no reply.
        self._trimmer.maybe_trim(time.monotonic())

    def _time(self, launched: _Launched, done: float) -> None:
        # Since the previous batch finished, not since this one launched: with two batches in
        # flight a launch overlaps the batch before, and completions are what the engine paces
        # (the packing between batches is the worker's cost too).
        last, self._last_done = self._last_done, done
        if launched.saturated and last is not None:
            self._throughput.add(launched.tokens, done - last)
            rate = self._throughput.rate()
            if rate > 0:
                self.saturated_rate = rate
                self.metrics.saturated.set(rate)


def _deliver(entries: list[Entry], results: list[FloatArray]) -> None:
    for entry, result in zip(entries, results, strict=True):
        if not entry.future.done():
            entry.future.set_result(result)


def _fail(
    entries: list[Entry],
    error: BaseException | None,
    dropped: list[tuple[Entry, DropReason]] | None,
) -> None:
    reasons = dict(dropped or ())
    for entry in entries:
        if entry.future.done():
            continue
        if entry in reasons:
            entry.future.set_exception(DroppedError(reasons[entry]))
        elif isinstance(error, DeviceLostError):
            entry.future.set_exception(error)
        else:
            entry.future.set_exception(EngineError(str(error)))

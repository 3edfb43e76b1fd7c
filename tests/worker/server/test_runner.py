"""The engine thread's pipelining, against a stand-in for an asynchronous (GPU) engine.

MOCK: `GatedEngine` replaces a CUDA engine, whose `step` returns before the device finishes.
There is no GPU here, and on CPU the real engine finishes inside `step`, so the overlap of batch
N+1's launch with batch N's compute can only be observed with results held back on purpose.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from embedfleet.common.codec import Tokens
from embedfleet.testing.polling import wait_for_async
from embedfleet.worker.contract import EngineInfo, GraphCounters, Pending, WorkItem
from embedfleet.worker.metrics import WorkerMetrics
from embedfleet.worker.runner import BatchRunner, DroppedError, Entry
from embedfleet.worker.scheduler import Budget, DropReason, FcfsQueue


class _Gate:
    def __init__(self, engine: GatedEngine, number: int, rows: list[npt.NDArray[np.float32]]):
        self.engine, self.number, self.rows = engine, number, rows
        self.event = threading.Event()

    def ready(self) -> bool:
        return self.event.is_set()

    def wait(self) -> list[npt.NDArray[np.float32]]:
        self.event.wait(10)
        self.engine.events.append(f"waited {self.number}")
        return self.rows


class GatedEngine:
    """Results of batch k are held until the test calls release(k)."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.gates: list[_Gate] = []
        self.info = EngineInfo("gated", "embed", 1, 16, 100, "none", "mock", "mean", False)

    def validate(self, item: WorkItem) -> None:
        pass

    def step(self, items: Sequence[WorkItem]) -> Pending:
        rows = [np.full((it.tokens.count, 1), it.tokens.ids[0], np.float32) for it in items]
        gate = _Gate(self, len(self.gates) + 1, rows)
        self.gates.append(gate)
        self.events.append(f"launched {gate.number}: {[int(it.tokens.ids[0]) for it in items]}")
        return gate

    def counters(self) -> GraphCounters:
        return GraphCounters()

    def release(self, number: int) -> None:
        self.gates[number - 1].event.set()


def _item(marker: int, tokens: int = 4) -> WorkItem:
    ids = np.full(tokens, marker, np.int32)
    return WorkItem(Tokens(ids, np.array([tokens], np.int32)))


DROPPED = "embedfleet_worker_dropped_requests"


async def _until(condition: Callable[[], bool], what: str) -> None:
    await wait_for_async(what, condition, timeout=5, interval=0.002)


async def test_next_batch_launches_while_the_previous_computes() -> None:
    engine = GatedEngine()
    queue: FcfsQueue[Entry] = FcfsQueue(Budget(8, 8, 32), 100)
    runner = BatchRunner(engine, queue, WorkerMetrics(), asyncio.get_running_loop())
    runner.start()
    a = runner.submit(_item(1))
    await _until(lambda: len(engine.gates) == 1, "batch 1 launched")
    b1, b2 = runner.submit(_item(2)), runner.submit(_item(3))
    # Batch 2 launches while batch 1 is still on the "device".
    await _until(lambda: len(engine.gates) == 2, "batch 2 launched before batch 1 finished")
    assert not a.future.done()
    c = runner.submit(_item(4))
    await asyncio.sleep(0.05)
    assert len(engine.gates) == 2, "a third batch must wait: at most two in flight"
    engine.release(1)
    await asyncio.wait_for(a.future, 5)
    # Batch 1's reply went out while batch 2 still computes; batch 3 now launches behind 2.
    assert not b1.future.done()
    await _until(lambda: len(engine.gates) == 3, "batch 3 launched once batch 1 finished")
    engine.release(2)
    engine.release(3)
    results = await asyncio.wait_for(asyncio.gather(b1.future, b2.future, c.future), 5)
    assert [int(r[0, 0]) for r in results] == [2, 3, 4]
    assert engine.events == [
        "launched 1: [1]",
        "launched 2: [2, 3]",
        "waited 1",
        "launched 3: [4]",
        "waited 2",
        "waited 3",
    ]
    runner.stop()
    assert await asyncio.to_thread(runner.join, 5)


async def test_cancelled_entry_is_dropped_before_launch() -> None:
    engine = GatedEngine()
    metrics = WorkerMetrics()
    queue: FcfsQueue[Entry] = FcfsQueue(Budget(8, 8, 32), 100)
    runner = BatchRunner(engine, queue, metrics, asyncio.get_running_loop())
    runner.start()
    first = runner.submit(_item(1))
    await _until(lambda: len(engine.gates) == 1, "batch 1 launched")
    second = runner.submit(_item(2))
    await _until(lambda: len(engine.gates) == 2, "batch 2 launched")  # two in flight now
    gone = runner.submit(_item(3))
    late = runner.submit(_item(4), deadline=time.monotonic() + 0.01)
    kept = runner.submit(_item(5))
    gone.cancelled = True
    await asyncio.sleep(0.05)
    for number in (1, 2, 3):
        await asyncio.sleep(0.01)
        if number <= len(engine.gates):
            engine.release(number)
    await asyncio.wait_for(asyncio.gather(first.future, second.future, kept.future), 5)
    assert "launched 3: [5]" in engine.events
    for entry, reason in ((gone, DropReason.CANCELLED), (late, DropReason.DEADLINE)):
        error = entry.future.exception()
        assert isinstance(error, DroppedError)
        assert error.reason is reason
    for why in ("cancelled", "deadline"):
        labels = {"reason": why}
        assert metrics.registry.get_sample_value(f"{DROPPED}_total", labels) == 1
    runner.stop()
    assert await asyncio.to_thread(runner.join, 5)


class _CountingGate(_Gate):
    """A gate that counts how often the engine thread looks at it."""

    looks = 0

    def ready(self) -> bool:
        _CountingGate.looks += 1
        return super().ready()


async def test_an_in_flight_batch_is_waited_on_not_polled() -> None:
    # Issue 36 finding 3: with a batch computing and nothing queued the engine thread woke every
    # 0.5 ms to look (~2,000 looks a second of device time, and up to 0.5 ms late at batch 1).
    # It now sleeps until an arrival or the waiter thread, blocked on the batch, wakes it.
    engine = GatedEngine()
    queue: FcfsQueue[Entry] = FcfsQueue(Budget(8, 8, 32), 100)
    runner = BatchRunner(engine, queue, WorkerMetrics(), asyncio.get_running_loop())

    def gated_step(items: Sequence[WorkItem]) -> Pending:
        rows = [np.full((it.tokens.count, 1), it.tokens.ids[0], np.float32) for it in items]
        gate = _CountingGate(engine, len(engine.gates) + 1, rows)
        engine.gates.append(gate)
        return gate

    engine.step = gated_step  # type: ignore[method-assign]
    runner.start()
    _CountingGate.looks = 0
    a = runner.submit(_item(1))
    await _until(lambda: len(engine.gates) == 1, "batch 1 launched")
    cpu0 = time.process_time()
    await asyncio.sleep(0.3)  # the "device" computes
    cpu = time.process_time() - cpu0
    assert _CountingGate.looks <= 3, f"{_CountingGate.looks} looks at an unfinished batch"
    # An arrival still launches the next batch at once, while the first computes.
    b = runner.submit(_item(2))
    await _until(lambda: len(engine.gates) == 2, "batch 2 launched")
    released = time.monotonic()
    engine.release(1)
    await asyncio.wait_for(a.future, 2)
    assert time.monotonic() - released < 0.25  # woken by the completion, not by a timer
    engine.release(2)
    assert (await asyncio.wait_for(b.future, 2))[0, 0] == 2
    # A lone in-flight batch is woken for too.
    c = runner.submit(_item(3))
    await _until(lambda: len(engine.gates) == 3, "batch 3 launched")
    engine.release(3)
    assert (await asyncio.wait_for(c.future, 2))[0, 0] == 3
    runner.stop()
    assert await asyncio.to_thread(runner.join, 5)
    print(f"process CPU while one batch computed for 0.3 s: {cpu * 1e3:.1f} ms")

from __future__ import annotations

import asyncio

from embedfleet.operator.workqueue import CHILD_CHANGED, FLEET_CHANGED, RESYNC, Key, Lanes, Queue
from embedfleet.testing.polling import wait_for_async


async def test_triggers_during_a_run_coalesce_into_one_more_run() -> None:
    runs: list[Key] = []
    gate = asyncio.Event()

    async def run(key: Key) -> bool:
        runs.append(key)
        await gate.wait()
        return True

    queue = Queue(run)
    queue.trigger(("ns", "a"))
    await asyncio.sleep(0)
    for _ in range(5):
        queue.trigger(("ns", "a"))
    queue.trigger(("ns", "b"))
    await asyncio.sleep(0)
    gate.set()
    await queue.idle()
    assert sorted(runs) == [("ns", "a"), ("ns", "a"), ("ns", "b")]


async def test_failures_retry_with_backoff() -> None:
    results = [False, False, True]
    runs = 0

    async def run(key: Key) -> bool:
        nonlocal runs
        runs += 1
        return results.pop(0)

    queue = Queue(run, min_backoff=0.01, max_backoff=0.05)
    assert [queue.backoff(n) for n in (1, 2, 3, 4)] == [0.01, 0.02, 0.04, 0.05]
    queue.trigger(("ns", "a"))
    await wait_for_async("three runs", lambda: runs == 3, timeout=1, interval=0.01)
    await queue.idle()
    assert runs == 3
    queue.cancel()


async def test_at_most_workers_run_at_once_and_every_key_runs() -> None:
    running = peak = 0
    done: list[Key] = []

    async def run(key: Key) -> bool:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.001)
        running -= 1
        done.append(key)
        return True

    queue = Queue(run, workers=3)
    for i in range(20):
        queue.trigger(("ns", str(i)))
    await queue.idle()
    assert peak == 3
    assert sorted(done) == sorted(("ns", str(i)) for i in range(20))


async def test_a_waiting_key_is_queued_once() -> None:
    runs: list[Key] = []
    gate = asyncio.Event()

    async def run(key: Key) -> bool:
        runs.append(key)
        await gate.wait()
        return True

    queue = Queue(run, workers=1)
    queue.trigger(("ns", "busy"))
    await asyncio.sleep(0)
    for _ in range(10):  # "busy" holds the only worker: these wait, coalesced
        queue.trigger(("ns", "a"))
    assert len(queue) == 1
    gate.set()
    await queue.idle()
    assert runs == [("ns", "busy"), ("ns", "a")]


async def test_more_urgent_lanes_go_first() -> None:
    runs: list[Key] = []
    gate = asyncio.Event()

    async def run(key: Key) -> bool:
        runs.append(key)
        await gate.wait()
        return True

    queue = Queue(run, workers=1)
    queue.trigger(("ns", "first"))
    await asyncio.sleep(0)
    for i in range(3):
        queue.trigger(("ns", f"resync-{i}"), RESYNC)
    queue.trigger(("ns", "child"), CHILD_CHANGED)
    queue.trigger(("ns", "changed"))
    queue.trigger(("ns", "resync-2"))  # an event on a key waiting in the resync lane promotes it
    gate.set()
    await queue.idle()
    assert runs == [
        ("ns", "first"),
        ("ns", "changed"),
        ("ns", "resync-2"),
        ("ns", "child"),
        ("ns", "resync-0"),
        ("ns", "resync-1"),
    ]


def test_lanes_keep_a_key_once_at_its_most_urgent() -> None:
    lanes = Lanes()
    assert lanes.add(("ns", "a"), RESYNC)
    assert not lanes.add(("ns", "a"), RESYNC)
    assert not lanes.add(("ns", "a"), CHILD_CHANGED)  # promoted, still one entry
    assert not lanes.add(("ns", "a"), RESYNC)  # never demoted
    assert lanes.add(("ns", "b"), RESYNC)
    assert len(lanes) == 2
    assert [lanes.pop(), lanes.pop(), lanes.pop()] == [("ns", "a"), ("ns", "b"), None]


async def test_waits_are_reported_by_lane_from_the_first_trigger() -> None:
    gate = asyncio.Event()
    waits: list[tuple[int, float]] = []

    async def run(key: Key) -> bool:
        await gate.wait()
        return True

    queue = Queue(run, workers=1, waited=lambda lane, seconds: waits.append((lane, seconds)))
    queue.trigger(("ns", "a"), RESYNC)
    await asyncio.sleep(0)  # a runs (its wait: ~0) and holds the only worker
    queue.trigger(("ns", "b"), CHILD_CHANGED)
    queue.trigger(("ns", "a"))  # during a's own run: waits for it, from now
    await asyncio.sleep(0.05)
    queue.trigger(("ns", "b"), CHILD_CHANGED)  # a repeat: b still waits from its first trigger
    gate.set()
    await queue.idle()
    # a's second run goes first: its trigger was more urgent than b's
    assert [lane for lane, _ in waits] == [RESYNC, FLEET_CHANGED, CHILD_CHANGED]
    assert waits[0][1] < 0.05
    assert waits[1][1] >= 0.05  # a's second run waited for its first
    assert waits[2][1] >= 0.05  # b waited behind both

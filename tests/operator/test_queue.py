from __future__ import annotations

import asyncio

from embedfleet.operator.workqueue import Key, Queue
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

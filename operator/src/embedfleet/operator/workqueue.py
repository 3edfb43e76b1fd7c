"""The operator's work queue: which EmbeddingDeployment to reconcile next, and when to retry.

As client-go's workqueue: a key waits in the queue at most once (a burst of watch events on one
fleet costs one reconcile, not one each), a key never runs twice at once (a trigger during a run
schedules exactly one more run), at most `workers` reconciles run at a time, and a failure retries
with exponential backoff until a run succeeds.

Three lanes, served in order: the fleet itself changed (a spec edit, an autoscaler decision), one
of its children changed (a rollout's progress), the periodic resync (nothing is known to have
changed). So a spec change never waits behind the status updates of a thousand rollouts, nor
behind a resync of every fleet.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

Key = tuple[str, str]
"""(namespace, name) of an EmbeddingDeployment."""

FLEET_CHANGED, CHILD_CHANGED, RESYNC = 0, 1, 2
"""Priorities, most urgent first."""
PRIORITIES = 3
LANE_NAMES = ("fleet", "child", "resync")
"""Each priority's name in metrics."""


class Lanes:
    """The pending keys, each at most once, the most urgent first (pure: no event loop)."""

    def __init__(self, lanes: int = PRIORITIES) -> None:
        # dicts as ordered sets: FIFO within a lane
        self._lanes: list[dict[Key, None]] = [{} for _ in range(lanes)]
        self._where: dict[Key, int] = {}

    def add(self, key: Key, priority: int = FLEET_CHANGED) -> bool:
        """Queues `key`; False when it was queued already (a more urgent add promotes it)."""
        priority = min(max(priority, 0), len(self._lanes) - 1)
        current = self._where.get(key)
        if current is not None and current <= priority:
            return False
        if current is not None:
            del self._lanes[current][key]
        self._lanes[priority][key] = None
        self._where[key] = priority
        return current is None

    def remove(self, key: Key) -> bool:
        """Unqueues `key`; False when it was not queued."""
        priority = self._where.pop(key, None)
        if priority is None:
            return False
        del self._lanes[priority][key]
        return True

    def pop(self) -> Key | None:
        entry = self.pop_entry()
        return None if entry is None else entry[0]

    def pop_entry(self) -> tuple[Key, int] | None:
        """The next key and the lane it waited in."""
        for priority, lane in enumerate(self._lanes):
            if lane:
                key = next(iter(lane))
                del lane[key]
                del self._where[key]
                return key, priority
        return None

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, key: object) -> bool:
        return key in self._where


class Queue:
    """Coalescing, single-flight per key, at most `workers` runs at once; failures retry with
    exponential backoff."""

    def __init__(
        self,
        run: Callable[[Key], Awaitable[bool]],
        min_backoff: float = 1.0,
        max_backoff: float = 60.0,
        workers: int = 4,
        waited: Callable[[int, float], None] | None = None,
    ) -> None:
        """`waited(lane, seconds)` hears, as each run starts, how long its key waited since its
        first trigger (a trigger during its own run counts from then: that run is waited for
        too), by the lane it was taken from: where a change's latency goes before its run."""
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self._run = run
        self._pending = Lanes()
        self._running: set[Key] = set()
        self._dirty: dict[Key, int] = {}
        """Keys triggered while running -> the most urgent priority of those triggers."""
        self._failures: dict[Key, int] = {}
        self._retries: dict[Key, asyncio.TimerHandle] = {}
        self._since: dict[Key, float] = {}
        """Keys triggered and not yet run -> monotonic time of the first such trigger."""
        self._waited = waited
        self._workers: set[asyncio.Task[None]] = set()
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff
        self.max_workers = workers

    def trigger(self, key: Key, priority: int = FLEET_CHANGED) -> None:
        self._since.setdefault(key, time.monotonic())
        if key in self._running:
            self._dirty[key] = min(self._dirty.get(key, priority), priority)
            return
        if self._pending.add(key, priority):
            self._spawn()

    def __len__(self) -> int:
        """Keys waiting (not counting those running)."""
        return len(self._pending)

    def backoff(self, failures: int) -> float:
        return float(min(self.max_backoff, self.min_backoff * 2 ** max(failures - 1, 0)))

    def _spawn(self) -> None:
        if len(self._workers) < self.max_workers:
            task = asyncio.get_running_loop().create_task(self._work())
            self._workers.add(task)
            task.add_done_callback(self._workers.discard)

    async def _work(self) -> None:
        while (entry := self._pending.pop_entry()) is not None:
            key, lane = entry
            since = self._since.pop(key, None)
            if self._waited is not None and since is not None:
                self._waited(lane, time.monotonic() - since)
            self._running.add(key)
            try:
                ok = await self._run(key)
            finally:
                self._running.discard(key)
            if ok:
                self._failures.pop(key, None)
            else:
                count = self._failures[key] = self._failures.get(key, 0) + 1
                if (handle := self._retries.pop(key, None)) is not None:
                    handle.cancel()
                loop = asyncio.get_running_loop()
                self._retries[key] = loop.call_later(self.backoff(count), self.trigger, key)
            if (priority := self._dirty.pop(key, None)) is not None:
                # Behind what waited meanwhile: a fleet that changes all the time starves none.
                self._pending.add(key, priority)

    async def idle(self) -> None:
        """Waits until nothing is queued or running (tests and shutdown)."""
        while self._workers:
            await asyncio.gather(*self._workers, return_exceptions=True)

    def cancel(self) -> None:
        for handle in self._retries.values():
            handle.cancel()
        for task in self._workers:
            task.cancel()

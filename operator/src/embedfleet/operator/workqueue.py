"""The operator's work queue: which EmbeddingDeployment to reconcile next, and when to retry.

Single-flight per key, as client-go's workqueue: a trigger during a run schedules exactly one
more run (a burst of watch events costs one or two reconciles, never one each), and a failure
retries with exponential backoff until a run succeeds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

Key = tuple[str, str]
"""(namespace, name) of an EmbeddingDeployment."""


class Queue:
    """Single-flight per key: a trigger during a run schedules exactly one more run; failures
    retry with exponential backoff."""

    def __init__(
        self,
        run: Callable[[Key], Awaitable[bool]],
        min_backoff: float = 1.0,
        max_backoff: float = 60.0,
    ) -> None:
        self._run = run
        self._running: dict[Key, asyncio.Task[None]] = {}
        self._dirty: set[Key] = set()
        self._failures: dict[Key, int] = {}
        self._retries: dict[Key, asyncio.TimerHandle] = {}
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff

    def trigger(self, key: Key) -> None:
        if key in self._running:
            self._dirty.add(key)
            return
        self._running[key] = asyncio.get_running_loop().create_task(self._drain(key))

    def backoff(self, failures: int) -> float:
        return float(min(self.max_backoff, self.min_backoff * 2 ** max(failures - 1, 0)))

    async def _drain(self, key: Key) -> None:
        try:
            while True:
                self._dirty.discard(key)
                ok = await self._run(key)
                if ok:
                    self._failures.pop(key, None)
                else:
                    count = self._failures[key] = self._failures.get(key, 0) + 1
                    if (handle := self._retries.pop(key, None)) is not None:
                        handle.cancel()
                    loop = asyncio.get_running_loop()
                    self._retries[key] = loop.call_later(self.backoff(count), self.trigger, key)
                if key not in self._dirty:
                    return
        finally:
            del self._running[key]

    async def idle(self) -> None:
        """Waits until no run is in flight (tests and shutdown)."""
        while self._running:
            await asyncio.gather(*self._running.values(), return_exceptions=True)

    def cancel(self) -> None:
        for handle in self._retries.values():
            handle.cancel()
        for task in self._running.values():
            task.cancel()

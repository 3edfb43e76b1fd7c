"""Holding requests while no worker is ready: how a fleet scaled to zero wakes up.

With `hold_requests` > 0 a request that arrives while no worker is ready waits (bounded in count
by `hold_requests` and in time by `hold_seconds`) instead of failing at once. The waiting requests
and their tokens are gauges on /metrics, which the operator's autoscaler scrapes: that is the
demand that scales the workers up from zero. Past either bound the answer is 503 with Retry-After.
The gateway's /ready stays OK meanwhile (`keeps_ready`), so it stays in its Service and the first
requests reach it at all.
"""

from __future__ import annotations

import asyncio
import time

from embedfleet.gateway import errors
from embedfleet.gateway.metrics import Metrics
from embedfleet.gateway.pool import WorkerPool


class Hold:
    def __init__(
        self,
        pool: WorkerPool,
        metrics: Metrics,
        max_requests: int,
        seconds: float,
        retry_after: int,
    ) -> None:
        self.pool = pool
        self.metrics = metrics
        self.max_requests = max_requests
        self.seconds = seconds
        self.retry_after = retry_after
        self.held = 0

    @property
    def keeps_ready(self) -> bool:
        """Holding is on: no ready worker is a state to wait out, not a reason to leave the
        Service (a fleet scaled to zero would otherwise never see a request again)."""
        return self.max_requests > 0

    def will_hold(self) -> bool:
        """A request arriving now would be held (rather than refused for want of a worker)."""
        return self.keeps_ready and not self.pool.ready()

    async def until_ready(self, tokens: int) -> None:
        """Returns at once while a worker is ready (or holding is off); else waits for one,
        counted in the held gauges, or raises 503 with Retry-After past the bounds."""
        if not self.will_hold():
            return
        if self.held >= self.max_requests:
            self.metrics.hold_refused.labels("full").inc()
            raise self._refusal(f"{self.held} requests are already waiting for it")
        self.held += 1
        self.metrics.held_requests.inc()
        self.metrics.held_tokens.inc(tokens)
        start = time.perf_counter()
        try:
            async with asyncio.timeout(self.seconds):
                await self.pool.wait_ready()
        except TimeoutError:
            self.metrics.hold_refused.labels("timeout").inc()
            raise self._refusal(f"none became ready within {self.seconds:g} s") from None
        finally:
            self.held -= 1
            self.metrics.held_requests.dec()
            self.metrics.held_tokens.dec(tokens)
            self.metrics.hold_seconds.observe(time.perf_counter() - start)

    def _refusal(self, why: str) -> errors.ApiError:
        return errors.ApiError(
            503,
            f"No worker is ready yet (the fleet is starting); {why}. Retry later.",
            type="server_error",
            code="no_workers",
            headers=((b"retry-after", str(self.retry_after).encode()),),
        )

"""Waiting for a condition with a deadline: the one poll loop of the tests, harness and benchmarks.

`wait_for` blocks its thread; `wait_for_async` is the same contract for code on an event loop,
where a blocking sleep would stall the very tasks being waited on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeoutError(TimeoutError):
    """The condition did not hold before the deadline."""


def _answer(what: str, result: T | None, deadline: float, timeout: float) -> T | None:
    """`result` when it is an answer (neither None nor False), else None; raises once time is up."""
    if result is not None and result is not False:
        return result
    if time.monotonic() >= deadline:
        raise WaitTimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
    return None


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.1,
) -> T:
    """Calls `probe` until it returns something other than None or False, and returns that.

    `probe` may raise to abort the wait (e.g. when a process it waits on has died).
    """
    deadline = time.monotonic() + timeout
    while True:
        answer = _answer(what, probe(), deadline, timeout)
        if answer is not None:
            return answer
        time.sleep(interval)


async def wait_for_async(
    what: str,
    probe: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.1,
) -> T:
    """`wait_for` on an event loop: sleeps with `asyncio.sleep`, so other tasks run meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        answer = _answer(what, probe(), deadline, timeout)
        if answer is not None:
            return answer
        await asyncio.sleep(interval)

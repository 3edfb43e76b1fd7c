"""Waiting for a condition with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeoutError(TimeoutError):
    """The condition did not hold before the deadline."""


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
        result = probe()
        if result is not None and result is not False:
            return result
        if time.monotonic() >= deadline:
            raise WaitTimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)

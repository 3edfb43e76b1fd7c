"""Awaiting work that something else may make pointless (a client gone, a worker hung)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any


async def finished_first(work: asyncio.Future[Any], interrupt: Awaitable[object]) -> bool:
    """Wait until `work` finishes or `interrupt` does. True if `work` finished; else it has been
    cancelled and waited for (whatever it raised on the way out is dropped). An `interrupt` that
    is a future is shared (a worker's "hung" signal): it is waited on, never cancelled, and costs
    no task."""
    stop: asyncio.Future[Any] = (
        interrupt if isinstance(interrupt, asyncio.Future) else asyncio.ensure_future(interrupt)
    )
    shared = stop is interrupt
    try:
        await asyncio.wait((work, stop), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not shared:
            stop.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await work
        elif not work.cancelled():
            # Retrieved here too: when this wait itself is cancelled nobody else will.
            work.exception()
    return not work.cancelled()

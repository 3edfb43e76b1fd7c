"""The worker's speed as its own traffic shows it: tokens/s over back-to-back saturated batches.

The warm-up probe measures capacity once, on synthetic sequences and on whatever share of the
machine the process had at that moment. The gateway's admission divides queued tokens by
capacity to bound the seconds of work it lets in, so when the share drops later (a busy node, a
noisy neighbour) or the traffic's lengths cost more per token than the probe's, the gateway lets
in more seconds of work than its bound and admitted requests run into their deadlines. A batch
cut by the budget while more work waits is the worker saturated on the real traffic: its tokens
over the time since the batch before it finished are the rate to queue by. Batches of a worker
that is not saturated say nothing about its capacity (a trickle of small batches is slow per
token), so they are left out, and the figure keeps its last value until the next saturation.
"""

from __future__ import annotations

from collections import deque

#: busy seconds the figure averages over: long enough to smooth one odd batch, short enough to
#: follow a change of the machine's share within a few batches of pacing (--max-batch-seconds)
WINDOW_SECONDS = 10.0
#: busy seconds seen before there is a figure at all
MIN_SECONDS = 2.0


class BusyThroughput:
    """Tokens over seconds of the latest saturated batches, `window` busy seconds of them."""

    def __init__(self, window: float = WINDOW_SECONDS, least: float = MIN_SECONDS) -> None:
        if not 0 < least <= window:
            raise ValueError("need 0 < least <= window")
        self._window, self._least = window, least
        self._samples: deque[tuple[int, float]] = deque()
        self._tokens = 0
        self._seconds = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        """One saturated batch: `tokens` computed in `seconds` since the previous one finished."""
        if tokens <= 0 or seconds <= 0:
            return
        self._samples.append((tokens, seconds))
        self._tokens += tokens
        self._seconds += seconds
        while len(self._samples) > 1 and self._seconds - self._samples[0][1] >= self._window:
            old_tokens, old_seconds = self._samples.popleft()
            self._tokens -= old_tokens
            self._seconds -= old_seconds

    def rate(self) -> float:
        """Tokens/s over the window; 0 until `least` busy seconds have been seen."""
        if self._seconds < self._least:
            return 0.0
        return self._tokens / self._seconds

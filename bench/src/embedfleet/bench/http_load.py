"""Closed-loop load: N clients, each sending its next request when the last one answered.

A point runs a warm-up (discarded), then measures until its deadline; requests in flight at the
deadline are allowed to finish and count, so slow systems still yield whole requests and the
throughput window ends at the last completion.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

#: one request: client index, request number -> awaitable call
Call = Callable[[int, int], Awaitable[None]]


@dataclass(frozen=True)
class Measurement:
    clients: int
    requests: int
    errors: int
    seconds: float
    tokens_per_request: int
    inputs_per_request: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    first_error: str = ""

    @property
    def requests_per_second(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.requests_per_second * self.tokens_per_request


def summarize(
    latencies: list[float],
    clients: int,
    seconds: float,
    tokens_per_request: int,
    inputs_per_request: int,
    errors: list[str],
) -> Measurement:
    """Pure: percentiles (nearest-rank on the sorted latencies, in ms) and rates."""
    ms = np.sort(np.asarray(latencies, dtype=np.float64)) * 1000.0
    p50 = float(np.percentile(ms, 50)) if len(ms) else float("nan")
    p99 = float(np.percentile(ms, 99)) if len(ms) else float("nan")
    return Measurement(
        clients=clients,
        requests=len(latencies),
        errors=len(errors),
        seconds=seconds,
        tokens_per_request=tokens_per_request,
        inputs_per_request=inputs_per_request,
        p50_ms=p50,
        p99_ms=p99,
        mean_ms=float(ms.mean()) if len(ms) else float("nan"),
        first_error=errors[0] if errors else "",
    )


async def _client(
    call: Call, index: int, deadline: float, latencies: list[float], errors: list[str]
) -> float:
    """Loop until the deadline; returns the time of this client's last completion."""
    n = 0
    last = time.perf_counter()
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        try:
            await call(index, n)
        except Exception as exc:  # a failed request is counted, never fatal to the run
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
            if len(errors) > 20:
                break  # a broken system: stop hammering it
        else:
            latencies.append(time.perf_counter() - start)
        last = time.perf_counter()
        n += 1
    return last


async def run_point(
    call: Call,
    clients: int,
    seconds: float,
    warmup_seconds: float,
    tokens_per_request: int,
    inputs_per_request: int,
    min_requests: int = 1,
) -> Measurement:
    if warmup_seconds > 0:
        deadline = time.perf_counter() + warmup_seconds
        await asyncio.gather(*(_client(call, i, deadline, [], []) for i in range(clients)))
    latencies: list[float] = []
    errors: list[str] = []
    start = time.perf_counter()
    deadline = start + seconds
    ends = await asyncio.gather(
        *(_client(call, i, deadline, latencies, errors) for i in range(clients))
    )
    # a system slower than the deadline still delivers min_requests (whole requests, not none)
    while len(latencies) < min_requests and len(errors) <= 20:
        t0 = time.perf_counter()
        try:
            await call(0, len(latencies))
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
        else:
            latencies.append(time.perf_counter() - t0)
        ends = [time.perf_counter()]
    elapsed = max(ends) - start
    return summarize(latencies, clients, elapsed, tokens_per_request, inputs_per_request, errors)

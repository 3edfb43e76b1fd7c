"""The saturated-throughput figure the worker reports (throughput.py), and the engine thread's use
of it: only batches cut by the budget while more work waited count, timed completion to
completion, so a trickle of small batches never passes for the worker's capacity."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from embedfleet.common.codec import Tokens
from embedfleet.worker.contract import EngineInfo, WorkItem
from embedfleet.worker.metrics import WorkerMetrics
from embedfleet.worker.null_engine import NullEngine
from embedfleet.worker.runner import BatchRunner, Entry
from embedfleet.worker.scheduler import Budget, FcfsQueue
from embedfleet.worker.throughput import BusyThroughput

PACE = 8000.0  # tokens/s of the paced null engine: a batch of 1,600 tokens sleeps 0.2 s
SATURATED = "embedfleet_worker_saturated_tokens_per_second"


def test_no_figure_until_enough_busy_seconds() -> None:
    t = BusyThroughput(window=10, least=2)
    t.add(1000, 1.5)
    assert t.rate() == 0
    t.add(1000, 0.5)
    assert t.rate() == pytest.approx(1000)


def test_the_window_forgets_the_oldest_batches() -> None:
    t = BusyThroughput(window=4, least=1)
    for _ in range(4):
        t.add(1000, 1.0)  # 1,000 tokens/s
    for _ in range(4):
        t.add(500, 1.0)  # the machine's share halved
    assert t.rate() == pytest.approx(500)


def test_one_batch_longer_than_the_window_is_the_figure() -> None:
    t = BusyThroughput(window=2, least=1)
    t.add(100, 1.0)
    t.add(3000, 3.0)
    assert t.rate() == pytest.approx(1000)


def test_empty_or_timeless_batches_are_not_samples() -> None:
    t = BusyThroughput(window=2, least=1)
    t.add(0, 1.0)
    t.add(100, 0.0)
    assert t.rate() == 0
    with pytest.raises(ValueError, match="least"):
        BusyThroughput(window=1, least=2)


def _runner(metrics: WorkerMetrics) -> BatchRunner:
    info = EngineInfo("null", "embed", 4, 512, 100, "none", "null", "mean", False)
    queue: FcfsQueue[Entry] = FcfsQueue(Budget(1600, 64, 6400), 1000)
    return BatchRunner(
        NullEngine(info, PACE),
        queue,
        metrics,
        asyncio.get_running_loop(),
        throughput=BusyThroughput(window=2, least=0.5),
    )


def _item() -> WorkItem:
    """800 tokens: two sequences of 400."""
    return WorkItem(Tokens(np.ones(800, np.int32), np.array([400, 400], np.int32)))


async def test_a_backlog_measures_the_engines_pace() -> None:
    metrics = WorkerMetrics()
    runner = _runner(metrics)
    runner.start()
    try:
        # 16 x 800 tokens, two per batch: 8 batches of 0.2 s, all queued at once (the first
        # may leave before the rest arrive, the last leaves none behind: 6 samples at least).
        entries = [runner.submit(_item()) for _ in range(16)]
        await asyncio.wait_for(asyncio.gather(*(e.future for e in entries)), 30)
    finally:
        runner.stop()
        assert await asyncio.to_thread(runner.join, 5)
    # A sleep lasts at least its length, so the figure cannot exceed the pace; a loaded machine
    # adds scheduling delay between batches, which is the worker's cost and may lower it.
    assert 0.5 * PACE < runner.saturated_rate <= PACE * 1.001
    assert metrics.registry.get_sample_value(SATURATED) == runner.saturated_rate


async def test_a_trickle_of_requests_is_not_saturation() -> None:
    metrics = WorkerMetrics()
    runner = _runner(metrics)
    runner.start()
    try:
        # The same work one request at a time: every batch leaves the queue empty behind it.
        for _ in range(8):
            await asyncio.wait_for(runner.submit(_item()).future, 5)
    finally:
        runner.stop()
        assert await asyncio.to_thread(runner.join, 5)
    assert runner.saturated_rate == 0
    assert metrics.registry.get_sample_value(SATURATED) == 0

"""The warm-up probe's window: a full batch on a fast device, time-bounded on a slow one."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from embedfleet.common.arrays import FloatArray
from embedfleet.worker import warmup
from embedfleet.worker.contract import WorkItem
from embedfleet.worker.warmup import probe_window


def test_fast_device_probes_a_whole_batch_budget() -> None:
    # Finding 8: the window was capped at 8,192 tokens, a quarter of a 32k GPU batch budget.
    assert probe_window(5e6, 2.0, 32768) == 32768
    assert probe_window(5e6, 2.0, 65536) == 65536


def test_slow_device_window_is_bounded_by_time() -> None:
    assert probe_window(4000.0, 2.0, 32768) == 2000
    assert probe_window(0.0, 2.0, 32768) == 1


def test_capacity_probe_keeps_two_full_batches_outstanding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A fake device at 1M tokens/s on a fake clock: the outcome cannot depend on the machine.
    now = [0.0]
    monkeypatch.setattr(warmup.time, "monotonic", lambda: now[0])
    outstanding: list[int] = []
    live = 0

    async def submit(item: WorkItem) -> FloatArray:
        nonlocal live
        live += item.total_tokens
        outstanding.append(live)
        await asyncio.sleep(0)
        now[0] += item.total_tokens * 1e-6
        live -= item.total_tokens
        return np.zeros((item.tokens.count, 4), np.float32)

    rate = asyncio.run(
        warmup.measure_capacity(
            submit, vocab_size=30522, max_input_tokens=512, max_batch_tokens=32768, seconds=0.2
        )
    )
    assert rate > 0
    assert max(outstanding) >= 2 * 32768  # not 2 x 8,192

"""The capacity measurement after SERVING: it yields to real requests and counts their tokens."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from embedfleet.common.arrays import FloatArray
from embedfleet.worker import warmup
from embedfleet.worker.contract import WorkItem
from embedfleet.worker.warmup import MAX_INTERRUPTIONS, yields_to_traffic

SHAPE = {"vocab_size": 30522, "max_input_tokens": 512, "max_batch_tokens": 1024}


class FakeDevice:
    """A device at `rate` tokens/s on a fake clock; records what it was asked and what ran."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, rate: float) -> None:
        self.now = 0.0
        self.rate = rate
        self.submitted = 0
        self.computed = 0
        self.cancelled = 0
        self.engine = asyncio.Lock()  # one batch at a time; the others queue behind it
        monkeypatch.setattr(warmup.time, "monotonic", lambda: self.now)

    async def submit(self, item: WorkItem) -> FloatArray:
        self.submitted += 1
        try:
            async with self.engine:
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.now += item.total_tokens / self.rate
        self.computed += item.total_tokens
        return np.zeros((item.tokens.count, 4), np.float32)


def test_a_measurement_yields_until_its_interruptions_run_out() -> None:
    assert all(yields_to_traffic(n) for n in range(MAX_INTERRUPTIONS))
    assert not yields_to_traffic(MAX_INTERRUPTIONS)


def test_warm_up_is_one_probe_request(monkeypatch: pytest.MonkeyPatch) -> None:
    device = FakeDevice(monkeypatch, 1e5)
    asyncio.run(warmup.warm_up(device.submit, **SHAPE))
    assert device.submitted == 1
    assert device.computed == 512


def test_a_request_arriving_stops_the_measurement_and_drops_its_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    device = FakeDevice(monkeypatch, 1e5)

    async def main() -> float | None:
        stop = asyncio.Event()
        measuring = asyncio.create_task(
            warmup.measure_capacity(device.submit, **SHAPE, seconds=10.0, stop=stop)
        )
        while device.submitted < 10:  # the probe is well under way
            await asyncio.sleep(0)
        stop.set()
        return await measuring

    assert asyncio.run(main()) is None
    assert device.cancelled > 0  # its queued requests were given up, not left ahead of the real one
    # Stopped long before its 10 s (fake clock) of probing.
    assert device.now < 1.0


def test_real_tokens_in_the_window_count_towards_capacity(monkeypatch: pytest.MonkeyPatch) -> None:
    # The engine computes 1e5 tokens/s; a third of them are real requests' (never seen by
    # `submit`): counting only the probe's own would measure two thirds of the device.
    def measured(count_all: bool) -> float | None:
        device = FakeDevice(monkeypatch, 1e5)
        real = [0]

        async def shared(item: WorkItem) -> FloatArray:
            result = await device.submit(item)
            real[0] += item.total_tokens // 2
            device.now += item.total_tokens / 2 / device.rate
            return result

        def computed() -> int:
            return device.computed + real[0]

        return asyncio.run(
            warmup.measure_capacity(
                shared, **SHAPE, seconds=0.5, computed=computed if count_all else None
            )
        )

    alone, counted = measured(False), measured(True)
    assert alone is not None
    assert counted is not None
    assert alone == pytest.approx(1e5 * 2 / 3, rel=0.05)
    assert counted == pytest.approx(1e5, rel=0.05)


def test_a_worker_that_finds_no_idle_period_measures_through_its_traffic() -> None:
    # Loaded from its first second, a worker never saw a run start, so none was ever stopped:
    # counting stopped runs alone left it unmeasured for good.
    assert not yields_to_traffic(0, found_idle=False)
    assert yields_to_traffic(0, found_idle=True)


def test_waiting_for_idle_gives_up_after_its_patience() -> None:
    from types import SimpleNamespace

    from embedfleet.worker import lifecycle

    async def wait(inflight: int) -> bool:
        state = SimpleNamespace(requests_inflight=inflight, arrived=asyncio.Event())
        # The outer bound only turns a wait that never ends (the bug) into a failure.
        return await asyncio.wait_for(lifecycle._idle_for(state, 0.05, 0.2), 10)  # type: ignore[arg-type]

    assert asyncio.run(wait(0)) is True
    assert asyncio.run(wait(1)) is False


def test_a_yielding_measurement_on_a_slow_device_runs_short_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 38: on a 2-core CPU the first request after an idle second waited 0.3-0.6 s behind
    # the probe's full batch. At 2,000 tokens/s a yielding probe keeps requests of at most
    # YIELD_BATCH_SECONDS of work, two outstanding, and still measures the device's rate.
    device = FakeDevice(monkeypatch, 2000.0)
    sizes: list[int] = []
    in_flight = [0, 0]  # now, most

    async def submit(item: WorkItem) -> FloatArray:
        sizes.append(item.total_tokens)
        in_flight[0] += 1
        in_flight[1] = max(in_flight)
        try:
            return await device.submit(item)
        finally:
            in_flight[0] -= 1

    stop = asyncio.Event()  # never set: no request arrives
    rate = asyncio.run(warmup.measure_capacity(submit, **SHAPE, seconds=1.0, stop=stop))
    assert sizes[0] == warmup.ROUGH_TOKENS  # the rough rate (warm_up paid the one-off costs)
    assert max(sizes[1:]) <= 2000 * warmup.YIELD_BATCH_SECONDS
    assert in_flight[1] == warmup.YIELD_OUTSTANDING
    assert rate == pytest.approx(2000.0, rel=0.05)
    # A device that runs a probe request within the bound (a GPU) probes with full batches.
    assert warmup.yielding_request_tokens(1e6, 512) is None

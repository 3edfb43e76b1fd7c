"""The dispatcher alone, over in-memory FAKE workers (fakes.InMemoryFakeWorker): admission, retry
on another worker, ejection, the error each failure becomes, and cancellation of a request's
chunks. test_dispatch.py covers the same paths through the HTTP app and gRPC."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from embedfleet.common.arrays import FloatArray
from embedfleet.common.codec import pack_tokens
from embedfleet.gateway.dispatcher import Dispatcher
from embedfleet.gateway.errors import ApiError
from embedfleet.gateway.metrics import Metrics
from embedfleet.gateway.pool import Worker
from embedfleet.gateway.splitting import Chunk, join

from .fakes import InMemoryFleet

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


@pytest.fixture
async def fleet() -> AsyncIterator[InMemoryFleet]:
    async with InMemoryFleet(2) as fleet:
        yield fleet


def _dispatcher(fleet: InMemoryFleet) -> Dispatcher:
    return Dispatcher(fleet.pool, Metrics(lambda: fleet.balancer), retry_after=3)


def _count(dispatcher: Dispatcher, name: str) -> float:
    return dispatcher.metrics.registry.get_sample_value(name) or 0.0


async def _embed(dispatcher: Dispatcher, inputs: list[list[int]]) -> FloatArray:
    """One chunk per input; the rows in input order."""
    chunks = [Chunk(i, i + 1, len(ids)) for i, ids in enumerate(inputs)]

    async def call(chunk: Chunk, worker: Worker) -> FloatArray:
        rows, _ = await worker.embed(pack_tokens(inputs[chunk.start : chunk.stop]), 0, 5)
        return rows

    return join(await dispatcher.run(chunks, call))


async def _on_w0_first(fleet: InMemoryFleet, dispatcher: Dispatcher) -> FloatArray:
    """Embeds one input while w1 carries load, so the balancer tries w0 first."""
    with fleet.pool.lease(1000, exclude={"w0"}):
        return await _embed(dispatcher, [[5, 6]])


async def test_unavailable_chunk_is_retried_elsewhere_and_its_worker_ejected(
    fleet: InMemoryFleet,
) -> None:
    d = _dispatcher(fleet)
    fleet.fakes["w0"].failures = [UNAVAILABLE] * 100
    rows = await _on_w0_first(fleet, d)
    assert rows.tolist() == [[5, 6, 2, 1]]  # answered by worker 1
    assert (fleet.fakes["w0"].calls, fleet.fakes["w1"].calls) == ([1], [1])
    assert _count(d, "embedfleet_gateway_retries_total") == 1
    assert _count(d, "embedfleet_gateway_worker_ejections_total") == 1
    assert _count(d, "embedfleet_gateway_upstream_seconds_count") == 2  # per attempt
    assert fleet.outstanding() == {"w0": 0, "w1": 0}
    # Out of rotation: later chunks all go to the healthy worker, first time.
    rows = await _embed(d, [[i, i] for i in range(1, 9)])
    assert rows[:, 0].tolist() == list(range(1, 9))
    assert set(rows[:, 3].tolist()) == {1}
    assert fleet.fakes["w0"].calls == [1]
    assert _count(d, "embedfleet_gateway_retries_total") == 1


@pytest.mark.parametrize("code", [grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED])
async def test_busy_or_cancelled_is_retried_without_ejecting(
    fleet: InMemoryFleet, code: grpc.StatusCode
) -> None:
    d = _dispatcher(fleet)
    fleet.fakes["w0"].failures = [code]
    rows = await _on_w0_first(fleet, d)
    assert rows.tolist() == [[5, 6, 2, 1]]
    assert _count(d, "embedfleet_gateway_retries_total") == 1
    assert _count(d, "embedfleet_gateway_worker_ejections_total") == 0
    assert fleet.pool.usable_workers() == 2


@pytest.mark.parametrize(
    ("code", "status", "error_code"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, 400, None),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 504, "upstream_timeout"),
        (grpc.StatusCode.INTERNAL, 502, "upstream_error"),
    ],
)
async def test_final_failures_are_not_retried(
    fleet: InMemoryFleet, code: grpc.StatusCode, status: int, error_code: str | None
) -> None:
    d = _dispatcher(fleet)
    fleet.fakes["w0"].failures = [code]
    with pytest.raises(ApiError) as caught:
        await _on_w0_first(fleet, d)
    assert (caught.value.status, caught.value.code) == (status, error_code)
    assert fleet.fakes["w1"].calls == []
    assert _count(d, "embedfleet_gateway_retries_total") == 0
    assert _count(d, "embedfleet_gateway_worker_ejections_total") == 0
    assert fleet.outstanding() == {"w0": 0, "w1": 0}


async def test_a_chunk_gets_one_retry_only(fleet: InMemoryFleet) -> None:
    d = _dispatcher(fleet)
    for fake in fleet.fakes.values():
        fake.failures = [UNAVAILABLE]
    with pytest.raises(ApiError) as caught:
        await _embed(d, [[5, 6]])
    assert (caught.value.status, caught.value.code) == (502, "upstream_error")
    assert (fleet.fakes["w0"].calls, fleet.fakes["w1"].calls) == ([1], [1])
    assert _count(d, "embedfleet_gateway_retries_total") == 1
    assert _count(d, "embedfleet_gateway_worker_ejections_total") == 2
    assert fleet.outstanding() == {"w0": 0, "w1": 0}


async def test_retry_with_no_other_worker_is_a_503() -> None:
    async with InMemoryFleet(1) as fleet:
        d = _dispatcher(fleet)
        fleet.fakes["w0"].failures = [UNAVAILABLE]
        with pytest.raises(ApiError) as caught:
            await _embed(d, [[5, 6]])
        assert (caught.value.status, caught.value.code) == (503, "no_workers")
        assert _count(d, "embedfleet_gateway_retries_total") == 1


async def test_a_busy_only_worker_is_a_429_and_stays_in_rotation() -> None:
    """RESOURCE_EXHAUSTED (its queue or its bytes in flight full) says busy, not gone."""
    async with InMemoryFleet(1) as fleet:
        d = _dispatcher(fleet)
        fleet.fakes["w0"].failures = [grpc.StatusCode.RESOURCE_EXHAUSTED]
        with pytest.raises(ApiError) as caught:
            await _embed(d, [[5, 6]])
        assert (caught.value.status, caught.value.code) == (429, "overloaded")
        assert (b"retry-after", b"3") in caught.value.headers
        assert _count(d, "embedfleet_gateway_worker_ejections_total") == 0
        assert fleet.pool.usable_workers() == 1
        assert (await _embed(d, [[5, 6]])).shape[0] == 1


async def test_dispatcher_refuses_without_ready_workers() -> None:
    """The 503 stays here; the 429 is admission's (test_admission.py), decided before this."""
    fleet = InMemoryFleet(2)
    for fake in fleet.fakes.values():
        fake.ready = False
    async with fleet:
        d = _dispatcher(fleet)
        with pytest.raises(ApiError) as caught:
            d.admit()
        assert (caught.value.status, caught.value.code) == (503, "no_workers")
        fleet.balancer.endpoints["w0"].ready = True  # as its next probe would say
        d.admit()


async def test_cancelling_a_request_cancels_its_chunks_and_frees_their_tokens(
    fleet: InMemoryFleet,
) -> None:
    d = _dispatcher(fleet)
    request = await fleet.stalled(_embed(d, [[1, 2], [3, 4], [5, 6]]))
    # The chunks' tasks all start in one turn of the loop, so each is at its gate by now.
    assert sum(fleet.outstanding().values()) == 6
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    assert fleet.cancelled() == 3
    assert fleet.outstanding() == {"w0": 0, "w1": 0}


async def test_a_failed_chunk_cancels_the_rest_of_its_request(fleet: InMemoryFleet) -> None:
    d = _dispatcher(fleet)
    gate = asyncio.Event()
    for fake in fleet.fakes.values():
        fake.gate = gate
    # One chunk lands on w0 and fails there; the other stalls, on either worker.
    fleet.fakes["w0"].failures = [grpc.StatusCode.INVALID_ARGUMENT]
    with pytest.raises(ApiError) as caught:
        await _embed(d, [[1, 2], [3, 4]])
    assert caught.value.status == 400
    await asyncio.sleep(0)  # the stalled chunk takes its cancellation on the loop's next turn
    assert fleet.cancelled() == 1
    assert fleet.outstanding() == {"w0": 0, "w1": 0}
    # The gateway's own record of the call it gave up, whether or not a worker saw it.
    assert _count(d, "embedfleet_gateway_cancelled_calls_total") == 1

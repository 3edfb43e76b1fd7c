"""The worker pool alone, over in-memory FAKE workers (fakes.InMemoryFakeWorker): leasing and its
outstanding-token bookkeeping, probing, and the workers' lifecycle as addresses come and go."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from embedfleet.common.codec import pack_tokens
from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.gateway.pool import NoWorkerError
from embedfleet.gateway.upstream import UpstreamError

from .fakes import InMemoryFleet


@pytest.fixture
async def fleet() -> AsyncIterator[InMemoryFleet]:
    async with InMemoryFleet(2) as fleet:
        yield fleet


async def test_a_lease_counts_its_tokens_until_the_block_ends(fleet: InMemoryFleet) -> None:
    with fleet.pool.lease(30) as first:
        assert fleet.outstanding()[first.address] == 30
        # The lighter of the two takes the next lease.
        with fleet.pool.lease(5) as second:
            assert second.address != first.address
            assert fleet.outstanding() == {first.address: 30, second.address: 5}
        assert fleet.outstanding()[second.address] == 0
    assert fleet.outstanding() == {"w0": 0, "w1": 0}


async def test_a_lease_releases_its_tokens_when_the_call_raises(fleet: InMemoryFleet) -> None:
    with pytest.raises(RuntimeError, match="boom"), fleet.pool.lease(30):
        raise RuntimeError("boom")
    assert fleet.outstanding() == {"w0": 0, "w1": 0}


async def test_a_lease_releases_its_tokens_when_the_caller_is_cancelled(
    fleet: InMemoryFleet,
) -> None:
    async def call() -> None:
        with fleet.pool.lease(30) as lease:
            await lease.worker.embed(pack_tokens([[1, 2, 3]]), 0, timeout=5)

    task = await fleet.stalled(call())
    assert sorted(fleet.outstanding().values()) == [0, 30]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fleet.cancelled() == 1
    assert fleet.outstanding() == {"w0": 0, "w1": 0}


async def test_a_lease_hands_out_that_workers_connection(fleet: InMemoryFleet) -> None:
    with fleet.pool.lease(1, exclude={"w0"}) as lease:
        assert lease.address == "w1"
        rows, tokens = await lease.worker.embed(pack_tokens([[7, 8, 9]]), 0, timeout=5)
    assert rows.tolist() == [[7, 9, 3, 1]]  # first id, last id, length, worker number
    assert tokens == 3
    assert fleet.fakes["w1"].calls == [1]
    assert fleet.fakes["w0"].calls == []


async def test_no_lease_when_every_ready_worker_is_excluded(fleet: InMemoryFleet) -> None:
    with pytest.raises(NoWorkerError), fleet.pool.lease(1, exclude={"w0", "w1"}):
        pytest.fail("leased an excluded worker")
    assert fleet.outstanding() == {"w0": 0, "w1": 0}


async def test_ejected_worker_is_leased_only_as_a_last_resort(fleet: InMemoryFleet) -> None:
    with fleet.pool.lease(1, exclude={"w1"}) as lease:
        assert lease.eject() is True
        assert lease.eject() is False  # already out: counted once
    assert fleet.pool.usable_workers() == 1
    for _ in range(10):
        with fleet.pool.lease(1) as lease:
            assert lease.address == "w1"
    with fleet.pool.lease(1, exclude={"w1"}) as lease:
        assert lease.address == "w0"  # ejection is advice: better than no worker at all


async def test_probe_answers_decide_readiness_load_and_model_facts() -> None:
    fleet = InMemoryFleet(2)
    fleet.fakes["w0"].ready = False
    fleet.fakes["w1"].queued_tokens = 500
    fleet.fakes["w1"].capacity = 2000.0
    try:
        await fleet.connect(["w0"])  # w1 only later
        assert not fleet.pool.ready()
        with pytest.raises(NoWorkerError), fleet.pool.lease(1):
            pass
        info = fleet.pool.info()
        assert info is not None
        assert info.dimensions == 4
        await fleet.connect(["w0", "w1"])
        assert fleet.pool.ready()
        assert fleet.pool.usable_workers() == 1
        # Admission's inputs: the only usable worker's queue (none of it this gateway's) and its
        # measured capacity.
        assert fleet.pool.queued_elsewhere() == 500
        assert fleet.pool.capacity() == 2000.0
        with fleet.pool.lease(300):
            await fleet.pool._probe_once("w1")
            assert fleet.pool.queued_elsewhere() == 200  # 300 of the 500 are this gateway's
        # Once the worker reports the rate it sustained saturated on real traffic, admission
        # queues by that instead of the warm-up probe's figure.
        fleet.fakes["w1"].saturated = 1500.0
        await fleet.pool._probe_once("w1")
        assert fleet.pool.capacity() == 1500.0
    finally:
        await fleet.pool.close()


async def test_removed_workers_are_closed_and_leave_no_state(fleet: InMemoryFleet) -> None:
    fleet.pool.update(["w1"])
    assert set(fleet.balancer.endpoints) == {"w1"}
    await asyncio.sleep(0)  # the close task, scheduled first, runs to its end in this turn
    assert fleet.fakes["w0"].closed
    assert not fleet.fakes["w1"].closed
    for _ in range(10):
        with fleet.pool.lease(1) as lease:
            assert lease.address == "w1"
    await fleet.pool.close()
    assert fleet.fakes["w1"].closed


async def test_a_restarted_worker_is_readmitted_at_its_first_probe(fleet: InMemoryFleet) -> None:
    """A worker that restarts between two probes never looks unready to the pool; its new
    instance is what ends the ejection its old process earned."""
    with fleet.pool.lease(1, exclude={"w1"}) as lease:
        assert lease.eject() is True
    await fleet.pool._probe_once("w0")
    assert fleet.pool.usable_workers() == 1  # the same process: it sits its ejection out
    fleet.fakes["w0"].instance = "second"
    await fleet.pool._probe_once("w0")
    assert fleet.pool.usable_workers() == 2


async def _hang(fleet: InMemoryFleet, address: str) -> None:
    """The pool's probe of `address` times out: the pool finds that worker hung."""

    async def no_answer(timeout: float) -> pb.InfoResponse:
        raise UpstreamError(grpc.StatusCode.DEADLINE_EXCEEDED, "probe timed out")

    fleet.fakes[address].info = no_answer  # type: ignore[method-assign]
    await fleet.pool._probe_once(address)


async def _guarded_call(fleet: InMemoryFleet) -> object:
    """One guarded call on w0."""
    with fleet.pool.lease(30, exclude={"w1"}) as lease:
        return await lease.guard(lease.worker.embed(pack_tokens([[1, 2, 3]]), 0, timeout=5))


async def test_a_guarded_call_on_a_worker_found_hung_gives_up_retryably(
    fleet: InMemoryFleet,
) -> None:
    task = await fleet.stalled(_guarded_call(fleet))
    await _hang(fleet, "w0")
    with pytest.raises(UpstreamError) as failure:
        await task
    assert failure.value.code == grpc.StatusCode.UNAVAILABLE
    assert failure.value.retryable
    assert fleet.cancelled() == 1  # the stalled call itself was given up
    assert task.cancelling() == 0  # the hung signal's cancel was taken back
    assert fleet.outstanding() == {"w0": 0, "w1": 0}


async def test_a_hung_signal_after_the_answer_leaves_the_caller_alone(
    fleet: InMemoryFleet,
) -> None:
    async def call() -> str:
        with fleet.pool.lease(1, exclude={"w1"}) as lease:
            await lease.guard(lease.worker.embed(pack_tokens([[1, 2]]), 0, timeout=5))
        await _hang(fleet, "w0")  # fires the signal this call listened to
        await asyncio.sleep(0.01)  # its callbacks have run by now
        return "finished"

    assert await asyncio.wait_for(call(), 5) == "finished"


async def test_a_guarded_call_whose_caller_is_cancelled_stays_cancelled(
    fleet: InMemoryFleet,
) -> None:
    task = await fleet.stalled(_guarded_call(fleet))
    task.cancel()  # the client went away ...
    await _hang(fleet, "w0")  # ... and the worker was found hung in the same turn
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fleet.outstanding() == {"w0": 0, "w1": 0}


async def test_a_call_on_a_worker_already_found_hung_is_refused(fleet: InMemoryFleet) -> None:
    with fleet.pool.lease(1, exclude={"w1"}) as lease:
        await _hang(fleet, "w0")
        with pytest.raises(UpstreamError) as failure:
            await lease.guard(lease.worker.embed(pack_tokens([[1, 2]]), 0, timeout=5))
    assert failure.value.code == grpc.StatusCode.UNAVAILABLE
    assert fleet.fakes["w0"].calls == []

"""A client that goes away cancels its request's work: through the connection's `Peer`
signal behind the gateway's own server (no task per request), through a watcher task on
`receive()` under any other ASGI server. Both are app._unless_gone's; the real-server path end to
end is test_dispatch's test_client_disconnect_cancels_chunks."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from embedfleet.gateway.app import _unless_gone
from embedfleet.gateway.connection import PEER, Peer


class Work:
    """A request's work that waits until released, and records how it ended."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = False

    async def run(self) -> str:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return "answer"


def _scope(cycle: Any) -> tuple[dict[str, Any], Peer]:
    signal = Peer(cycle)
    return {"extensions": {PEER: signal}}, signal


async def _never() -> dict[str, Any]:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def test_the_connections_signal_cancels_the_work_and_the_request_answers_499() -> None:
    cycle = SimpleNamespace(disconnected=False, response_complete=False)
    scope, signal = _scope(cycle)
    work = Work()

    async def request() -> tuple[tuple[bool, Any], int]:
        result = await _unless_gone(work.run(), _never, scope)
        task = asyncio.current_task()
        assert task is not None
        return result, task.cancelling()

    task = asyncio.ensure_future(request())
    await work.started.wait()
    assert signal.callback is not None  # listening while the work runs, with no task of its own
    assert len(asyncio.all_tasks()) == 2  # this test's and the request's
    cycle.disconnected = True
    signal.callback()
    assert await task == ((False, None), 0)  # the cancel was taken back: the task answers 499
    assert work.cancelled
    assert signal.callback is None


async def test_a_request_whose_client_already_left_never_starts_its_work() -> None:
    scope, _ = _scope(SimpleNamespace(disconnected=True, response_complete=False))
    work = Work()
    assert await _unless_gone(work.run(), _never, scope) == (False, None)
    assert not work.started.is_set()


async def test_an_answer_leaves_no_callback_behind() -> None:
    scope, signal = _scope(SimpleNamespace(disconnected=False, response_complete=False))
    work = Work()
    work.release.set()
    assert await _unless_gone(work.run(), _never, scope) == (True, "answer")
    assert signal.callback is None


async def test_under_another_server_a_watcher_on_receive_cancels_the_work() -> None:
    left = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await left.wait()
        return {"type": "http.disconnect"}

    work = Work()
    task = asyncio.ensure_future(_unless_gone(work.run(), receive, {}))
    await work.started.wait()
    left.set()
    assert await task == (False, None)
    assert work.cancelled


async def test_under_another_server_an_answer_stops_the_watcher() -> None:
    work = Work()
    work.release.set()
    before = len(asyncio.all_tasks())
    assert await _unless_gone(work.run(), _never, {}) == (True, "answer")
    await asyncio.sleep(0)  # the cancelled watcher finishes
    assert len(asyncio.all_tasks()) == before

"""Blocking API calls from the event loop: abandoned on cancel, refused after close, and the lease
never renewed after its release (the pieces of a prompt SIGTERM; test_shutdown.py is the whole)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from kubernetes import client

from embedfleet.operator.kube import Kube, KubeClosedError, in_daemon_thread
from embedfleet.operator.leader import LeaderElector

from .fakes import InMemoryLeases


async def test_results_and_errors_pass_through() -> None:
    assert await in_daemon_thread(lambda a, b=0: a + b, 2, b=3) == 5
    with pytest.raises(ZeroDivisionError):
        await in_daemon_thread(lambda: 1 / 0)


async def test_cancelling_abandons_a_blocked_call_on_a_daemon_thread() -> None:
    release = threading.Event()
    threads: list[threading.Thread] = []

    def blocked() -> str:
        threads.append(threading.current_thread())
        release.wait(10)
        return "late"

    task = asyncio.create_task(in_daemon_thread(blocked))
    while not threads:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 1)  # at once, though the call is still blocked
    assert threads[0].is_alive()
    assert threads[0].daemon  # so the interpreter's exit does not wait for it
    release.set()
    threads[0].join(5)
    await asyncio.sleep(0.05)  # its late answer goes nowhere, without an error


async def test_a_closed_client_refuses_every_request() -> None:
    kube = Kube(client.ApiClient(client.Configuration()))
    kube.close()
    with pytest.raises(KubeClosedError):
        await kube.call(kube.get, "/api/v1/namespaces")


def test_release_waits_for_a_renewal_in_flight_and_none_follows_it() -> None:
    leases = InMemoryLeases()
    elector = LeaderElector(leases, "ns", "lease", "me", 15.0)  # type: ignore[arg-type]
    assert elector.try_acquire()
    assert leases.lease is not None

    # A renewal abandoned by the cancelled renew loop, stuck in its GET.
    leases.hold_next_get()
    renewal = threading.Thread(target=elector.try_acquire, daemon=True)
    renewal.start()
    assert leases.held.wait(5)
    released = threading.Thread(target=elector.release, daemon=True)
    released.start()
    released.join(0.2)
    assert released.is_alive(), "the release must wait for the renewal in flight"
    leases.go_on.set()
    renewal.join(5)
    released.join(5)
    assert leases.lease["spec"]["holderIdentity"] is None
    assert not elector.try_acquire()
    assert leases.lease["spec"]["holderIdentity"] is None

"""The worker's machine defaults: threads from the usable cores, the OpenMP wait policy for them."""

from __future__ import annotations

import asyncio

import uvloop

from embedfleet.worker.cli import fit_machine, loop_factory
from embedfleet.worker.settings import WorkerSettings


def test_zero_threads_become_the_usable_cores_with_passive_waiting() -> None:
    environ: dict[str, str] = {}
    settings = fit_machine(WorkerSettings(threads=0), environ, lambda: 2)
    assert settings.threads == 2
    assert environ == {"OMP_WAIT_POLICY": "PASSIVE"}


def test_given_threads_and_a_users_policy_are_kept() -> None:
    environ = {"OMP_WAIT_POLICY": "ACTIVE"}
    settings = fit_machine(WorkerSettings(threads=3), environ, lambda: 64)
    assert settings.threads == 3
    assert environ == {"OMP_WAIT_POLICY": "ACTIVE"}
    one: dict[str, str] = {}
    assert fit_machine(WorkerSettings(threads=1), one, lambda: 64).threads == 1
    assert one == {"OMP_WAIT_POLICY": "ACTIVE"}


def test_the_grpc_front_runs_on_uvloop() -> None:
    loop = loop_factory()()
    try:
        assert isinstance(loop, uvloop.Loop)
        assert isinstance(loop, asyncio.AbstractEventLoop)
    finally:
        loop.close()

"""Workers killed (SIGKILL) and stopped (SIGSTOP, then SIGCONT) under load, through a real local
fleet supervised as `embedfleet serve` supervises it (`Fleet.supervise` every SUPERVISE_SECONDS):
no request may fail while another worker is healthy, and the killed one must be back in rotation
within its start-up time (plus the gateway noticing; the first restart has no backoff)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from embedfleet.common.modeldir import default_model_path, load_model_dir
from embedfleet.fleet.supervisor import SUPERVISE_SECONDS, Child, Fleet
from embedfleet.testing.overload import Outcome, closed_loop, mixed_bodies, words_of
from embedfleet.testing.polling import wait_for

from .helpers import local_fleet, null_workers

pytestmark = pytest.mark.slow

CLIENTS = 8
LOAD_SECONDS = 30.0
STOP_SECONDS = 6.0
#: the gateway's channel reconnect backoff is capped at 2 s (client.py); its unready workers are
#: probed every 0.2 s (pool.py)
NOTICE_SECONDS = 2.0 + 0.2


class Supervisor(threading.Thread):
    """`embedfleet serve`'s loop: supervise the fleet until stopped."""

    def __init__(self, fleet: Fleet) -> None:
        super().__init__(daemon=True)
        self.fleet = fleet
        self.halt = threading.Event()
        self.events: list[str] = []

    def run(self) -> None:
        while not self.halt.wait(SUPERVISE_SECONDS):
            self.events += self.fleet.supervise()


class Load(threading.Thread):
    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        words = words_of(list(load_model_dir(default_model_path()).tokenizer().get_vocab()))
        self.bodies = mixed_bodies(words, seed=3, count=200, texts=(1, 20), words_per_text=(5, 100))
        self.port = port
        self.outcomes: list[Outcome] = []

    def run(self) -> None:
        self.outcomes = asyncio.run(
            closed_loop("127.0.0.1", self.port, CLIENTS, LOAD_SECONDS, self.bodies, timeout=30)
        )


def _pid(child: Child) -> int:
    assert child.process is not None
    return child.process.pid


def test_killed_and_stopped_workers_lose_no_request(tmp_path: Path) -> None:
    started = time.monotonic()
    with local_fleet(tmp_path, 2, null_workers()) as fleet:
        startup = time.monotonic() - started  # the whole fleet's: an upper bound for one worker
        victim, other = fleet.worker_children
        supervisor = Supervisor(fleet)
        supervisor.start()
        load = Load(fleet.port)
        load.start()
        try:
            time.sleep(3.0)
            killed_pid = _pid(victim)
            killed = time.monotonic()
            os.kill(killed_pid, signal.SIGKILL)

            def back() -> bool:
                alive = victim.process is not None and victim.process.poll() is None
                return alive and _pid(victim) != killed_pid and fleet.all_workers_ready()

            wait_for("the killed worker back in rotation", back, timeout=60, interval=0.05)
            restart = time.monotonic() - killed
            time.sleep(2.0)
            stopped = time.monotonic()
            os.kill(_pid(other), signal.SIGSTOP)
            time.sleep(STOP_SECONDS)
            os.kill(_pid(other), signal.SIGCONT)
            resumed = time.monotonic()
            wait_for("the stopped worker back", fleet.all_workers_ready, timeout=30, interval=0.05)
        finally:
            load.join(LOAD_SECONDS + 60)
            supervisor.halt.set()
            supervisor.join(10)
    outcomes = load.outcomes
    failed = [o for o in outcomes if o.status != 200]
    around_kill = [o for o in outcomes if o.start <= killed + restart and o.end >= killed]
    around_stop = [o for o in outcomes if o.start <= resumed and o.end >= stopped]
    worst_stop = max(o.end - o.start for o in around_stop)
    print(
        f"\n{len(outcomes)} requests, {len(failed)} failed; restart {restart:.2f}s (fleet start-up "
        f"{startup:.2f}s); {len(around_kill)} requests around the kill, {len(around_stop)} around "
        f"the {STOP_SECONDS:.0f}s stop (worst {worst_stop:.2f}s); supervisor: {supervisor.events}"
    )
    assert failed == []
    assert around_kill
    assert around_stop
    assert any("exited with -9" in e for e in supervisor.events), supervisor.events
    assert restart <= fleet.backoff.delay(1) + startup + NOTICE_SECONDS

"""Slowloris against a real local fleet: 5,000 stalled connections (request line and Host only,
reopened as soon as the gateway closes them) from a process of their own, while normal clients keep
sending short requests. The gateway's header bound closes the stalled ones; its connection cap
(64 below the open-file limit) leaves room for the normal clients, whose p99 must stay within 2x of
their p99 without the attack. The unloaded figure is measured before and after the attack and
pooled, so a change in what else the shared machine runs meanwhile weighs on both sides alike."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from embedfleet.testing.overload import KeepAlive
from embedfleet.testing.slowloris import raise_open_files

from .helpers import local_fleet, null_workers

pytestmark = pytest.mark.slow

STALLED = 5000
CLIENTS = 4
#: without the attack, before it and after it
PHASE_SECONDS = 6.0
#: past the gateway's default header bound (10 s), so the measurement spans the server closing
#: every stalled connection and the attacker reopening it, the costly part
ATTACK_SECONDS = 12.0
BODY = b'{"input": "how do I reset my password"}'


async def _latencies(port: int, seconds: float) -> tuple[list[float], list[str]]:
    latencies: list[float] = []
    failures: list[str] = []
    deadline = time.monotonic() + seconds

    async def client() -> None:
        conn = KeepAlive("127.0.0.1", port)
        try:
            while time.monotonic() < deadline:
                start = time.monotonic()
                try:
                    answer = await asyncio.wait_for(conn.post("/v1/embeddings", BODY), 30)
                except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
                    failures.append(type(exc).__name__)
                    conn.close()
                    continue
                if answer.status != 200:
                    failures.append(f"{answer.status} {answer.body[:100]!r}")
                latencies.append(time.monotonic() - start)
        finally:
            conn.close()

    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return latencies, failures


def _p99(values: list[float]) -> float:
    return float(np.percentile(np.asarray(values), 99))


def test_stalled_connections_leave_normal_clients_their_latency(tmp_path: Path) -> None:
    # The gateway inherits this limit: 5,000 stalled sockets plus the clients must fit under it.
    assert raise_open_files(STALLED + 1024) >= STALLED + 256
    with local_fleet(tmp_path, 1, null_workers()) as fleet:
        before, failed_before = asyncio.run(_latencies(fleet.port, PHASE_SECONDS))
        attack = subprocess.Popen(
            [sys.executable, "-m", "embedfleet.testing.slowloris", "--port", str(fleet.port),
             "--connections", str(STALLED)],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            assert attack.stdout is not None
            opened = json.loads(attack.stdout.readline() or "{}")
            assert opened.get("open") == STALLED, opened
            during, failed_during = asyncio.run(_latencies(fleet.port, ATTACK_SECONDS))
        finally:
            attack.terminate()
            out, _ = attack.communicate(timeout=60)
        totals = json.loads(out.strip().splitlines()[-1])
        after, failed_after = asyncio.run(_latencies(fleet.port, PHASE_SECONDS))
    unloaded = before + after
    print(
        f"\nunloaded p50/p99 {np.median(unloaded) * 1e3:.1f}/{_p99(unloaded) * 1e3:.1f} ms "
        f"(n={len(unloaded)}), under {STALLED} stalled connections "
        f"{np.median(during) * 1e3:.1f}/{_p99(during) * 1e3:.1f} ms (n={len(during)}); "
        f"attacker {totals}"
    )
    assert failed_before == failed_during == failed_after == []
    assert totals["closed_by_server"] > 0  # the header bound closed stalled ones meanwhile
    assert _p99(during) <= 2 * _p99(unloaded)

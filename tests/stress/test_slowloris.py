"""Slowloris against a real local fleet: 5,000 stalled connections (request line and Host only,
opened over the gateway's header bound and reopened as soon as the gateway closes them, so 5,000
stay open) from a process of their own, while normal clients keep sending short queries. The
gateway's header bound closes the stalled ones; its connection cap (64 below the open-file limit)
leaves room for the normal clients.

Their p99 must stay within 2x of their p99 without the attack. On a shared machine a p99 measured
minutes apart says more about the neighbours than about the gateway, so the unloaded figure comes
from a control: a second, identical fleet that nobody attacks, loaded by the same clients in the
same seconds. Both fleets are compared once before the attack too, which shows the pair is fair.

The normal clients send at a fixed rate, one request in flight each, well below what the machine
serves. Clients that send the next request the moment the last is answered keep every core busy by
themselves: each gateway's latency is then its share of the CPU, the p99 of the two fleets moved
apart by 1.5x with no attack at all, and any work the attack adds (which an idle core would absorb)
lengthens every request of the attacked fleet instead of showing what the attack does to it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from embedfleet.testing.overload import NORMAL_INTERVAL, short_requests
from embedfleet.testing.slowloris import raise_open_files, stalled

from .helpers import local_fleet, null_workers

pytestmark = pytest.mark.slow

STALLED = 5000
#: the gateway's default header bound: the ramp, and the measured phase spans more than one
HEADER_SECONDS = 10.0
CLIENTS = 4
SECONDS = 15.0
BODY = b'{"input": "how do I reset my password"}'


def _p99(values: list[float]) -> float:
    return float(np.percentile(np.asarray(values), 99))


async def _side_by_side(a: int, b: int) -> tuple[tuple[list[float], list[str]], ...]:
    return tuple(
        await asyncio.gather(
            short_requests(a, CLIENTS, SECONDS, BODY, interval=NORMAL_INTERVAL),
            short_requests(b, CLIENTS, SECONDS, BODY, interval=NORMAL_INTERVAL),
        )
    )


def test_stalled_connections_leave_normal_clients_their_latency(tmp_path: Path) -> None:
    # The gateways inherit this limit: 5,000 stalled sockets plus the clients must fit under it.
    assert raise_open_files(STALLED + 1024) >= STALLED + 256
    with (
        local_fleet(tmp_path / "attacked", 1, null_workers()) as attacked,
        local_fleet(tmp_path / "control", 1, null_workers()) as control,
    ):
        (calm, calm_failed), (calm_control, _) = asyncio.run(
            _side_by_side(attacked.port, control.port)
        )
        with stalled(attacked.port, STALLED, HEADER_SECONDS) as totals:
            (during, failed), (unloaded, control_failed) = asyncio.run(
                _side_by_side(attacked.port, control.port)
            )
    ms = {name: (np.median(v) * 1e3, _p99(v) * 1e3) for name, v in
          (("calm", calm), ("calm control", calm_control), ("stalled", during),
           ("control", unloaded))}  # fmt: skip
    print("\n" + "; ".join(f"{k} p50/p99 {a:.1f}/{b:.1f} ms" for k, (a, b) in ms.items()))
    print(f"samples {len(during)} attacked, {len(unloaded)} control; attacker {totals}")
    assert calm_failed == failed == control_failed == []
    assert totals["closed_by_server"] >= STALLED // 2  # the header bound closed them meanwhile
    assert totals["refused"] == 0
    assert _p99(during) <= 2 * _p99(unloaded)

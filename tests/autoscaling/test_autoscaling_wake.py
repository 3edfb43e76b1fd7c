"""Waking a fleet at zero between two ticks: which fleets are polled, what wakes one, and the
autoscaler deciding for it at once rather than at its next tick."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from embedfleet.operator.autoscaling import autoscaler, wake
from embedfleet.operator.spec import parse_spec


def exposition(held: int) -> str:
    return (
        "# HELP embedfleet_gateway_held_requests Requests waiting for a ready worker.\n"
        "# TYPE embedfleet_gateway_held_requests gauge\n"
        f"embedfleet_gateway_held_requests {held}.0\n"
        "# TYPE embedfleet_gateway_held_tokens gauge\n"
        f"embedfleet_gateway_held_tokens {12 * held}.0\n"
    )


def auto(**fields: Any) -> Any:
    autoscaling = {"enabled": True, **fields}
    return parse_spec({"model": {"source": "file:///m"}, "autoscaling": autoscaling})


def test_only_a_fleet_its_autoscaler_holds_at_zero_is_polled() -> None:
    assert wake.at_zero(auto(minReplicas=0).autoscaling, 0)
    assert not wake.at_zero(auto(minReplicas=0).autoscaling, 1)
    assert not wake.at_zero(auto(minReplicas=0).autoscaling, None)  # nothing decided yet
    assert not wake.at_zero(auto(minReplicas=1).autoscaling, 0)


def test_a_held_request_at_any_gateway_is_demand() -> None:
    assert not wake.demand_waiting([])
    assert not wake.demand_waiting([exposition(0), ""])
    assert wake.demand_waiting([exposition(0), exposition(2)])


def test_a_held_request_is_decided_for_before_the_next_tick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A real HTTP gateway exposition that starts holding a request 0.3 s into a 6 s sleep: the
    # fleet is decided for at the next poll, long before the tick; a fleet whose gateway holds
    # nothing, or does not answer, is not.
    woken: list[tuple[str, float]] = []

    async def fake_wake(scaler: Any, fleet: wake.Sleeping) -> None:
        woken.append((fleet.name, time.monotonic()))

    monkeypatch.setattr(autoscaler, "_wake", fake_wake)
    held = {"busy": 0, "idle": 0}

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=exposition(held[request.match_info["fleet"]]))

    async def main() -> float:
        app = web.Application()
        app.router.add_get("/{fleet}/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        fleets = [
            wake.Sleeping("prod", name, (f"http://127.0.0.1:{port}/{name}/metrics",))
            for name in ("busy", "idle")
        ]
        fleets.append(wake.Sleeping("prod", "gone", ("http://127.0.0.1:9/metrics",)))
        start = time.monotonic()

        async def request_arrives() -> None:
            await asyncio.sleep(0.3)
            held["busy"] = 1

        arrival = asyncio.create_task(request_arrives())
        try:
            async with aiohttp.ClientSession() as session:
                scaler = autoscaler.Autoscaler(None, session)  # type: ignore[arg-type]
                await autoscaler.until_next_tick(scaler, fleets, start + 6.0)
        finally:
            await arrival
            await runner.cleanup()
        return start

    start = asyncio.run(main())
    assert [name for name, _ in woken] == ["busy"]  # once, and only the fleet holding a request
    assert woken[0][1] - start < 3.0  # the tick was 6 s away

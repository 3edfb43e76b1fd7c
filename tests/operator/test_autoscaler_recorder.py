"""The autoscaler's writes off its tick (recorder.py): one pending status write per fleet, the
latest winning; decisions before refreshes; Events first; a failed write leaves the fleet due."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from embedfleet.operator.autoscaling.memory import Memory
from embedfleet.operator.autoscaling.recorder import Recorder
from embedfleet.operator.kube import KubeError


class RecordingKube:
    """A Kube whose calls are recorded in order; `refuse` paths answer with an API error."""

    def __init__(self, refuse: int = 0) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.refuse = refuse
        self.refused = 0
        self.tops: list[dict[str, Any]] = []

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        await asyncio.sleep(0)  # a real call yields to the loop
        return fn(*args)

    def merge_status(self, path: str, status: Any) -> Any:
        if self.refuse:
            self.refused += 1
            raise KubeError("PATCH", path, self.refuse, '{"message": "refused"}')
        self.calls.append(("status", path.rsplit("/", 1)[1], status["autoscaling"]))
        self.tops.append({k: v for k, v in status.items() if k != "autoscaling"})
        return {}

    def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        self.calls.append(("event", path, body["reason"]))
        return {}


def _run(kube: RecordingKube, fill: Callable[[Recorder, Memory], None], writers: int = 1) -> Memory:
    memory = Memory(refresh=30)

    async def main() -> None:
        recorder = Recorder(kube, memory, writers=writers)  # type: ignore[arg-type]
        fill(recorder, memory)
        await recorder.idle()

    asyncio.run(main())
    return memory


def test_the_latest_patch_of_a_fleet_wins_and_decisions_go_first() -> None:
    kube = RecordingKube()

    def fill(recorder: Recorder, memory: Memory) -> None:
        for name in ("a", "b", "c"):
            fleet = memory.recall(("ns", name), "uid", {}, now=0)
            recorder.status(("ns", name), fleet, {"observedTokensPerSecond": 1.0}, False, 0)
        b = memory.recall(("ns", "b"), "uid", {}, now=0)
        recorder.status(("ns", "b"), b, {"observedTokensPerSecond": 2.0}, False, 1)
        c = memory.recall(("ns", "c"), "uid", {}, now=0)
        recorder.status(("ns", "c"), c, {"desiredReplicas": 3}, True, 2)
        recorder.event("ns", {"reason": "ScaleUpForLoad"})

    memory = _run(kube, fill)
    assert kube.calls == [
        ("event", "/api/v1/namespaces/ns/events", "ScaleUpForLoad"),
        ("status", "c", {"desiredReplicas": 3}),  # the decision, before the refreshes
        ("status", "a", {"observedTokensPerSecond": 1.0}),
        ("status", "b", {"observedTokensPerSecond": 2.0}),  # once, the latest
    ]
    b = memory.recall(("ns", "b"), "uid", {}, now=5)
    assert b.written == {"observedTokensPerSecond": 2.0}
    assert b.at == 1  # written as of the decision that made it


def test_nothing_due_drops_a_pending_write() -> None:
    kube = RecordingKube()

    def fill(recorder: Recorder, memory: Memory) -> None:
        fleet = memory.recall(("ns", "a"), "uid", {}, now=0)
        recorder.status(("ns", "a"), fleet, {"desiredReplicas": 3}, True, 0)
        recorder.status(("ns", "a"), fleet, None, False, 1)  # decided back to what status says
        assert len(recorder) == 0

    _run(kube, fill)
    assert kube.calls == []


def test_a_refused_write_leaves_the_fleet_due() -> None:
    kube = RecordingKube(refuse=409)

    def fill(recorder: Recorder, memory: Memory) -> None:
        fleet = memory.recall(("ns", "a"), "uid", {"desiredReplicas": 2}, now=0)
        recorder.status(("ns", "a"), fleet, {"desiredReplicas": 3}, True, 0)

    memory = _run(kube, fill)
    assert kube.refused == 1
    fleet = memory.recall(("ns", "a"), "uid", {}, now=1)
    assert fleet.written == {"desiredReplicas": 2}
    assert memory.due(fleet, {"desiredReplicas": 3}, now=1)  # the next tick writes it again


def test_an_outage_logs_one_line_not_one_per_fleet(caplog: pytest.LogCaptureFixture) -> None:
    """The API server refusing every write of a tick over 200 fleets: one warning line (the
    others counted into the next one), not 200; every write was still tried."""
    kube = RecordingKube(refuse=503)

    def fill(recorder: Recorder, memory: Memory) -> None:
        for i in range(200):
            fleet = memory.recall(("ns", f"f{i}"), "uid", {}, now=0)
            recorder.status(("ns", f"f{i}"), fleet, {"desiredReplicas": 3}, True, 0)
        for _ in range(20):
            recorder.event("ns", {"reason": "ScaleUpForLoad"})

    def refused(method: str, path: str, body: Any = None, **_: Any) -> Any:
        return kube.merge_status(path, body)  # refuses

    kube.request = refused  # type: ignore[method-assign]  # Events refused too
    with caplog.at_level(logging.WARNING, logger="embedfleet.operator.autoscaling.recorder"):
        _run(kube, fill, writers=4)
    assert kube.refused == 220
    lines = [r for r in caplog.records if r.name.endswith("recorder")]
    assert [r.getMessage().split(" ")[0] for r in lines] == ["posting", "writing"], lines
    assert all(vars(r)["since_last_line"] == 0 for r in lines)


def test_writers_are_bounded() -> None:
    in_flight = {"now": 0, "most": 0}

    class SlowKube(RecordingKube):
        async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
            in_flight["now"] += 1
            in_flight["most"] = max(in_flight["most"], in_flight["now"])
            await asyncio.sleep(0.01)
            in_flight["now"] -= 1
            return fn(*args)

    kube = SlowKube()

    def fill(recorder: Recorder, memory: Memory) -> None:
        for i in range(20):
            fleet = memory.recall(("ns", f"f{i}"), "uid", {}, now=0)
            recorder.status(("ns", f"f{i}"), fleet, {"reason": "x"}, True, 0)

    _run(kube, fill, writers=3)
    assert len(kube.calls) == 20
    assert in_flight["most"] == 3


def test_the_printer_columns_go_with_the_write() -> None:
    # So the reconcile that the write triggers finds nothing of its own to write (status.py).
    kube = RecordingKube()

    def fill(recorder: Recorder, memory: Memory) -> None:
        fleet = memory.recall(("ns", "a"), "uid", {}, now=0)
        patch = {"observedTokensPerSecond": 5.0, "p99LatencyMilliseconds": None, "reason": "x"}
        recorder.status(("ns", "a"), fleet, patch, True, 0)

    _run(kube, fill)
    assert kube.tops == [{"observedTokensPerSecond": 5.0, "p99LatencyMilliseconds": None}]

"""The autoscaler writes status.autoscaling for a decision at once, for moved measurements at
most every refresh, and never for its windows alone (memory.py)."""

from __future__ import annotations

from embedfleet.operator.autoscaling.memory import Memory, must_write
from embedfleet.operator.autoscaling.policy import PolicyState

WRITTEN = {
    "desiredReplicas": 2,
    "reason": "WithinTolerance",
    "message": "stay at 2: demand 100 tokens/s",
    "observedTokensPerSecond": 100.0,
    "policyState": {"load": [[1.0, 100.0]]},
}


def test_a_repeated_decision_is_no_write() -> None:
    assert not must_write(WRITTEN, dict(WRITTEN), since=3600, refresh=30)


def test_a_decision_is_written_at_once() -> None:
    for field, value in (
        ("desiredReplicas", 3),
        ("reason", "ScaleDownStabilizing"),
        ("lastScaleReason", "ScaleUpForLoad"),
        ("lastScaleTime", "2026-12-02T03:00:00Z"),
    ):
        assert must_write(WRITTEN, {**WRITTEN, field: value}, since=0, refresh=30), field


def test_moved_measurements_wait_for_the_refresh() -> None:
    moved = {**WRITTEN, "observedTokensPerSecond": 101.0, "message": "stay at 2: demand 101"}
    assert not must_write(WRITTEN, moved, since=29.9, refresh=30)
    assert must_write(WRITTEN, moved, since=30, refresh=30)
    new_field = {**WRITTEN, "capacityTokensPerSecond": 1000.0}  # absent before: a change
    assert must_write(WRITTEN, new_field, since=30, refresh=30)


def test_windows_alone_are_never_written() -> None:
    windows = {**WRITTEN, "policyState": {"load": [[1.0, 100.0], [6.0, 100.0]]}}
    assert not must_write(WRITTEN, windows, since=3600, refresh=30)


def test_memory_resumes_from_status_and_forgets_a_recreated_fleet() -> None:
    memory = Memory(refresh=30)
    status = {"reason": "WithinTolerance", "policyState": {"load": [[5.0, 42.0]]}}
    fleet = memory.recall(("ns", "a"), "uid-1", status, now=100)
    assert fleet.state.load == ((5.0, 42.0),)  # a successor resumes the windows written last
    fleet.state = PolicyState(load=((5.0, 42.0), (10.0, 43.0)))
    assert memory.recall(("ns", "a"), "uid-1", {}, now=105) is fleet  # memory wins over status
    assert memory.recall(("ns", "a"), "uid-2", {}, now=110).state == PolicyState()  # re-created
    memory.keep_only(set())
    assert memory.recall(("ns", "a"), "uid-2", status, now=120).state.load == ((5.0, 42.0),)


def test_a_write_restarts_the_refresh() -> None:
    memory = Memory(refresh=30)
    fleet = memory.recall(("ns", "a"), "uid", dict(WRITTEN), now=0)
    moved = {**WRITTEN, "observedTokensPerSecond": 150.0}
    assert memory.due(fleet, moved, now=31)
    memory.wrote(fleet, moved, now=31)
    again = {**moved, "observedTokensPerSecond": 160.0}
    assert not memory.due(fleet, again, now=40)
    assert memory.due(fleet, again, now=61)

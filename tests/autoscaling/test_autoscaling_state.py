"""The policy's memory in status: round trips, restarts, and the spec's defaults."""

from __future__ import annotations

import json
import random

import pytest

from embedfleet.operator.autoscaling.policy import Observation, PolicyState, decide
from embedfleet.operator.autoscaling.state import (
    rfc3339,
    state_from_status,
    state_to_status,
    status_patch,
)
from embedfleet.operator.spec import Autoscaling


def random_observation(rng: random.Random) -> Observation:
    return Observation(
        tokens_per_second=rng.uniform(0, 200_000),
        p99_seconds=rng.choice([None, rng.uniform(0, 1.5)]),
        capacity_tokens_per_second=10_000.0,
        queued_tokens=rng.choice([0.0, rng.uniform(0, 1e5)]),
        ready_replicas=rng.randint(0, 30),
    )


@pytest.mark.parametrize("seed", range(20))
def test_restart_through_status_changes_nothing(seed: int) -> None:
    """Decisions with the state read back from (JSON) status equal those kept in memory."""
    rng = random.Random(seed)
    spec = Autoscaling(
        enabled=True, max_replicas=30, scale_down_stabilization_seconds=rng.choice([0, 60, 300])
    )
    memory, stored = PolicyState(), {}
    replicas_a = replicas_b = 4
    now = 1_764_500_000.0
    for _ in range(200):
        now += 5.0
        o = random_observation(rng)
        a = decide(memory, o, spec, replicas_a, now)
        restored = state_from_status(json.loads(json.dumps(stored)))
        b = decide(restored, o, spec, replicas_b, now)
        assert (a.replicas, a.reason) == (b.replicas, b.reason)
        memory, replicas_a, replicas_b = a.state, a.replicas, b.replicas
        stored = status_patch(b, o)


def test_round_trip() -> None:
    state = PolicyState(
        load=((10.0, 1.5), (15.0, 2.5)),
        latency=((15.0, 0.25),),
        recommendations=((5.0, 9), (15.0, 3)),
        panic_until=70.0,
        last_scale_time=12.5,
        capacity=9_000.5,
    )
    assert state_from_status({"policyState": state_to_status(state)}) == state


@pytest.mark.parametrize(
    "raw",
    [
        None,
        {},
        {"policyState": "nonsense"},
        {"policyState": {"load": "x"}},
        {"policyState": {"load": [[1, "a"]]}},
        {"policyState": {"load": [[1]]}},
        {"policyState": {"panicUntil": True}},
    ],
)
def test_malformed_state_starts_empty(raw: dict[str, object] | None) -> None:
    state = state_from_status(raw)
    assert state.load == ()
    assert state.panic_until is None


def test_status_patch_reports_the_decision() -> None:
    o = Observation(40_000.0, 0.123, 10_000.0, 0.0, 5)
    d = decide(PolicyState(), o, Autoscaling(enabled=True, max_replicas=10), 3, 1_764_500_000.0)
    patch = status_patch(d, o)
    assert patch["desiredReplicas"] == d.replicas == 5
    assert patch["lastScaleReason"] == "ScaleUpForLoad"
    assert patch["reason"] == "ScaleUpForLoad"
    assert patch["lastScaleTime"] == rfc3339(1_764_500_000.0) == "2025-11-30T10:53:20Z"
    assert patch["observedTokensPerSecond"] == 40_000.0
    assert patch["p99LatencyMilliseconds"] == 123.0
    assert patch["capacityTokensPerSecond"] == 10_000.0
    assert patch["targetTokensPerSecondPerReplica"] == 8_000.0
    json.dumps(patch)  # all JSON
    held = decide(d.state, o, Autoscaling(enabled=True, max_replicas=10), 5, 1_764_500_005.0)
    assert "lastScaleReason" not in status_patch(held, o)  # kept from the last scale

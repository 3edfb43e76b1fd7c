from __future__ import annotations

from typing import Any

from embedfleet.operator.leader import (
    Observation,
    may_take,
    next_attempt_in,
    pod_owner,
    record_of,
)


def _lease(holder: str | None, renew: str = "t1", transitions: int = 0) -> dict[str, Any]:
    return {"spec": {"holderIdentity": holder, "renewTime": renew, "leaseTransitions": transitions}}


def test_free_or_own_lease_may_be_taken() -> None:
    assert may_take(_lease(None), "me", None, 0.0, 15.0)
    assert may_take(_lease(""), "me", None, 0.0, 15.0)
    assert may_take(_lease("me"), "me", None, 0.0, 15.0)


def test_a_held_lease_waits_a_full_duration_from_first_sight() -> None:
    lease = _lease("other")
    assert not may_take(lease, "me", None, 100.0, 15.0)
    seen = Observation(record_of(lease), since=100.0)
    assert not may_take(lease, "me", seen, 114.9, 15.0)
    assert may_take(lease, "me", seen, 115.0, 15.0)


def test_a_renewal_restarts_the_wait() -> None:
    seen = Observation(record_of(_lease("other", "t1")), since=100.0)
    assert not may_take(_lease("other", "t2"), "me", seen, 200.0, 15.0)


def test_the_holders_pod_owns_the_lease() -> None:
    env = {"POD_NAME": "op-7c9", "POD_UID": "u-1", "POD_NAMESPACE": "embedfleet-system"}
    assert pod_owner(env, "embedfleet-system") == [
        {"apiVersion": "v1", "kind": "Pod", "name": "op-7c9", "uid": "u-1"}
    ]


def test_no_owner_outside_a_pod_or_across_namespaces() -> None:
    assert pod_owner({}, "default") == []
    assert pod_owner({"POD_NAME": "op", "POD_NAMESPACE": "default"}, "default") == []
    env = {"POD_NAME": "op", "POD_UID": "u-1", "POD_NAMESPACE": "embedfleet-system"}
    assert pod_owner(env, "elsewhere") == []


def test_a_successor_tries_again_at_the_expiry_not_a_retry_period_after_it() -> None:
    seen = Observation(record_of(_lease("other")), since=100.0)
    assert next_attempt_in(None, 100.0, 15.0, 3.0) == 3.0  # nothing seen yet
    assert next_attempt_in(seen, 100.0, 15.0, 3.0) == 3.0  # expiry far off: the retry period
    assert next_attempt_in(seen, 113.5, 15.0, 3.0) == 1.5  # sooner: at the expiry itself
    assert may_take(_lease("other"), "me", seen, 113.5 + 1.5, 15.0)
    # Past the expiry yet not taken (another candidate won the race): back to the period.
    assert next_attempt_in(seen, 116.0, 15.0, 3.0) == 3.0

from __future__ import annotations

from typing import Any

from embedfleet.operator.leader import Observation, may_take, record_of


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

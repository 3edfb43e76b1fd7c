from __future__ import annotations

from typing import Any

from embedfleet.operator.conditions import Condition, find, set_conditions
from embedfleet.operator.spec import parse_spec
from embedfleet.operator.status import (
    RolloutState,
    changed,
    compute_status,
    monitored,
    rollout_state,
)

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"
SPEC = parse_spec({"model": {"source": "file:///m"}})


def _deployment(**status: Any) -> dict[str, Any]:
    return {"metadata": {"generation": 2}, "status": {"observedGeneration": 2, **status}}


def _ok(desired: int) -> RolloutState:
    return rollout_state(
        _deployment(
            replicas=desired,
            readyReplicas=desired,
            updatedReplicas=desired,
            availableReplicas=desired,
        ),
        desired,
    )


def _status(workers: RolloutState, gateways: RolloutState, **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "spec": SPEC,
        "old": {},
        "generation": 5,
        "workers": workers,
        "gateways": gateways,
        "selector": "a=b",
        "endpoint": "http://x",
        "error": "",
        "now": T0,
    }
    args.update(kw)
    return compute_status(**args)


def _cond(status: dict[str, Any], kind: str) -> dict[str, Any]:
    found = find(status["conditions"], kind)
    assert found is not None
    return dict(found)


def test_transition_time_moves_only_when_the_status_does() -> None:
    first = set_conditions([], [Condition("Available", "False", "A", "m1")], 1, T0)
    same = set_conditions(first, [Condition("Available", "False", "B", "m2")], 2, T1)
    assert same[0]["lastTransitionTime"] == T0
    assert same[0]["reason"] == "B"
    assert same[0]["observedGeneration"] == 2
    flipped = set_conditions(same, [Condition("Available", "True", "C", "m3")], 3, T1)
    assert flipped[0]["lastTransitionTime"] == T1


def test_foreign_conditions_are_kept_and_ours_come_first() -> None:
    existing = [{"type": "Custom", "status": "True"}]
    out = set_conditions(existing, [Condition("Degraded", "False", "R", "m")], 1, T0)
    assert [c["type"] for c in out] == ["Degraded", "Custom"]


def test_all_ready_is_available_and_done() -> None:
    status = _status(_ok(2), _ok(1))
    assert _cond(status, "Available")["status"] == "True"
    assert _cond(status, "Progressing")["reason"] == "RolloutComplete"
    assert _cond(status, "Degraded")["status"] == "False"
    assert _cond(status, "ScalingActive")["reason"] == "Disabled"
    assert status["observedGeneration"] == 5
    assert all(c["observedGeneration"] == 5 for c in status["conditions"])
    assert (status["replicas"], status["readyReplicas"], status["desiredReplicas"]) == (2, 2, 2)


def test_no_ready_worker_is_unavailable() -> None:
    status = _status(rollout_state(None, 2), _ok(1))
    assert _cond(status, "Available")["reason"] == "WorkersUnavailable"
    assert _cond(status, "Progressing")["status"] == "True"


def test_no_ready_gateway_is_unavailable() -> None:
    status = _status(_ok(2), rollout_state(_deployment(replicas=1), 1))
    assert _cond(status, "Available")["reason"] == "GatewayUnavailable"


def test_scaled_to_zero() -> None:
    assert _cond(_status(_ok(0), _ok(1)), "Available")["reason"] == "ScaledToZero"


def test_stale_deployment_status_is_still_progressing() -> None:
    stale = _deployment(replicas=2, readyReplicas=2, updatedReplicas=2, availableReplicas=2)
    stale["metadata"]["generation"] = 3
    assert _cond(_status(rollout_state(stale, 2), _ok(1)), "Progressing")["status"] == "True"


def test_degraded_reasons() -> None:
    failed = _status(_ok(1), _ok(1), error="HTTP 403: forbidden")
    assert _cond(failed, "Degraded")["reason"] == "ReconcileFailed"
    assert "403" in _cond(failed, "Degraded")["message"]
    stuck = _deployment(
        conditions=[
            {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}
        ]
    )
    status = _status(rollout_state(stuck, 1), _ok(1))
    assert _cond(status, "Degraded")["reason"] == "ProgressDeadlineExceeded"
    quota = _deployment(
        conditions=[{"type": "ReplicaFailure", "status": "True", "message": "exceeded quota"}]
    )
    status = _status(rollout_state(quota, 1), _ok(1))
    assert _cond(status, "Degraded")["reason"] == "ReplicaFailure"
    assert "exceeded quota" in _cond(status, "Degraded")["message"]


def test_scaling_active_and_mirrored_autoscaler_figures() -> None:
    spec = parse_spec({"model": {"source": "file:///m"}, "autoscaling": {"enabled": True}})
    waiting = _status(_ok(1), _ok(1), spec=spec)
    assert _cond(waiting, "ScalingActive")["reason"] == "AwaitingDecision"
    old = {
        "autoscaling": {
            "desiredReplicas": 3,
            "observedTokensPerSecond": 1234.5,
            "p99LatencyMilliseconds": 87,
        }
    }
    active = _status(_ok(3), _ok(1), spec=spec, old=old)
    assert _cond(active, "ScalingActive")["status"] == "True"
    assert active["observedTokensPerSecond"] == 1234.5
    assert active["p99LatencyMilliseconds"] == 87
    assert "autoscaling" not in active  # the autoscaler's own field is never written here
    external = parse_spec(
        {"model": {"source": "file:///m"}, "autoscaling": {"enabled": True, "external": True}}
    )
    assert _cond(_status(_ok(1), _ok(1), spec=external), "ScalingActive")["reason"] == "External"


def test_unchanged_status_is_not_rewritten() -> None:
    first = _status(_ok(2), _ok(1))
    again = _status(_ok(2), _ok(1), old=first, now=T1)
    assert not changed(first, again)
    assert changed(first, _status(_ok(3), _ok(1), old=first, now=T1))


def test_monitored_condition_names_why_there_is_no_service_monitor() -> None:
    assert monitored("m", False, True, "").reason == "Disabled"
    assert monitored("m", True, False, "").reason == "CRDNotInstalled"
    refused = monitored("m", True, True, 'servicemonitors is forbidden: User "x"')
    assert (refused.status, refused.reason) == ("False", "Forbidden")
    assert "rbac.serviceMonitors=true" in refused.message
    assert "forbidden: User" in refused.message
    applied = monitored("m", True, True, "")
    assert (applied.status, applied.reason) == ("True", "ServiceMonitorApplied")


def test_monitored_never_makes_the_fleet_degraded() -> None:
    refused = monitored("m", True, True, "forbidden")
    out = _status(_ok(1), _ok(1), monitoring=refused)
    assert _cond(out, "Degraded")["status"] == "False"
    assert _cond(out, "Monitored")["reason"] == "Forbidden"
    assert [c["type"] for c in out["conditions"]][-1] == "Monitored"

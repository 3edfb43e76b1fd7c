"""The policy's inputs and memory as they appear in the EmbeddingDeployment (spec and status).

status.autoscaling holds what users read (observed load, p99, capacity, desired replicas, the last
scale time and reason) and, under `policyState`, the windows the policy needs, so an operator
restart neither forgets a burst nor cuts the scale-down stabilization short.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from embedfleet.operator.autoscaling.policy import Decision, Observation, PolicyState


def state_from_status(autoscaling: Mapping[str, Any] | None) -> PolicyState:
    """The policy state kept in status.autoscaling.policyState; malformed parts start empty."""
    raw = (autoscaling or {}).get("policyState")
    if not isinstance(raw, Mapping):
        return PolicyState()
    return PolicyState(
        load=_points(raw.get("load"), float),
        latency=_points(raw.get("latency"), float),
        recommendations=_points(raw.get("recommendations"), int),
        panic_until=_number(raw.get("panicUntil")),
        last_scale_time=_number(raw.get("lastScaleTime")),
        capacity=_number(raw.get("capacity")),
    )


def state_to_status(state: PolicyState) -> dict[str, Any]:
    return {
        "load": [[_ms(t), round(v, 3)] for t, v in state.load],
        "latency": [[_ms(t), round(v, 6)] for t, v in state.latency],
        "recommendations": [[_ms(t), n] for t, n in state.recommendations],
        "panicUntil": None if state.panic_until is None else _ms(state.panic_until),
        "lastScaleTime": None if state.last_scale_time is None else _ms(state.last_scale_time),
        "capacity": None if state.capacity is None else round(state.capacity, 3),
    }


def status_patch(decision: Decision, observation: Observation | None) -> dict[str, Any]:
    """The status.autoscaling object for one decision (merged into status by the handler)."""
    last = decision.state.last_scale_time
    patch: dict[str, Any] = {
        "desiredReplicas": decision.replicas,
        "reason": str(decision.reason),
        "message": decision.message,
        "policyState": state_to_status(decision.state),
    }
    if decision.scaled:
        patch["lastScaleReason"] = str(decision.reason)
    if last is not None:
        patch["lastScaleTime"] = rfc3339(last)
    if decision.per_replica_tokens_per_second is not None:
        patch["targetTokensPerSecondPerReplica"] = round(decision.per_replica_tokens_per_second, 1)
    if observation is not None:
        patch["observedTokensPerSecond"] = round(observation.tokens_per_second, 1)
        patch["queuedTokens"] = round(observation.queued_tokens, 1)
        patch["heldRequests"] = round(observation.held_requests)
        patch["p99LatencyMilliseconds"] = (
            None if observation.p99_seconds is None else round(observation.p99_seconds * 1000, 1)
        )
        capacity = observation.capacity_tokens_per_second
        patch["capacityTokensPerSecond"] = None if capacity is None else round(capacity, 1)
    return patch


def rfc3339(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ms(t: float) -> float:
    return round(t, 3)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


_T = TypeVar("_T", int, float)


def _points(value: Any, kind: type[_T]) -> tuple[tuple[float, _T], ...]:
    if not isinstance(value, list):
        return ()
    points: list[tuple[float, _T]] = []
    for item in value:
        if not isinstance(item, list) or len(item) != 2:
            return ()
        t, v = _number(item[0]), _number(item[1])
        if t is None or v is None:
            return ()
        points.append((t, kind(v)))
    return tuple(sorted(points, key=lambda p: p[0]))

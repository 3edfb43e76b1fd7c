"""Which worker replica count the operator asks for: a pure function the autoscaler tests too.

Contract: with autoscaling enabled and not external, the built-in autoscaler writes
status.autoscaling.desiredReplicas and that wins, clamped to [minReplicas, maxReplicas]. Otherwise
spec.worker.replicas wins; the scale subresource (kubectl scale, HPA, KEDA) writes that field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from embedfleet.operator.spec import Spec


def clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def autoscaler_desired(status: Mapping[str, Any] | None) -> int | None:
    """status.autoscaling.desiredReplicas when it is a usable count, else None."""
    auto = (status or {}).get("autoscaling")
    if not isinstance(auto, Mapping):
        return None
    value = auto.get("desiredReplicas")
    # bool is an int subclass; a stray True must not mean one replica.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def worker_replicas(spec: Spec, status: Mapping[str, Any] | None) -> int:
    """The replica count for the worker Deployment."""
    auto = spec.autoscaling
    if not auto.operator_driven:
        return spec.worker.replicas
    decided = autoscaler_desired(status)
    # Before the autoscaler's first decision, start from what the user wrote, within bounds.
    base = spec.worker.replicas if decided is None else decided
    return clamp(base, auto.min_replicas, auto.max_replicas)

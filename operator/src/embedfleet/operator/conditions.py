"""Status conditions, the way apimachinery's meta.SetStatusCondition keeps them: one per type, and
lastTransitionTime moves only when the status does (a new reason or message alone keeps it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["True", "False", "Unknown"]

AVAILABLE = "Available"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
SCALING_ACTIVE = "ScalingActive"
MONITORED = "Monitored"
ORDER = (AVAILABLE, PROGRESSING, DEGRADED, SCALING_ACTIVE, MONITORED)


@dataclass(frozen=True)
class Condition:
    type: str
    status: Status
    reason: str
    message: str


def set_conditions(
    existing: Sequence[Mapping[str, Any]] | None,
    wanted: Sequence[Condition],
    generation: int,
    now: str,
) -> list[dict[str, Any]]:
    """The conditions list after setting `wanted`; others already present are kept as they are."""
    by_type = {str(c.get("type")): dict(c) for c in existing or () if c.get("type")}
    for cond in wanted:
        old = by_type.get(cond.type)
        since = now
        if old is not None and old.get("status") == cond.status:
            since = old.get("lastTransitionTime") or now
        by_type[cond.type] = {
            "type": cond.type,
            "status": cond.status,
            "reason": cond.reason,
            "message": cond.message,
            "observedGeneration": generation,
            "lastTransitionTime": since,
        }

    def rank(kind: str) -> tuple[int, str]:
        return (ORDER.index(kind), "") if kind in ORDER else (len(ORDER), kind)

    return [by_type[kind] for kind in sorted(by_type, key=rank)]


def find(conditions: Sequence[Mapping[str, Any]] | None, kind: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions or () if c.get("type") == kind), None)

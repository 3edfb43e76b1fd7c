"""What the autoscaler remembers of each fleet between ticks, and when that reaches the status.

The policy's windows gain a point every tick and the measured load moves every tick, so writing
status.autoscaling whenever its content changed meant a write per autoscaled fleet per tick (each
one also a watch event and a reconcile): 200 a second at a thousand fleets. Here the policy state
lives in memory while this replica leads, and status gets:

- a decision at once: a new replica count, reason or scale time (the reconciler acts on
  desiredReplicas, and users read why);
- changed measurements (observed load, p99, capacity, the message quoting them) at most every
  `refresh` seconds, with the windows: what `kubectl get` shows and a successor resumes from
  (`state_from_status`);
- nothing while only the windows changed (they gain a point every tick, at idle too).

So a failover forgets the windows' points since the last write: at most `refresh` seconds of
them while the signals move, and, while they hold still, points equal to those written. Points
that mattered left a decision behind (a burst or a rising recommendation scales up, written at
once); the rest is load history that a new leader rebuilds within one stable window.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from embedfleet.operator.autoscaling.policy import PolicyState
from embedfleet.operator.autoscaling.state import state_from_status
from embedfleet.operator.replicas import autoscaler_desired

#: Fields of status.autoscaling that carry a decision: written as soon as they change.
DECISION_FIELDS = ("desiredReplicas", "reason", "lastScaleReason", "lastScaleTime")
#: Seconds between writes that carry only measurements and windows.
REFRESH_SECONDS = 30.0


def decision_changed(written: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    """Whether `patch` carries a decision status.autoscaling (as `written`) does not hold yet."""
    return any(written.get(key) != patch[key] for key in DECISION_FIELDS if key in patch)


def must_write(
    written: Mapping[str, Any], patch: Mapping[str, Any], since: float, refresh: float
) -> bool:
    """Whether merging `patch` into status.autoscaling, last written as `written` `since`
    seconds ago, is due now (pure)."""
    if decision_changed(written, patch):
        return True
    changed = {key for key, value in patch.items() if written.get(key) != value}
    # The windows gain a point every tick, at idle too: alone they are no reason to write (they
    # go with the next write), or an idle fleet would be written every `refresh`.
    return bool(changed - {"policyState"}) and since >= refresh


@dataclass
class Fleet:
    uid: str
    state: PolicyState
    #: status.autoscaling as last written (or as found, before the first write)
    written: dict[str, Any]
    #: when it was written (time.time()); found ones count as written then
    at: float
    #: the latest decision's replica count and reason, written or not yet (recorder.py): the
    #: next decision starts from it, and an Event is posted once per change of it
    desired: int | None = None
    reason: str | None = None


class Memory:
    """Per fleet: the policy state and what status holds (one autoscaler task: no lock)."""

    def __init__(self, refresh: float = REFRESH_SECONDS) -> None:
        self.refresh = refresh
        self._fleets: dict[tuple[str, str], Fleet] = {}

    def recall(
        self, key: tuple[str, str], uid: str, status: Mapping[str, Any], now: float
    ) -> Fleet:
        """The fleet's memory; from its status.autoscaling when first seen (or re-created)."""
        fleet = self._fleets.get(key)
        if fleet is None or fleet.uid != uid:
            reason = status.get("reason")
            fleet = self._fleets[key] = Fleet(
                uid,
                state_from_status(status),
                dict(status),
                now,
                autoscaler_desired({"autoscaling": status}),
                reason if isinstance(reason, str) else None,
            )
        return fleet

    def due(self, fleet: Fleet, patch: Mapping[str, Any], now: float) -> bool:
        return must_write(fleet.written, patch, now - fleet.at, self.refresh)

    @staticmethod
    def wrote(fleet: Fleet, patch: Mapping[str, Any], now: float) -> None:
        fleet.written.update(patch)
        fleet.at = now

    def keep_only(self, keys: set[tuple[str, str]]) -> None:
        """Forgets fleets no longer autoscaled (deleted, or autoscaling turned off)."""
        for key in set(self._fleets) - keys:
            del self._fleets[key]

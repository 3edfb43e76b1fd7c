"""Leader election on a coordination.k8s.io Lease, the way client-go does it.

Why not kopf's peering: it needs its own KopfPeering CRD, and two replicas of equal priority both
pause during a rolling update. A Lease needs only RBAC on leases; a standby takes over once the
holder stops renewing, and the holder releases it on a clean shutdown so the handover is quick.
Expiry is judged by how long this process has seen the record unchanged (monotonic clock), never
by comparing another host's wall clock with ours.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from embedfleet.operator.kube import Kube, KubeError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Observation:
    """The Lease record as last seen, and when (monotonic seconds) it last changed."""

    record: tuple[str, str, int]
    """(holderIdentity, renewTime, leaseTransitions): any change means the holder is alive."""
    since: float


def record_of(lease: dict[str, Any]) -> tuple[str, str, int]:
    spec = lease.get("spec") or {}
    return (
        str(spec.get("holderIdentity") or ""),
        str(spec.get("renewTime") or ""),
        int(spec.get("leaseTransitions") or 0),
    )


def may_take(
    lease: dict[str, Any], me: str, seen: Observation | None, now: float, duration: float
) -> bool:
    """Whether `me` may write itself into `lease` now (pure)."""
    holder, _, _ = record_of(lease)
    if holder in ("", me):
        return True
    if seen is None or seen.record != record_of(lease):
        return False  # just (re)observed: give the holder a full duration to renew
    return now - seen.since >= duration


def next_attempt_in(seen: Observation | None, now: float, duration: float, retry: float) -> float:
    """Seconds until the next attempt on a Lease someone else holds (pure): the retry period, or
    less when the holder's record, unchanged since `seen.since`, expires sooner. So a successor
    takes over at the expiry itself, not up to a retry period after it."""
    if seen is None:
        return retry
    left = seen.since + duration - now
    return min(retry, left) if left > 0 else retry


def pod_owner(env: Mapping[str, str], namespace: str) -> list[dict[str, Any]]:
    """ownerReferences that name this replica's own pod (downward API: POD_NAME, POD_UID,
    POD_NAMESPACE), so the garbage collector removes the Lease once its holder's pod is gone and
    `helm uninstall` leaves none behind. None across namespaces: an owner must share the Lease's
    namespace, or the garbage collector takes it for gone and deletes the Lease at once."""
    name, uid = env.get("POD_NAME", ""), env.get("POD_UID", "")
    if not name or not uid or env.get("POD_NAMESPACE") != namespace:
        return []
    return [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}]


def _now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self, kube: Kube, namespace: str, name: str, identity: str, duration: float
    ) -> None:
        self.kube = kube
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration = duration
        self.owners = pod_owner(os.environ, namespace)
        self._seen: Observation | None = None
        # A renewal abandoned by the cancelled renew loop may still be in flight on its thread:
        # the release waits for it, and no renewal follows a release (it would take the Lease
        # back for a process about to exit, and the successor would wait for it to expire).
        self._lock = threading.Lock()
        self._released = False

    def _spec(self, transitions: int, acquired: str) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.duration)),
            "acquireTime": acquired,
            "renewTime": _now_rfc3339(),
            "leaseTransitions": transitions,
        }

    def try_acquire(self) -> bool:
        """One attempt to take or renew the Lease; True while we hold it. Blocking."""
        with self._lock:
            return not self._released and self._try_acquire()

    def _try_acquire(self) -> bool:
        now = time.monotonic()
        try:
            lease = self.kube.get_or_none(self.path)
            if lease is None:
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {
                        "name": self.name,
                        "namespace": self.namespace,
                        "ownerReferences": self.owners,
                    },
                    "spec": self._spec(0, _now_rfc3339()),
                }
                self.kube.request("POST", self.path.rsplit("/", 1)[0], body)
                return True
            record = record_of(lease)
            if self._seen is None or self._seen.record != record:
                self._seen = Observation(record, now)
            if not may_take(lease, self.identity, self._seen, now, self.duration):
                return False
            holder, _, transitions = record
            spec = lease.get("spec") or {}
            acquired = spec.get("acquireTime") if holder == self.identity else None
            if holder != self.identity:
                transitions += 1
            lease["spec"] = self._spec(transitions, acquired or _now_rfc3339())
            if self.owners:
                # The holder's pod owns the Lease (pod_owner); a successor takes that over too.
                lease["metadata"]["ownerReferences"] = self.owners
            # The PUT carries resourceVersion: two candidates racing for it cannot both win.
            self.kube.request("PUT", self.path, lease)
            return True
        except KubeError as err:
            if err.status != 409:
                log.warning("lease %s/%s: %s", self.namespace, self.name, err)
            return False

    def next_attempt_in(self, retry: float) -> float:
        """When to call try_acquire again after it returned False (see next_attempt_in)."""
        return next_attempt_in(self._seen, time.monotonic(), self.duration, retry)

    def release(self) -> None:
        """Hands the Lease back on a clean shutdown, so a standby needs not wait for expiry."""
        with self._lock:
            self._released = True
            self._release()

    def _release(self) -> None:
        try:
            lease = self.kube.get_or_none(self.path)
            if lease is None or record_of(lease)[0] != self.identity:
                return
            lease["spec"] = {**(lease.get("spec") or {}), "holderIdentity": None}
            lease["spec"]["leaseDurationSeconds"] = 1
            self.kube.request("PUT", self.path, lease)
        except KubeError as err:
            log.warning("releasing lease %s/%s: %s", self.namespace, self.name, err)

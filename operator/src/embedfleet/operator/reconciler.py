"""The I/O shell around the pure functions: read an EmbeddingDeployment, apply its children with
server-side apply, write its status. Level-triggered: every call converges from whatever state the
cluster is in, so a missed event, a hand-edited child or an operator killed halfway all heal on
the next call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from embedfleet.operator import metrics, paths
from embedfleet.operator.conditions import DEGRADED, MONITORED, Condition, find
from embedfleet.operator.desired import Live, Seen, needs_apply, stamped
from embedfleet.operator.informer import Bodies, Informer, read_by_reconciles
from embedfleet.operator.kube import Kube, KubeError
from embedfleet.operator.manifests import MANAGER, Images, Names, Owner, endpoint, worker_selector
from embedfleet.operator.refusal import must_look, recorded, reported
from embedfleet.operator.render import shared_gateway
from embedfleet.operator.render.config import config_hash
from embedfleet.operator.render.fleet import children
from embedfleet.operator.render.monitoring import service_monitor
from embedfleet.operator.render.shared_gateway import object_name
from embedfleet.operator.render.workers import worker_env
from embedfleet.operator.replicas import worker_replicas
from embedfleet.operator.spec import Spec, SpecError, parse_spec
from embedfleet.operator.status import (
    UNSUPPORTED_MODEL,
    changed,
    compute_status,
    monitored,
    rollout_state,
)

log = logging.getLogger(__name__)

MONITORS_RECHECK_SECONDS = 60.0
#: How long a reconcile waits for the informer's first list of every child kind at startup
#: (before it, "no such child" would mean "not listed yet" and cost an apply of every child).
SYNC_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True)
class Event:
    type: str
    reason: str
    message: str


@dataclass
class Outcome:
    """What one reconcile did, for metrics and Events."""

    body: dict[str, Any] | None = None
    desired: int = 0
    ready: int = 0
    error: str = ""
    events: list[Event] = field(default_factory=list)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _notable(old: dict[str, Any], new: dict[str, Any], error: str) -> list[Event]:
    """Events worth a human's attention: first rollout, a scale, availability flips, failures."""
    events = []
    if "observedGeneration" not in old:
        events.append(Event("Normal", "Created", "created the worker and gateway children"))
    before, after = old.get("desiredReplicas"), new["desiredReplicas"]
    if before is not None and before != after:
        events.append(Event("Normal", "Scaled", f"worker replicas {before} -> {after}"))

    def available(status: dict[str, Any]) -> str | None:
        cond = next((c for c in status.get("conditions") or () if c["type"] == "Available"), None)
        return None if cond is None else str(cond["status"])

    if available(old) != available(new) and available(new) is not None:
        cond = next(c for c in new["conditions"] if c["type"] == "Available")
        kind = "Normal" if cond["status"] == "True" else "Warning"
        events.append(Event(kind, f"Available{cond['status']}", cond["message"]))
    if error:
        events.append(Event("Warning", "ReconcileFailed", error))
    refused = find(new.get("conditions"), DEGRADED)
    if (
        refused
        and refused["reason"] == UNSUPPORTED_MODEL
        and refused != find(old.get("conditions"), DEGRADED)
    ):
        events.append(Event("Warning", UNSUPPORTED_MODEL, str(refused["message"])))
    return events


def _may_have_made_one(old: dict[str, Any]) -> bool:
    """Whether a ServiceMonitor of ours may exist: the last status said it was applied, or the
    status predates the Monitored condition. Else a disabled one is never touched (no API call,
    and none that RBAC could refuse)."""
    cond = find(old.get("conditions"), MONITORED)
    return cond is None or cond.get("status") == "True"


class Reconciler:
    def __init__(
        self,
        kube: Kube,
        images: Images,
        informer: Informer | None = None,
        bodies: Bodies | None = None,
    ) -> None:
        """Without an informer every reconcile applies every child; without `bodies` it GETs
        its fleet (tests of the manifests)."""
        self.kube = kube
        self.images = images
        self.informer = informer
        self.bodies = bodies
        self._monitors: tuple[float, bool] | None = None
        # Per fleet, per "Kind/name": the child as last applied or accepted (desired.py). Only
        # one reconcile of a fleet runs at a time (workqueue.py), so no lock.
        self._seen: dict[tuple[str, str], dict[str, Seen]] = {}
        # Per fleet: what its last clean reconcile read (`_fingerprint`), its outcome and its
        # shared gateway's name.
        # And, when its workers were wanted but not ready then, their pods' config hash: those
        # pods are read again on each pass, as a refusal of the model (refusal.py) changes no
        # child ("" when there is nothing to look for).
        self._done: dict[tuple[str, str], tuple[tuple[Any, ...], Outcome, str, str]] = {}

    def service_monitors_available(self) -> bool:
        """Whether prometheus-operator's ServiceMonitor CRD is served (re-checked each minute)."""
        now = time.monotonic()
        if self._monitors is None or now - self._monitors[0] > MONITORS_RECHECK_SECONDS:
            try:
                found = self.kube.has_resource("monitoring.coreos.com/v1", "servicemonitors")
            except KubeError:
                found = False
            self._monitors = (now, found)
        return self._monitors[1]

    def reconcile(self, namespace: str, name: str) -> Outcome:
        """One full pass for one EmbeddingDeployment. Blocking."""
        path = paths.embedding_deployment(namespace, name)
        body = None if self.bodies is None else self.bodies.get((namespace, name))
        if body is None and (self.bodies is None or not self.bodies.deleted((namespace, name))):
            # Not known yet; a fleet known deleted needs no GET to find it gone.
            body = self.kube.get_or_none(path)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return self._left(namespace, name)
        # Taken before anything is read: a child that changes while this pass runs must make
        # the next pass a full one, even when this pass already saw the change.
        fingerprint = self._fingerprint(namespace, name, body)
        if (unchanged := self._reuse_unchanged(namespace, name, fingerprint)) is not None:
            return unchanged
        meta = body["metadata"]
        key = (namespace, name)
        owner = Owner(name=name, namespace=namespace, uid=meta["uid"])
        old = body.get("status") or {}
        generation = int(meta.get("generation", 0))
        try:
            spec = parse_spec(body.get("spec") or {})
        except SpecError as err:
            return self._write_invalid(path, body, owner, str(err))
        refusal = recorded(old, generation)
        desired = 0 if refusal else worker_replicas(spec, old)
        try:
            observed, error, monitoring = self._apply(owner, spec, desired, old)
            workers = rollout_state(self._deployment(observed, owner, "worker"), desired)
            pods_config = config_hash(worker_env(spec))
            if must_look(refusal, workers) and (
                refusal := reported(self._worker_pods(*key), pods_config)
            ):
                log.warning("%s/%s: %s", namespace, name, refusal)
                desired = 0  # held there while the spec stays as it is
                observed, error, monitoring = self._apply(owner, spec, desired, old)
                workers = rollout_state(self._deployment(observed, owner, "worker"), desired)
        except KubeError as err:
            if not err.namespace_terminating:
                raise
            # The namespace controller deletes children before it gets to the fleet: re-making
            # them is refused, and retrying with backoff until the fleet's own deletion would
            # only load the API server. The fleet goes with its namespace.
            log.info("%s/%s: namespace is terminating, not re-making children", namespace, name)
            self._forget(namespace, name)
            return Outcome()
        if shared_error := self._shared_applied(namespace, spec.gateway.shared):
            error = error or f"shared gateway {spec.gateway.shared}: {shared_error}"
        gateways = rollout_state(
            self._deployment(observed, owner, "gateway"), spec.gateway.replicas
        )
        new = compute_status(
            spec=spec,
            old=old,
            generation=generation,
            workers=workers,
            gateways=gateways,
            selector=worker_selector(owner),
            endpoint=endpoint(owner, spec),
            error=error,
            now=_now(),
            monitoring=monitoring,
            refusal=refusal,
        )
        events = _notable(old, new, error)
        self._write_status(path, old, new)
        outcome = Outcome(body, desired, workers.ready, error, events)
        if not error and _settled(monitoring, spec, self._monitors):
            # Its own writes changed versions: the next pass is a full one that finds them in
            # place, and the pass after that is skipped. Its Events were posted once.
            quiet = Outcome(body, desired, workers.ready)
            waiting = pods_config if must_look(refusal, workers) else ""
            self._done[key] = (fingerprint, quiet, spec.gateway.shared, waiting)
        else:
            self._done.pop((namespace, name), None)
        return outcome

    def _reuse_unchanged(
        self, namespace: str, name: str, fingerprint: tuple[Any, ...]
    ) -> Outcome | None:
        """The last clean reconcile's outcome when nothing it reads changed since, else None;
        reusing it counts the skip and marks the fleet's shared gateways as still applied."""
        done = self._done.get((namespace, name))
        if (
            done is None
            or done[0] != fingerprint
            or (done[3] and reported(self._worker_pods(namespace, name), done[3]))
        ):
            return None
        # Rendering and hashing ten children would find each as applied: a resync of a
        # thousand fleets used to keep the reconcile threads busy (and the GIL, which every
        # reconcile shares) for tens of seconds a minute doing just that.
        metrics.RECONCILES_UNCHANGED.inc()
        self._shared_applied(namespace, done[2])
        return done[1]

    def _forget(self, namespace: str, name: str) -> None:
        """Drops what this process keeps about a fleet that is gone or going."""
        metrics.forget(namespace, name)
        self._seen.pop((namespace, name), None)
        self._done.pop((namespace, name), None)

    def _left(self, namespace: str, name: str) -> Outcome:
        """A fleet deleted or being deleted. Its children carry owner references: the garbage
        collector removes them; the shared gateways it was in lose its model now, not at the
        next resync."""
        self._forget(namespace, name)
        if self.bodies is not None:
            self.bodies.forget((namespace, name))
        try:
            self._apply_shared(namespace)
        except KubeError as err:
            log.warning("shared gateways of %s after %s left: %s", namespace, name, err)
        return Outcome()

    def _shared_applied(self, namespace: str, shared: str) -> str:
        """`_apply_shared`, logged: "" when done, else the API server's message."""
        try:
            self._apply_shared(namespace, shared)
        except KubeError as err:
            log.warning("shared gateway %s/%s: %s", namespace, shared, err)
            return err.message
        return ""

    def _write_status(self, path: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        """The status `new` when it differs from `old`; a fleet deleted meanwhile is no error."""
        if not changed(old, new):
            return
        try:
            reply = self.kube.merge_status(path, new)
            if self.bodies is not None and reply:
                self.bodies.put(reply)
        except KubeError as err:
            if err.status != 404:
                raise

    def _fingerprint(self, namespace: str, name: str, body: dict[str, Any]) -> tuple[Any, ...]:
        """What a reconcile of the fleet reads: its body (but the autoscaler's measurements),
        whether ServiceMonitors are served, and each child's version in the informer. Equal
        fingerprints render equal children and find them as equally applied."""
        seen = self._seen.get((namespace, name), {})
        versions: list[tuple[str, str | None]] = []
        for key in sorted(seen):
            kind, child = key.split("/", 1)
            if self.informer is None or not self.informer.informs(kind):
                versions.append((key, seen[key].hash))  # applied once per rendering
                continue
            live = self.informer.get(kind, namespace, child)
            versions.append((key, None if live is None else live["metadata"]["resourceVersion"]))
        return read_by_reconciles(body), self.service_monitors_available(), tuple(versions)

    def _apply(
        self, owner: Owner, spec: Spec, desired: int, old: dict[str, Any]
    ) -> tuple[dict[str, Any], str, Condition]:
        """Applies every child; returns what the API server answered (by kind/name), an error,
        and the Monitored condition."""
        monitors = self.service_monitors_available()
        observed: dict[str, Any] = {}
        monitoring = monitored(owner.name, spec.service_monitor.enabled, monitors, "")
        seen = self._seen.setdefault((owner.namespace, owner.name), {})
        if self.informer is not None:
            self.informer.wait_synced(SYNC_TIMEOUT_SECONDS)
        try:
            for rendered in children(owner, spec, desired, self.images, monitors):
                manifest, digest = stamped(rendered)
                kind, name = manifest["kind"], manifest["metadata"]["name"]
                key = f"{kind}/{name}"
                if kind == "ServiceMonitor":
                    if not self._must_apply(kind, digest, None, seen.get(key)):
                        metrics.RECONCILE_SKIPPED_APPLIES.inc()
                        continue
                    monitoring = self._apply_monitor(owner, manifest)
                    if monitoring.status == "True":  # a refusal is tried again next time
                        seen[key] = Seen(digest, 0, "")
                    continue
                if (applied := self._apply_one(manifest, digest, seen)) is not None:
                    observed[key] = applied
            if monitors and not spec.service_monitor.enabled and _may_have_made_one(old):
                self._delete_monitor(owner, spec)
        except KubeError as err:
            if err.namespace_terminating:
                raise
            log.warning("applying children of %s/%s: %s", owner.namespace, owner.name, err)
            return observed, err.message, monitoring
        return observed, "", monitoring

    def _apply_one(
        self, manifest: dict[str, Any], digest: str, seen: dict[str, Seen]
    ) -> dict[str, Any] | None:
        """Applies one stamped child unless the live one is it already; returns the child as
        applied or as live (None: not applied and not informed)."""
        kind, meta = manifest["kind"], manifest["metadata"]
        key = f"{kind}/{meta['name']}"
        live = self._live(kind, meta["namespace"], meta["name"])
        if not self._must_apply(kind, digest, live, seen.get(key)):
            metrics.RECONCILE_SKIPPED_APPLIES.inc()
            if live is not None:
                seen.setdefault(key, Seen.of(Live.of(live)))
            return live
        reply: dict[str, Any] = self.kube.apply(paths.of(manifest), manifest, MANAGER)
        if self.informer is not None and self.informer.informs(kind):
            self.informer.put(kind, reply)
        seen[key] = Seen.of(Live.of(reply))
        return reply

    def _apply_shared(self, namespace: str, also: str = "") -> None:
        """Brings every shared gateway of `namespace` in line with the fleets that name it now
        (`also`, those the fleets name, and those that exist): a fleet that joined, changed,
        left or went away is seen at the next reconcile of any fleet. One with no member left
        is deleted (the garbage collector would keep it while a member that left still owns
        it). No API call when the namespace has none."""
        bodies = self.bodies.in_namespace(namespace) if self.bodies is not None else None
        wanted = {also} - {""}
        if bodies is not None:
            wanted |= shared_gateway.names_in(bodies, namespace)
        if self.informer is not None:
            wanted |= self.informer.shared_gateways(namespace)
        if not wanted:
            return
        if bodies is None:
            bodies = self.kube.get(paths.embedding_deployments(namespace)).get("items", [])
        for name in sorted(wanted):
            served, left = shared_gateway.routable(shared_gateway.members(bodies, namespace, name))
            for member in left:
                log.warning(
                    "shared gateway %s/%s already serves a model named %s; %s is left out",
                    namespace,
                    name,
                    member.served_name,
                    member.owner.name,
                )
            seen = self._seen.setdefault((namespace, f"/shared/{name}"), {})
            if not served:
                self._delete_shared(namespace, name)
                seen.clear()
                continue
            for rendered in shared_gateway.objects(namespace, name, served, self.images):
                self._apply_one(*stamped(rendered), seen)

    def _delete_shared(self, namespace: str, name: str) -> None:
        for api_version, kind in shared_gateway.KINDS:
            informer = self.informer
            known = informer is not None and informer.informs(kind)
            if known and informer and informer.get(kind, namespace, object_name(name)) is None:
                continue  # known absent: no DELETE
            base = paths.collection(api_version, kind, namespace)
            self.kube.delete(f"{base}/{object_name(name)}")
            log.info("deleted %s %s/%s: no member left", kind, namespace, name)

    def _live(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        if self.informer is None or not self.informer.informs(kind):
            return None
        return self.informer.get(kind, namespace, name)

    def _must_apply(
        self, kind: str, digest: str, live: dict[str, Any] | None, seen: Seen | None
    ) -> bool:
        if self.informer is None:
            return True
        if not self.informer.informs(kind):
            # Not watched (ServiceMonitors: their CRD may come and go): applied once per
            # rendering while this process runs.
            return seen is None or seen.hash != digest
        return needs_apply(digest, None if live is None else Live.of(live), seen)

    def _apply_monitor(self, owner: Owner, manifest: dict[str, Any]) -> Condition:
        """A ServiceMonitor the spec asks for, where RBAC allows: refusals become a condition,
        not a failed reconcile (the default chart grants no ServiceMonitor rights)."""
        try:
            self.kube.apply(paths.of(manifest), manifest, MANAGER)
        except KubeError as err:
            if err.status == 403:
                return monitored(owner.name, True, True, err.message)
            if err.status == 404:  # the CRD went away since the last check
                self._monitors = None
                return monitored(owner.name, True, False, "")
            raise
        return monitored(owner.name, True, True, "")

    def _delete_monitor(self, owner: Owner, spec: Spec) -> None:
        try:
            self.kube.delete(paths.of(service_monitor(owner, spec)))
        except KubeError as err:
            if err.status != 403:
                raise
            # Without the right to delete, the operator could not have made one either.
            log.info("no rights on ServiceMonitors in %s: nothing to delete", owner.namespace)

    def _worker_pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The fleet's worker pods, from the API server's watch cache (resourceVersion 0)."""
        owner = Owner(name=name, namespace=namespace, uid="")
        query = {"labelSelector": worker_selector(owner), "resourceVersion": "0"}
        found = self.kube.request("GET", f"/api/v1/namespaces/{namespace}/pods", query=query)
        return list(found.get("items") or ())

    def _deployment(
        self, observed: dict[str, Any], owner: Owner, component: str
    ) -> dict[str, Any] | None:
        names = Names.of(owner.name)
        name = names.worker if component == "worker" else names.gateway
        if (applied := observed.get(f"Deployment/{name}")) is not None:
            return dict(applied)
        base = paths.collection("apps/v1", "Deployment", owner.namespace)
        try:
            found = self.kube.get_or_none(f"{base}/{name}")
            return dict(found) if found is not None else None
        except KubeError:
            return None

    def _write_invalid(
        self, path: str, body: dict[str, Any], owner: Owner, message: str
    ) -> Outcome:
        old = body.get("status") or {}
        status = {
            "observedGeneration": int(body["metadata"].get("generation", 0)),
            "conditions": [
                {
                    "type": "Degraded",
                    "status": "True",
                    "reason": "InvalidSpec",
                    "message": message,
                    "observedGeneration": int(body["metadata"].get("generation", 0)),
                    "lastTransitionTime": _now(),
                }
            ],
        }
        if _timeless(old.get("conditions")) == _timeless(status["conditions"]):
            # Already said: no write, and no Event on every resync either.
            return Outcome(body, error=message)
        reply = self.kube.merge_status(path, status)
        if self.bodies is not None and reply:
            self.bodies.put(reply)
        return Outcome(body, error=message, events=[Event("Warning", "InvalidSpec", message)])


def _settled(monitoring: Condition, spec: Spec, monitors: tuple[float, bool] | None) -> bool:
    """Whether a reconcile left nothing to try again: a refused ServiceMonitor is re-applied by
    the next reconcile, so that one must not be skipped."""
    served = monitors is not None and monitors[1]
    return not (served and spec.service_monitor.enabled) or monitoring.status == "True"


def _timeless(conditions: Any) -> list[dict[str, Any]]:
    """Conditions without their lastTransitionTime, to compare what they say."""
    return [
        {k: v for k, v in c.items() if k != "lastTransitionTime"}
        for c in conditions or ()
        if isinstance(c, dict)
    ]

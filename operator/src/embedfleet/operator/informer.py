"""A cache of the operator's children, fed by list + watch filtered at the API server by label.

kopf's watches take no label selector: with one per child kind, the operator received every
ConfigMap, Service, Deployment, ... of the cluster and dropped the ones not its own in Python,
so its CPU and memory grew with everything else running there. Here each kind is listed and
watched with `labelSelector=app.kubernetes.io/managed-by=embedfleet-operator`, and only what the
reconciler reads is kept of each object (`trim`): its identity, its desired-state hash, its
generation and resourceVersion, and a Deployment's replicas, selector and rollout status.

Each kind runs on a daemon thread (blocking client calls; see kube.py): list (paged), then watch
from the list's resourceVersion, re-watch from the last one seen when the server ends a watch,
re-list when it says the version is gone (410). A change to a child calls `on_change` with its
owner's (namespace, name), from that thread.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from embedfleet.operator import paths
from embedfleet.operator.desired import HASH_ANNOTATION
from embedfleet.operator.kube import Kube, KubeClosedError
from embedfleet.operator.manifests import LABEL_MANAGED_BY, LABEL_OWNER, LABEL_SHARED, MANAGER
from embedfleet.operator.replicas import autoscaler_desired
from embedfleet.operator.status import MIRRORED

log = logging.getLogger(__name__)

SELECTOR = f"{LABEL_MANAGED_BY}={MANAGER},{LABEL_OWNER}"
"""Ours, and naming their owner."""
PAGE = 500
RETRY_SECONDS = 2.0

ChildKey = tuple[str, str, str]
"""(kind, namespace, name) of a child."""
OwnerKey = tuple[str, str]


def trim(kind: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the reconciler needs of a child (a Deployment's status feeds the fleet's)."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    kept: dict[str, Any] = {
        "kind": kind,
        "metadata": {
            "name": meta.get("name", ""),
            "namespace": meta.get("namespace", ""),
            "resourceVersion": meta.get("resourceVersion", ""),
            "generation": meta.get("generation", 0),
            "labels": {
                LABEL_OWNER: (meta.get("labels") or {}).get(LABEL_OWNER, ""),
                # A shared gateway's objects have no one owner: this finds them (reconciler.py).
                **{k: v for k, v in (meta.get("labels") or {}).items() if k == LABEL_SHARED},
            },
            "annotations": (
                {HASH_ANNOTATION: annotations[HASH_ANNOTATION]}
                if HASH_ANNOTATION in annotations
                else {}
            ),
        },
    }
    if meta.get("deletionTimestamp"):
        kept["metadata"]["deletionTimestamp"] = meta["deletionTimestamp"]
    if kind == "Deployment":
        spec = obj.get("spec") or {}
        # The selector finds its pods (the autoscaler's scrape targets).
        kept["spec"] = {"replicas": spec.get("replicas"), "selector": spec.get("selector") or {}}
        kept["status"] = obj.get("status") or {}
    return kept


def newer(candidate: Mapping[str, Any], current: Mapping[str, Any] | None) -> bool:
    """Whether `candidate` is a later version of the object than `current`.

    resourceVersions are opaque by contract but etcd's revisions in practice; comparing them keeps
    an apply reply (stored at once) from being overwritten by the watch's older event of the same
    object arriving after it. Unparseable ones count as newer.
    """
    if current is None:
        return True
    try:
        return int(candidate["metadata"]["resourceVersion"]) >= int(
            current["metadata"]["resourceVersion"]
        )
    except (KeyError, TypeError, ValueError):
        return True


class Change(enum.Enum):
    """What a new version of an EmbeddingDeployment changed, as far as the queue cares."""

    NOTHING = "nothing"
    """Known already: the watch's echo of the operator's own status write, or an older one."""
    SPEC = "spec"
    """A new fleet or a new generation (the spec changed)."""
    OTHER = "other"
    """Status, labels or annotations (e.g. an autoscaler decision)."""
    MEASURED = "measured"
    """Only the autoscaler's measurements (and the printer columns it mirrors itself): nothing a
    reconcile reads changed. At a thousand autoscaled fleets those writes come 30 a second,
    each a reconcile rendering every child of its fleet, were they not told apart."""


def read_by_reconciles(body: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a fleet its reconcile reads: all but the version, the autoscaler's measurements
    and the columns mirrored from them (its decision, `desiredReplicas`, counts)."""
    meta = {
        k: v
        for k, v in (body.get("metadata") or {}).items()
        if k not in ("resourceVersion", "managedFields")
    }
    status = {k: v for k, v in (body.get("status") or {}).items() if k not in MIRRORED}
    auto = status.pop("autoscaling", None)
    return meta, body.get("spec"), status, autoscaler_desired({"autoscaling": auto})


#: How long a deleted fleet is remembered as deleted (Bodies.deleted): longer than the burst of
#: its children's deletion events, which the garbage collector sends within seconds.
TOMBSTONE_SECONDS = 300.0


class Bodies:
    """The latest EmbeddingDeployment bodies, fed by kopf's watch (handlers.py) and by the
    operator's own status-write replies, so that a reconcile needs no GET of its fleet.

    A deleted fleet leaves a tombstone for a while: each of its ten children's deletion events
    re-triggers its reconcile, which would otherwise GET the fleet to find it gone (a quorum read
    of etcd each; about ten thousand while a thousand fleets are deleted)."""

    def __init__(self, tombstone_seconds: float = TOMBSTONE_SECONDS) -> None:
        self._bodies: dict[OwnerKey, dict[str, Any]] = {}
        self._tombstones: dict[OwnerKey, tuple[str, float]] = {}
        """Deleted fleets -> (uid, when forgotten, monotonic), oldest first."""
        self._tombstone_seconds = tombstone_seconds
        self._lock = threading.Lock()

    def put(self, body: Mapping[str, Any]) -> Change:
        """Records `body` unless an equal or newer version is known, or it is a version of a
        deleted fleet (same uid as its tombstone); says what it changed."""
        meta = dict(body.get("metadata") or {})
        meta.pop("managedFields", None)
        kept = {**body, "metadata": meta}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        with self._lock:
            if (tomb := self._tombstones.get(key)) is not None:
                if tomb[0] and tomb[0] == meta.get("uid"):
                    return Change.NOTHING  # e.g. a status-write reply that crossed the deletion
                del self._tombstones[key]  # created again
            current = self._bodies.get(key)
            if current is not None and (
                current["metadata"].get("resourceVersion") == meta.get("resourceVersion")
                or not newer(kept, current)
            ):
                return Change.NOTHING
            self._bodies[key] = kept
        if current is None or current["metadata"].get("generation") != meta.get("generation"):
            return Change.SPEC
        if read_by_reconciles(current) == read_by_reconciles(kept):
            return Change.MEASURED
        return Change.OTHER

    def get(self, key: OwnerKey) -> dict[str, Any] | None:
        with self._lock:
            return self._bodies.get(key)

    def forget(self, key: OwnerKey, now: float | None = None) -> None:
        """The fleet is gone: drops its body, keeps a tombstone (see the class docstring)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            body = self._bodies.pop(key, None)
            uid = str(((body or {}).get("metadata") or {}).get("uid") or "")
            self._tombstones.pop(key, None)
            self._tombstones[key] = (uid, now)
            while self._tombstones:
                oldest = next(iter(self._tombstones))
                if now - self._tombstones[oldest][1] < self._tombstone_seconds:
                    break
                del self._tombstones[oldest]

    def deleted(self, key: OwnerKey, now: float | None = None) -> bool:
        """Whether the fleet was deleted recently (and not created again since)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            tomb = self._tombstones.get(key)
            return tomb is not None and now - tomb[1] < self._tombstone_seconds

    def __len__(self) -> int:
        return len(self._bodies)

    def in_namespace(self, namespace: str) -> list[dict[str, Any]]:
        with self._lock:
            return [b for (ns, _), b in self._bodies.items() if ns == namespace]


class Informer:
    def __init__(
        self,
        kube: Kube,
        kinds: Sequence[tuple[str, str]],
        namespace: str,
        on_change: Callable[[OwnerKey], None],
        watch_seconds: int = 300,
    ) -> None:
        """`kinds`: (apiVersion, kind) pairs; `namespace` empty watches every namespace."""
        self.kube = kube
        self.kinds = tuple(kinds)
        self.namespace = namespace
        self.on_change = on_change
        self.watch_seconds = watch_seconds
        self._objects: dict[ChildKey, dict[str, Any]] = {}
        #: (namespace, ConfigMap name) -> the shared gateway it configures: every reconcile asks
        #: for a namespace's shared gateways, and a scan of every child for them was O(N) per
        #: fleet (a third of an idle operator's CPU at N = 1,000).
        self._shared: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        self._synced = {kind: threading.Event() for _, kind in self.kinds}
        self._stopped = threading.Event()

    # -- what the reconciler reads -------------------------------------------------------------

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._objects.get((kind, namespace, name))

    def shared_gateways(self, namespace: str) -> set[str]:
        """The shared gateways of `namespace` that have a ConfigMap, members or not."""
        with self._lock:
            return {shared for (ns, _), shared in self._shared.items() if ns == namespace}

    def informs(self, kind: str) -> bool:
        return kind in self._synced

    def put(self, kind: str, obj: Mapping[str, Any]) -> None:
        """Records an apply reply, so that the next reconcile need not wait for its watch event."""
        self._store(kind, trim(kind, obj), notify=False)

    def wait_synced(self, timeout: float) -> bool:
        """Blocks until every kind has been listed once (or `timeout` passed)."""
        deadline = time.monotonic() + timeout
        return all(e.wait(max(0.0, deadline - time.monotonic())) for e in self._synced.values())

    def __len__(self) -> int:
        return len(self._objects)

    # -- the threads ---------------------------------------------------------------------------

    def start(self) -> None:
        for api_version, kind in self.kinds:
            threading.Thread(
                target=self._run, args=(api_version, kind), name=f"informer-{kind}", daemon=True
            ).start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self, api_version: str, kind: str) -> None:
        path = paths.collection(api_version, kind, self.namespace)
        while not self._stopped.is_set():
            try:
                version = self._list(path, kind)
                self._synced[kind].set()
                while version and not self._stopped.is_set():
                    version = self._watch(path, kind, version)
            except KubeClosedError:
                return
            except Exception as err:  # an I/O shell: log, pause, re-list
                log.warning("watching %s: %s", kind, err)
                self._stopped.wait(RETRY_SECONDS)

    def _list(self, path: str, kind: str) -> str:
        found: dict[ChildKey, dict[str, Any]] = {}
        query = {"labelSelector": SELECTOR, "limit": str(PAGE)}
        while True:
            page = self.kube.request("GET", path, query=query)
            for item in page.get("items") or ():
                trimmed = trim(kind, item)
                found[_key(trimmed)] = trimmed
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                version = str(meta.get("resourceVersion", ""))
                break
            query = {**query, "continue": meta["continue"]}
        changed: set[OwnerKey] = set()
        with self._lock:
            stale = [k for k in self._objects if k[0] == kind and k not in found]
            for key in stale:
                changed.add(_owner(self._objects[key]))
                self._pop(key)
            for key, obj in found.items():
                old = self._objects.get(key)
                if (
                    old is None
                    or old["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]
                ):
                    self._set(key, obj)
                    changed.add(_owner(obj))
        for owner in changed:
            self.on_change(owner)
        return version

    def _watch(self, path: str, kind: str, version: str) -> str:
        """One watch; returns the version to resume from, "" to re-list."""
        query = {
            "labelSelector": SELECTOR,
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.watch_seconds),
        }
        for event in self.kube.watch(path, query, read_timeout=self.watch_seconds + 30):
            kind_of_event = event.get("type")
            obj = event.get("object") or {}
            if kind_of_event == "ERROR":
                if obj.get("code") != 410:
                    log.warning("watch of %s: %s", kind, obj.get("message"))
                return ""
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if kind_of_event == "BOOKMARK":
                continue
            trimmed = trim(kind, obj)
            if kind_of_event == "DELETED":
                with self._lock:
                    self._pop(_key(trimmed))
                self.on_change(_owner(trimmed))
            else:
                self._store(kind, trimmed, notify=True)
        return version

    def _store(self, kind: str, trimmed: dict[str, Any], notify: bool) -> None:
        key = _key(trimmed)
        with self._lock:
            current = self._objects.get(key)
            if not newer(trimmed, current):
                return
            seen_already = current is not None and (
                current["metadata"]["resourceVersion"] == trimmed["metadata"]["resourceVersion"]
            )
            self._set(key, trimmed)
        # The watch event of the operator's own apply, already stored from its reply: no news.
        if notify and not seen_already:
            self.on_change(_owner(trimmed))

    def _set(self, key: ChildKey, obj: dict[str, Any]) -> None:
        """Stores `obj` and keeps the shared-gateway index in step (the lock held)."""
        self._objects[key] = obj
        kind, namespace, name = key
        if kind == "ConfigMap":
            shared = obj["metadata"]["labels"].get(LABEL_SHARED)
            if shared is None:
                self._shared.pop((namespace, name), None)
            else:
                self._shared[(namespace, name)] = str(shared)

    def _pop(self, key: ChildKey) -> None:
        """Drops `key` from the cache and the index (the lock held)."""
        kind, namespace, name = key
        if kind == "ConfigMap":
            self._shared.pop((namespace, name), None)
        self._objects.pop(key, None)


def _key(obj: Mapping[str, Any]) -> ChildKey:
    meta = obj["metadata"]
    return (str(obj["kind"]), str(meta["namespace"]), str(meta["name"]))


def _owner(obj: Mapping[str, Any]) -> OwnerKey:
    meta = obj["metadata"]
    return (str(meta["namespace"]), str(meta["labels"].get(LABEL_OWNER, "")))

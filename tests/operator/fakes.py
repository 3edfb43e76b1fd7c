"""In-process stand-ins of the operator tests, each named as a fake."""

from __future__ import annotations

import copy
import threading
from typing import Any

from embedfleet.operator.informer import trim
from embedfleet.operator.kube import KubeError


class InMemoryLeases:
    """A FAKE of Kube's lease calls (get_or_none, request): one Lease in memory, with
    resourceVersion conflicts; `hold_next_get` keeps the next GET (a renewal's) in flight."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.holding = False
        self.held = threading.Event()
        self.go_on = threading.Event()

    def hold_next_get(self) -> None:
        self.holding = True
        self.held.clear()
        self.go_on.clear()

    def get_or_none(self, path: str) -> Any:
        if self.holding:
            self.holding = False
            self.held.set()
            self.go_on.wait(10)
        return None if self.lease is None else {**self.lease, "spec": dict(self.lease["spec"])}

    def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        version = str(body.get("metadata", {}).get("resourceVersion", ""))
        if method == "PUT" and version != str(self.version):
            raise KubeError(method, path, 409, "conflict")
        self.version += 1
        self.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": self.version}}
        return self.lease


class NoFleetsKube:
    """A FAKE Kube on which no EmbeddingDeployment exists (every GET answers 404); it records the
    paths asked for."""

    def __init__(self) -> None:
        self.gets: list[str] = []

    def get_or_none(self, path: str) -> Any:
        self.gets.append(path)
        return None


TERMINATING_STATUS = (
    '{"kind":"Status","apiVersion":"v1","status":"Failure","message":"configmaps \\"f-config\\" is'
    ' forbidden: unable to create new content in namespace ns because it is being terminated",'
    '"reason":"Forbidden","details":{"name":"f-config","kind":"configmaps","causes":[{"reason":'
    '"NamespaceTerminating","message":"namespace ns is being terminated","field":'
    '"metadata.namespace"}]},"code":403}'
)
"""kube-apiserver's NamespaceLifecycle admission's answer to a create in a terminating namespace."""


class TerminatingNamespaceKube:
    """A FAKE Kube whose namespace is being deleted: the fleet is still there (the namespace
    controller has not got to it), every apply is refused as the API server refuses a create
    there; it records the writes asked for."""

    def __init__(self, fleet: dict[str, Any]) -> None:
        self.fleet = fleet
        self.writes: list[str] = []

    def get_or_none(self, path: str) -> Any:
        return self.fleet if path.endswith(f"/{self.fleet['metadata']['name']}") else None

    def has_resource(self, api_version: str, plural: str) -> bool:
        return False

    def apply(self, path: str, body: Any, manager: str) -> Any:
        self.writes.append(f"APPLY {path}")
        raise KubeError("PATCH", path, 403, TERMINATING_STATUS)

    def merge_status(self, path: str, status: Any) -> Any:
        self.writes.append(f"PATCH {path}/status")
        return None

    def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        self.writes.append(f"{method} {path}")
        return None


FLEET: dict[str, Any] = {
    "apiVersion": "embedfleet.dev/v1alpha1",
    "kind": "EmbeddingDeployment",
    "metadata": {
        "name": "f", "namespace": "ns", "uid": "u-f", "generation": 1, "resourceVersion": "1",
    },
    "spec": {"model": {"source": "hf://org/model"}},
}  # fmt: skip


class FakeInformer:
    """A FAKE of the informer's lookups over a dict (the real one lists and watches an API
    server)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}

    def informs(self, kind: str) -> bool:
        return kind != "ServiceMonitor"

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((kind, namespace, name))

    def put(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self.objects[(kind, meta["namespace"], meta["name"])] = trim(kind, obj)

    def wait_synced(self, timeout: float) -> bool:
        return True

    def shared_gateways(self, namespace: str) -> set[str]:
        return set()


class ApplyingKube:
    """A FAKE API server that accepts every apply and status write, numbering versions in order
    (the test's own edits take theirs from it too, as etcd's revisions would); the worker pods
    it lists are `pods`."""

    def __init__(self) -> None:
        self.writes: list[str] = []
        self.applied: dict[str, Any] = {}
        self.pods: list[dict[str, Any]] = []
        self.pod_lists = 0
        self.version = 100

    def next_version(self) -> str:
        self.version += 1
        return str(self.version)

    def has_resource(self, group_version: str, plural: str) -> bool:
        return False

    def apply(self, path: str, body: Any, manager: str) -> Any:
        self.writes.append(f"APPLY {path}")
        self.applied[path] = body
        reply = copy.deepcopy(body)
        reply["metadata"]["resourceVersion"] = self.next_version()
        reply["metadata"]["generation"] = 1
        return reply

    def request(self, method: str, path: str, **_: Any) -> Any:
        """Lists of pods (the workers of a fleet that is not ready yet)."""
        assert (method, path.rsplit("/", 1)[-1]) == ("GET", "pods")
        self.pod_lists += 1
        return {"items": copy.deepcopy(self.pods)}

    def merge_status(self, path: str, status: Any) -> Any:
        self.writes.append(f"STATUS {path}")
        fleet = copy.deepcopy(FLEET)
        fleet["metadata"]["resourceVersion"] = self.next_version()
        fleet["status"] = status
        return fleet

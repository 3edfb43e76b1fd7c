"""In-process stand-ins of the operator tests, each named as a fake."""

from __future__ import annotations

import threading
from typing import Any

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

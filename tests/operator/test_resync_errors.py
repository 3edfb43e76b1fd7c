"""Every failed reconcile counts in the reconcile-errors metric, the periodic resync's included."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import REGISTRY

from embedfleet.operator import handlers
from embedfleet.operator.kube import KubeError
from embedfleet.operator.workqueue import RESYNC


class FakeKube:
    """A FAKE of Kube for the resync: `call` runs the call inline; `request` lists `items` or, with
    `status` set, fails as the API server would (403 once the operator's RBAC is gone)."""

    def __init__(self, items: list[dict[str, Any]], status: int | None = None) -> None:
        self.items = items
        self.status = status

    async def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    def request(self, method: str, path: str, query: Any = None) -> Any:
        if self.status is not None:
            raise KubeError(method, path, self.status, "forbidden")
        return {"items": self.items}


class FakeQueue:
    """A FAKE of the work queue: records what was triggered."""

    def __init__(self) -> None:
        self.triggered: list[tuple[tuple[str, str], int]] = []

    def trigger(self, key: tuple[str, str], priority: int) -> None:
        self.triggered.append((key, priority))


def errors() -> float:
    value = REGISTRY.get_sample_value("embedfleet_operator_reconcile_errors_total")
    return value or 0.0


def failed_reconciles() -> float:
    value = REGISTRY.get_sample_value("embedfleet_operator_reconciles_total", {"result": "error"})
    return value or 0.0


def test_a_failed_resync_listing_counts_as_a_failed_reconcile() -> None:
    queue = FakeQueue()
    before = (errors(), failed_reconciles())
    ok = asyncio.run(handlers.resync_once(FakeKube([], status=403), queue, ""))  # type: ignore[arg-type]
    assert not ok
    assert (errors(), failed_reconciles()) == (before[0] + 1, before[1] + 1)
    assert queue.triggered == []


def test_a_resync_queues_every_fleet_and_counts_no_error() -> None:
    items = [{"metadata": {"namespace": "prod", "name": n}} for n in ("a", "b")]
    queue = FakeQueue()
    before = errors()
    ok = asyncio.run(handlers.resync_once(FakeKube(items), queue, ""))  # type: ignore[arg-type]
    assert ok
    assert errors() == before
    assert queue.triggered == [(("prod", "a"), RESYNC), (("prod", "b"), RESYNC)]

"""The informer's index of shared-gateway ConfigMaps (informer.py): what `shared_gateways`
answers follows every way the cache changes (an apply reply, a watch event, a re-list)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

from embedfleet.operator.informer import Informer
from embedfleet.operator.kube import Kube
from embedfleet.operator.manifests import LABEL_OWNER, LABEL_SHARED


def config_map(namespace: str, name: str, version: int, shared: str | None) -> dict[str, Any]:
    labels = {LABEL_OWNER: "" if shared else name}
    if shared is not None:
        labels[LABEL_SHARED] = shared
    meta = {"name": name, "namespace": namespace, "resourceVersion": str(version)}
    return {"kind": "ConfigMap", "metadata": {**meta, "labels": labels}}


class ListingKube:
    """Answers a re-list with `items` and a watch with `events`."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []

    def request(self, method: str, path: str, query: Any = None, **_: Any) -> Any:
        return {"items": self.items, "metadata": {"resourceVersion": "99"}}

    def watch(self, path: str, query: Any, read_timeout: float) -> Iterator[dict[str, Any]]:
        yield from self.events


def test_the_index_follows_applies_watch_events_and_relists() -> None:
    kube = ListingKube()
    informer = Informer(cast(Kube, kube), [("v1", "ConfigMap")], "", lambda _: None)
    informer.put("ConfigMap", config_map("a", "search-gateway", 1, "search"))
    informer.put("ConfigMap", config_map("a", "chat-gateway", 1, "chat"))
    informer.put("ConfigMap", config_map("b", "search-gateway", 1, "search"))
    informer.put("ConfigMap", config_map("a", "f-config", 1, None))  # a fleet's own
    assert informer.shared_gateways("a") == {"search", "chat"}
    assert informer.shared_gateways("b") == {"search"}

    # The label taken off (a newer version), and a watch's DELETED event.
    informer.put("ConfigMap", config_map("a", "chat-gateway", 2, None))
    kube.events = [{"type": "DELETED", "object": config_map("b", "search-gateway", 2, "search")}]
    informer._watch("/api/v1/configmaps", "ConfigMap", "1")
    assert informer.shared_gateways("a") == {"search"}
    assert informer.shared_gateways("b") == set()

    # A re-list that no longer has namespace a's and brings one of c's.
    kube.items = [config_map("c", "x-gateway", 3, "x")]
    informer._list("/api/v1/configmaps", "ConfigMap")
    assert informer.shared_gateways("a") == set()
    assert informer.shared_gateways("c") == {"x"}
    assert informer.get("ConfigMap", "a", "search-gateway") is None

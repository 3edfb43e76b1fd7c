"""The API server's own request counters (apiserver_request_total), for tests and benchmarks
that count what a controller asks of it: how many writes, of which kinds, by which verb."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client.parser import text_string_to_metric_families

from embedfleet.testing.apiclient import ApiClient

WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
"""Verbs that change stored state (the API server's labels; APPLY is server-side apply)."""

RequestKey = tuple[str, str, str]
"""(verb, resource, subresource) as the API server labels a request."""
Counts = dict[RequestKey, float]


def parse_requests(text: str) -> Counts:
    """apiserver_request_total from a /metrics text, summed over codes, groups and versions."""
    counts: Counts = {}
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            if sample.name != "apiserver_request_total":
                continue
            labels = sample.labels
            key = (
                labels.get("verb", ""),
                labels.get("resource", ""),
                labels.get("subresource", ""),
            )
            counts[key] = counts.get(key, 0.0) + sample.value
    return counts


def request_counts(api: ApiClient) -> Counts:
    """The API server's request counters now (GET /metrics)."""
    status, text = api.request("GET", "/metrics")
    if status != 200:
        raise RuntimeError(f"GET /metrics -> HTTP {status}: {text[:200]}")
    return parse_requests(text)


def delta(after: Mapping[RequestKey, float], before: Mapping[RequestKey, float]) -> Counts:
    """Requests between two readings (only the keys that grew)."""
    out: Counts = {}
    for key, value in after.items():
        if (grew := value - before.get(key, 0.0)) > 0:
            out[key] = grew
    return out


def writes(
    counts: Mapping[RequestKey, float],
    resources: Iterable[str],
    verbs: Iterable[str] = WRITE_VERBS,
    subresources: Iterable[str] | None = None,
) -> Counts:
    """The write requests among `counts` on `resources` (any subresource unless given)."""
    wanted, kinds = set(verbs), set(resources)
    subs = None if subresources is None else set(subresources)
    return {
        key: n
        for key, n in counts.items()
        if key[0] in wanted and key[1] in kinds and (subs is None or key[2] in subs)
    }

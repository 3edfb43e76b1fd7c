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


def scrape(api: ApiClient) -> str:
    """The API server's /metrics text."""
    status, text = api.request("GET", "/metrics")
    if status != 200:
        raise RuntimeError(f"GET /metrics -> HTTP {status}: {text[:200]}")
    return text


def request_counts(api: ApiClient) -> Counts:
    """The API server's request counters now (GET /metrics)."""
    return parse_requests(scrape(api))


Totals = dict[str, tuple[float, float]]
"""Label value -> (sum of seconds, count) of a histogram."""


def histogram_totals(text: str, family_name: str, label: str) -> Totals:
    """A histogram's _sum and _count from a /metrics text, summed over every label but `label`:
    e.g. apiserver_request_duration_seconds by verb, etcd_request_duration_seconds by operation."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != family_name:
            continue
        for sample in family.samples:
            key = sample.labels.get(label, "")
            if sample.name == f"{family_name}_sum":
                sums[key] = sums.get(key, 0.0) + sample.value
            elif sample.name == f"{family_name}_count":
                counts[key] = counts.get(key, 0.0) + sample.value
    return {key: (sums.get(key, 0.0), n) for key, n in counts.items()}


def mean_seconds(after: Mapping[str, tuple[float, float]], before: Totals) -> dict[str, float]:
    """The mean of the observations between two readings, by label value (those with any)."""
    out: dict[str, float] = {}
    for key, (total, n) in after.items():
        earlier_total, earlier_n = before.get(key, (0.0, 0.0))
        if n > earlier_n:
            out[key] = (total - earlier_total) / (n - earlier_n)
    return out


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

"""A plain Prometheus configuration from the monitors the chart and the operator ship (pure).

A cluster without the Prometheus Operator still has a Prometheus that discovers pods through the
API server. `monitor_jobs` renders a ServiceMonitor or PodMonitor into the scrape config the
Prometheus Operator would generate for it: the same discovery role and relabelling
(prometheus-operator's pkg/prometheus/promcfg.go), so the target labels (`job`, `namespace`,
`pod`, `service`, `container`, `endpoint`) are the ones the dashboards and alerts see in a cluster
that has the operator. ServiceMonitors discover EndpointSlices (prometheus-operator's
`serviceDiscoveryRole: EndpointSlice`; v1 Endpoints are deprecated), which list not-ready
endpoints too, so a hung pod stays a target and its `up` drops to 0. Discovery is Prometheus'
`kubernetes_sd_configs` (`kubernetes_sd`) or, for a build without it, the same targets and meta
labels over HTTP SD (`http_sd`, served by embedfleet.testing.promsd).

`compress_rules` divides every duration of a rule file (each `for:` and each range selector) by a
factor, so that alerts written for minutes fire and clear within a test's seconds with their
expressions otherwise verbatim.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

SERVICE_MONITOR = "ServiceMonitor"
POD_MONITOR = "PodMonitor"


class UnsupportedMonitorError(ValueError):
    """A monitor uses a field this renderer does not implement (rather than ignoring it)."""


def label_name(key: str) -> str:
    """A Kubernetes label key as Prometheus' SD meta labels spell it (app.kubernetes.io/name ->
    app_kubernetes_io_name)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def _selector_keeps(selector: Mapping[str, Any], prefix: str) -> list[dict[str, Any]]:
    if selector.get("matchExpressions"):
        raise UnsupportedMonitorError("selector.matchExpressions")
    return [
        {
            "action": "keep",
            "source_labels": [
                f"{prefix}_label_{label_name(k)}",
                f"{prefix}_labelpresent_{label_name(k)}",
            ],
            "regex": f"({v});true",
        }
        for k, v in sorted((selector.get("matchLabels") or {}).items())
    ]


def _namespaces(monitor: Mapping[str, Any]) -> list[str]:
    chosen = monitor["spec"].get("namespaceSelector") or {}
    if chosen.get("any"):
        return []
    return list(chosen.get("matchNames") or [monitor["metadata"]["namespace"]])


Discovery = Callable[[str, Sequence[str]], dict[str, Any]]
"""(role, namespaces) -> the scrape config's service-discovery part."""


def kubernetes_sd(kubeconfig: str) -> Discovery:
    """Prometheus' own Kubernetes SD, reaching the API server with a kubeconfig."""

    def sd(role: str, namespaces: Sequence[str]) -> dict[str, Any]:
        config: dict[str, Any] = {"role": role, "kubeconfig_file": kubeconfig}
        if namespaces:
            config["namespaces"] = {"names": list(namespaces)}
        return {"kubernetes_sd_configs": [config]}

    return sd


def http_sd(url: str, refresh: str = "2s") -> Discovery:
    """The same targets and meta labels from embedfleet.testing.promsd.SdBridge at `url`."""

    def sd(role: str, namespaces: Sequence[str]) -> dict[str, Any]:
        query = urlencode([("role", role), *(("namespace", ns) for ns in namespaces)])
        return {"http_sd_configs": [{"url": f"{url}/targets?{query}", "refresh_interval": refresh}]}

    return sd


def _job(
    name: str, endpoint: Mapping[str, Any], sd: dict[str, Any], relabel: list[dict[str, Any]]
) -> dict[str, Any]:
    return {"job_name": name, **_common(endpoint), **sd, "relabel_configs": relabel}


def _common(endpoint: Mapping[str, Any]) -> dict[str, Any]:
    for unsupported in ("relabelings", "metricRelabelings", "targetPort", "bearerTokenSecret"):
        if endpoint.get(unsupported):
            raise UnsupportedMonitorError(f"endpoint.{unsupported}")
    job: dict[str, Any] = {
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "honor_timestamps": True,
        "metrics_path": endpoint.get("path", "/metrics"),
        "scheme": endpoint.get("scheme", "http"),
    }
    if "interval" in endpoint:
        job["scrape_interval"] = endpoint["interval"]
    if "scrapeTimeout" in endpoint:
        job["scrape_timeout"] = endpoint["scrapeTimeout"]
    return job


def _copy(source: str, target: str) -> dict[str, Any]:
    return {"source_labels": [source], "target_label": target}


def _job_and_endpoint(prefix: str, job_label: str | None, port: str) -> list[dict[str, Any]]:
    """The job from the object's `job_label` label when it has one; the endpoint label."""
    out = []
    if job_label:
        source = f"{prefix}_label_{label_name(job_label)}"
        out.append(
            {
                "source_labels": [source],
                "target_label": "job",
                "regex": "(.+)",
                "replacement": "${1}",
            }
        )
    return [*out, {"target_label": "endpoint", "replacement": port}]


def service_monitor_jobs(monitor: Mapping[str, Any], sd: Discovery) -> list[dict[str, Any]]:
    """One scrape job per endpoint of a ServiceMonitor."""
    spec, meta = monitor["spec"], monitor["metadata"]
    jobs = []
    for i, endpoint in enumerate(spec["endpoints"]):
        port = endpoint.get("port")
        if not port:
            raise UnsupportedMonitorError("endpoint without a port name")
        slice_meta = "__meta_kubernetes_endpointslice"
        relabel = [
            {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
            *_selector_keeps(spec.get("selector") or {}, "__meta_kubernetes_service"),
            {"action": "keep", "source_labels": [f"{slice_meta}_port_name"], "regex": port},
            *(
                {
                    "source_labels": [
                        f"{slice_meta}_address_target_kind",
                        f"{slice_meta}_address_target_name",
                    ],
                    "separator": ";",
                    "regex": f"{kind};(.*)",
                    "replacement": "${1}",
                    "target_label": kind.lower(),
                }
                for kind in ("Node", "Pod")
            ),
            {
                "action": "drop",
                "source_labels": ["__meta_kubernetes_pod_phase"],
                "regex": "(Failed|Succeeded)",
            },
            _copy("__meta_kubernetes_namespace", "namespace"),
            _copy("__meta_kubernetes_service_name", "service"),
            _copy("__meta_kubernetes_pod_name", "pod"),
            _copy("__meta_kubernetes_pod_container_name", "container"),
            {**_copy("__meta_kubernetes_service_name", "job"), "replacement": "${1}"},
        ]
        relabel += _job_and_endpoint("__meta_kubernetes_service", spec.get("jobLabel"), port)
        name = f"serviceMonitor/{meta['namespace']}/{meta['name']}/{i}"
        jobs.append(_job(name, endpoint, sd("endpointslice", _namespaces(monitor)), relabel))
    return jobs


def pod_monitor_jobs(monitor: Mapping[str, Any], sd: Discovery) -> list[dict[str, Any]]:
    """One scrape job per podMetricsEndpoint of a PodMonitor."""
    spec, meta = monitor["spec"], monitor["metadata"]
    jobs = []
    for i, endpoint in enumerate(spec["podMetricsEndpoints"]):
        port = endpoint.get("port")
        if not port:
            raise UnsupportedMonitorError("podMetricsEndpoint without a port name")
        relabel = [
            {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
            {
                "action": "drop",
                "source_labels": ["__meta_kubernetes_pod_phase"],
                "regex": "(Failed|Succeeded)",
            },
            *_selector_keeps(spec.get("selector") or {}, "__meta_kubernetes_pod"),
            {
                "action": "keep",
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": port,
            },
            _copy("__meta_kubernetes_namespace", "namespace"),
            _copy("__meta_kubernetes_pod_container_name", "container"),
            _copy("__meta_kubernetes_pod_name", "pod"),
            {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
        ]
        relabel += _job_and_endpoint("__meta_kubernetes_pod", spec.get("jobLabel"), port)
        name = f"podMonitor/{meta['namespace']}/{meta['name']}/{i}"
        jobs.append(_job(name, endpoint, sd("pod", _namespaces(monitor)), relabel))
    return jobs


def monitor_jobs(monitor: Mapping[str, Any], sd: Discovery) -> list[dict[str, Any]]:
    """The scrape jobs of a ServiceMonitor or PodMonitor manifest."""
    kind = monitor.get("kind")
    if kind == SERVICE_MONITOR:
        return service_monitor_jobs(monitor, sd)
    if kind == POD_MONITOR:
        return pod_monitor_jobs(monitor, sd)
    raise UnsupportedMonitorError(f"kind {kind!r}")


# -- rule files ------------------------------------------------------------------------------------

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_DURATION = re.compile(r"(\d+)(ms|[smhdwy])")
_RANGE = re.compile(r"\[((?:\d+(?:ms|[smhdwy]))+)\]")


def seconds(duration: str) -> float:
    """A Prometheus duration ("1h30m", "5m", "500ms") in seconds."""
    parts = _DURATION.findall(duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a Prometheus duration: {duration!r}")
    return sum(int(n) * _UNITS[u] for n, u in parts)


def duration(value: float) -> str:
    """Seconds as a Prometheus duration, in whole milliseconds (never 0)."""
    millis = max(1, round(value * 1000))
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def compress_rules(doc: Mapping[str, Any], factor: float) -> dict[str, Any]:
    """The rule file `doc` with every `for:` and range selector divided by `factor`."""

    def scaled(text: str) -> str:
        return duration(seconds(text) / factor)

    groups = []
    for group in doc["groups"]:
        rules = []
        for rule in group["rules"]:
            out = dict(rule)
            out["expr"] = _RANGE.sub(lambda m: f"[{scaled(m.group(1))}]", rule["expr"])
            if "for" in rule:
                out["for"] = scaled(rule["for"])
            rules.append(out)
        groups.append({**group, "rules": rules})
    return {**doc, "groups": groups}

"""embedfleet.testing.promconfig: monitors rendered to plain scrape configs, and rule files with
time compressed; both accepted by promtool (no cluster needed)."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from embedfleet.common.net import free_ports
from embedfleet.operator.manifests import Owner
from embedfleet.operator.render.monitoring import service_monitor
from embedfleet.operator.spec import parse_spec
from embedfleet.testing.polling import wait_for
from embedfleet.testing.promconfig import (
    UnsupportedMonitorError,
    compress_rules,
    duration,
    http_sd,
    kubernetes_sd,
    monitor_jobs,
    seconds,
)
from embedfleet.testing.promsd import SdBridge, has_kubernetes_sd, pod_groups

from .helpers import RULES, Prometheus, binary

EXAMPLE_SPEC = {
    "model": {"source": "file:///models/m"},
    "monitoring": {"serviceMonitor": {"enabled": True, "interval": "2s"}},
}
POD_MONITOR: dict[str, Any] = {
    "apiVersion": "monitoring.coreos.com/v1",
    "kind": "PodMonitor",
    "metadata": {"name": "embedfleet", "namespace": "embedfleet-system"},
    "spec": {
        "jobLabel": "app.kubernetes.io/component",
        "selector": {"matchLabels": {"app.kubernetes.io/name": "embedfleet"}},
        "namespaceSelector": {"matchNames": ["embedfleet-system"]},
        "podMetricsEndpoints": [{"port": "metrics", "honorLabels": True, "interval": "2s"}],
    },
}


def fleet_monitor() -> dict[str, Any]:
    owner = Owner(name="minilm", namespace="default", uid="u")
    return service_monitor(owner, parse_spec(EXAMPLE_SPEC))


def rule(job: dict[str, Any], target: str) -> dict[str, Any]:
    return next(r for r in job["relabel_configs"] if r.get("target_label") == target)


def test_the_operators_service_monitor_keeps_its_services_and_ports() -> None:
    jobs = monitor_jobs(fleet_monitor(), kubernetes_sd("/kubeconfig"))
    assert [j["job_name"] for j in jobs] == [
        "serviceMonitor/default/minilm/0",
        "serviceMonitor/default/minilm/1",
    ]
    worker, gateway = jobs
    assert worker["kubernetes_sd_configs"] == [
        {
            "role": "endpointslice",
            "kubeconfig_file": "/kubeconfig",
            "namespaces": {"names": ["default"]},
        }
    ]
    keeps = [r for r in worker["relabel_configs"] if r.get("action") == "keep"]
    assert {"action": "keep", "source_labels": [
        "__meta_kubernetes_service_label_app_kubernetes_io_instance",
        "__meta_kubernetes_service_labelpresent_app_kubernetes_io_instance",
    ], "regex": "(minilm);true"} in keeps  # fmt: skip
    port_keeps = [r["regex"] for r in keeps if r["source_labels"][0].endswith("port_name")]
    assert port_keeps == ["metrics"]
    assert gateway["metrics_path"] == "/metrics"
    assert rule(gateway, "endpoint")["replacement"] == "http"
    # No jobLabel: the job is the Service's name (minilm-worker matches the alerts' ".*worker.*").
    assert rule(worker, "job")["source_labels"] == ["__meta_kubernetes_service_name"]
    assert worker["scrape_interval"] == "2s"
    assert worker["honor_labels"] is False


def test_a_pod_monitor_uses_its_job_label_and_honors_labels() -> None:
    (job,) = monitor_jobs(POD_MONITOR, kubernetes_sd("/kubeconfig"))
    assert job["kubernetes_sd_configs"][0]["role"] == "pod"
    assert job["honor_labels"] is True
    job_rules = [r for r in job["relabel_configs"] if r.get("target_label") == "job"]
    # The default first (namespace/name), then the pod's component label when it has one.
    assert job_rules[0]["replacement"] == "embedfleet-system/embedfleet"
    assert job_rules[1]["source_labels"] == [
        "__meta_kubernetes_pod_label_app_kubernetes_io_component"
    ]


def test_unsupported_fields_are_refused_not_ignored() -> None:
    monitor = fleet_monitor()
    monitor["spec"]["endpoints"][0]["relabelings"] = [{"action": "drop"}]
    with pytest.raises(UnsupportedMonitorError, match="relabelings"):
        monitor_jobs(monitor, kubernetes_sd("/kubeconfig"))
    with pytest.raises(UnsupportedMonitorError, match="kind"):
        monitor_jobs({"kind": "Probe"}, kubernetes_sd("/kubeconfig"))


def promtool_check_config(text: str) -> tuple[int, str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "prometheus.yml"
        path.write_text(text)
        proc = subprocess.run(
            [binary("promtool"), "check", "config", str(path)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


def test_promtool_accepts_the_rendered_config() -> None:
    sd = http_sd("http://127.0.0.1:1")
    jobs = monitor_jobs(fleet_monitor(), sd) + monitor_jobs(POD_MONITOR, sd)
    code, output = promtool_check_config(yaml.safe_dump({"scrape_configs": jobs}))
    assert code == 0, output
    if has_kubernetes_sd(promtool_check_config):
        sd = kubernetes_sd(str(RULES))  # any existing file: promtool only checks it exists
        jobs = monitor_jobs(fleet_monitor(), sd)
        code, output = promtool_check_config(yaml.safe_dump({"scrape_configs": jobs}))
        assert code == 0, output


def container(name: str, ports: dict[str, int]) -> dict[str, Any]:
    return {"name": name, "image": "i", "ports": [
        {"name": n, "containerPort": p, "protocol": "TCP"} for n, p in ports.items()
    ]}  # fmt: skip


def fake_api(metrics_port: int, http_port: int) -> dict[str, dict[str, Any]]:
    """What the API server would list for a MiniLM fleet: 2 workers (one not ready), 1 gateway."""
    selector = {"app.kubernetes.io/name": "embedfleet", "app.kubernetes.io/instance": "minilm"}

    def pod(name: str, component: str, ip: str, ports: dict[str, int]) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "namespace": "default", "uid": name,
                         "labels": {**selector, "app.kubernetes.io/component": component}},
            "spec": {"nodeName": "n", "containers": [container(component, ports)]},
            "status": {"podIP": ip, "phase": "Running",
                       "conditions": [{"type": "Ready", "status": "True"}]},
        }  # fmt: skip

    def service(name: str, component: str) -> dict[str, Any]:
        labels = {**selector, "app.kubernetes.io/component": component}
        return {"metadata": {"name": name, "namespace": "default", "labels": labels}}

    def endpoint(pod: str, ip: str, ready: bool) -> dict[str, Any]:
        return {"addresses": [ip], "conditions": {"ready": ready, "serving": ready},
                "targetRef": {"kind": "Pod", "name": pod, "namespace": "default"}}  # fmt: skip

    worker_ports = {"grpc": 1, "metrics": metrics_port}
    pods = [
        pod("w0", "worker", "127.0.0.1", worker_ports),
        pod("w1", "worker", "127.0.0.2", worker_ports),
        pod("g0", "gateway", "127.0.0.3", {"http": http_port}),
    ]
    slices = [
        {"metadata": {"name": "minilm-worker-x", "namespace": "default",
                      "labels": {"kubernetes.io/service-name": "minilm-worker"}},
         "addressType": "IPv4",
         "endpoints": [endpoint("w0", "127.0.0.1", True), endpoint("w1", "127.0.0.2", False)],
         "ports": [{"name": n, "port": p, "protocol": "TCP"} for n, p in worker_ports.items()]},
        {"metadata": {"name": "minilm-y", "namespace": "default",
                      "labels": {"kubernetes.io/service-name": "minilm"}},
         "addressType": "IPv4", "endpoints": [endpoint("g0", "127.0.0.3", True)],
         "ports": [{"name": "http", "port": http_port, "protocol": "TCP"}]},
    ]  # fmt: skip
    return {
        "/api/v1/namespaces/default/pods": {"items": pods},
        "/api/v1/namespaces/default/services": {
            "items": [service("minilm-worker", "worker"), service("minilm", "gateway")]
        },
        "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices": {"items": slices},
    }


def test_a_real_prometheus_relabels_the_bridged_targets_as_the_monitor_says(
    tmp_path: Path,
) -> None:
    """The bridge's meta labels through the real Prometheus' relabelling: the labels the
    dashboards and alerts rely on come out, the gRPC port is not scraped, a not-ready worker
    stays a target (so its `up` can drop to 0)."""
    metrics_port, http_port = free_ports(2)
    api = fake_api(metrics_port, http_port)
    bridge = SdBridge(api.__getitem__).start()
    prom = Prometheus(
        workdir=tmp_path, jobs={}, discovered=monitor_jobs(fleet_monitor(), http_sd(bridge.url))
    )
    try:
        prom.start()

        def targets() -> list[dict[str, Any]] | None:
            active = prom.api("targets")["activeTargets"]
            return active if len(active) == 3 else None

        found = wait_for("3 discovered targets", targets, timeout=30)
    finally:
        prom.stop()
        bridge.stop()
    assert not bridge.errors, bridge.errors
    labels = sorted(
        ({k: v for k, v in t["labels"].items() if k != "__tmp_prometheus_job_name"} for t in found),
        key=lambda t: t["instance"],
    )
    assert labels == [
        {"instance": f"127.0.0.1:{metrics_port}", "job": "minilm-worker", "namespace": "default",
         "pod": "w0", "service": "minilm-worker", "container": "worker", "endpoint": "metrics"},
        {"instance": f"127.0.0.2:{metrics_port}", "job": "minilm-worker", "namespace": "default",
         "pod": "w1", "service": "minilm-worker", "container": "worker", "endpoint": "metrics"},
        {"instance": f"127.0.0.3:{http_port}", "job": "minilm", "namespace": "default",
         "pod": "g0", "service": "minilm", "container": "gateway", "endpoint": "http"},
    ]  # fmt: skip
    assert {t["scrapeUrl"].rsplit("/", 1)[1] for t in found} == {"metrics"}


def test_the_bridge_lists_pods_for_pod_monitors() -> None:
    api = fake_api(9090, 8080)
    groups = pod_groups(api["/api/v1/namespaces/default/pods"]["items"])
    assert len(groups) == 5  # w0 grpc+metrics, w1 grpc+metrics, g0 http
    names = {g["labels"]["__meta_kubernetes_pod_container_port_name"] for g in groups}
    assert names == {"grpc", "metrics", "http"}


def test_durations_round_trip() -> None:
    assert seconds("1h30m") == 5400
    assert seconds("500ms") == 0.5
    assert duration(10) == "10s"
    assert duration(0.25) == "250ms"
    with pytest.raises(ValueError, match="not a Prometheus duration"):
        seconds("5 m")


def test_compressed_rules_keep_their_expressions_and_pass_promtool(tmp_path: Path) -> None:
    original = yaml.safe_load(RULES.read_text())
    compressed = compress_rules(original, 30)
    rules = {r.get("alert") or r["record"]: r for g in compressed["groups"] for r in g["rules"]}
    assert rules["EmbedfleetWorkerNotReady"]["for"] == "20s"  # 10m / 30
    fast = rules["EmbedfleetErrorBudgetBurnFast"]
    assert fast["for"] == "4s"
    assert "[120s]" in rules["embedfleet:gateway_error_ratio:rate1h"]["expr"]
    assert "[10s]" in rules["embedfleet:gateway_error_ratio:rate5m"]["expr"]
    # Only durations changed: the rest of every rule is verbatim.
    for group, before in zip(compressed["groups"], original["groups"], strict=True):
        for new, old in zip(group["rules"], before["rules"], strict=True):
            assert {k: v for k, v in new.items() if k not in ("expr", "for")} == {
                k: v for k, v in old.items() if k not in ("expr", "for")
            }
    path = tmp_path / "compressed.rules.yaml"
    path.write_text(yaml.safe_dump(compressed))
    proc = subprocess.run(
        [binary("promtool"), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

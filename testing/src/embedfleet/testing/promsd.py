"""Kubernetes service discovery for a Prometheus built without it, through `http_sd_configs`.

Debian's `prometheus` package (2.42.0+ds, what hack/install-prometheus.sh installs) is built
without the Kubernetes SD: `kubernetes_sd_configs` is "not found in type config.ScrapeConfig".
`SdBridge` serves what that SD would produce: it reads EndpointSlices, Services and Pods from the
real API server on every poll and answers Prometheus' HTTP SD with one target group per target,
labelled with the same `__meta_kubernetes_*` labels as Prometheus' own `endpointslice` and `pod`
roles (discovery/kubernetes/endpointslice.go, pod.go). The relabelling that
embedfleet.testing.promconfig renders from the monitors then runs unchanged in the real
Prometheus. The label builders are pure; `SdBridge` is the thin HTTP shell.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from embedfleet.testing.promconfig import label_name

Obj = Mapping[str, Any]
Group = dict[str, Any]
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def _labels(prefix: str, meta: Obj) -> dict[str, str]:
    out = {}
    for kind, key in (("label", "labels"), ("annotation", "annotations")):
        for k, v in (meta.get(key) or {}).items():
            out[f"{prefix}_{kind}_{label_name(k)}"] = str(v)
            out[f"{prefix}_{kind}present_{label_name(k)}"] = "true"
    return out


def _bool(value: Any) -> str:
    return "true" if value else "false"


def pod_labels(pod: Obj) -> dict[str, str]:
    """The pod-level meta labels both roles attach."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    ready = next(
        (c["status"] for c in status.get("conditions") or () if c.get("type") == "Ready"), "false"
    )
    owner = next((o for o in meta.get("ownerReferences") or () if o.get("controller")), None)
    out = {
        "__meta_kubernetes_namespace": meta["namespace"],
        "__meta_kubernetes_pod_name": meta["name"],
        "__meta_kubernetes_pod_ip": status.get("podIP", ""),
        "__meta_kubernetes_pod_ready": str(ready).lower(),
        "__meta_kubernetes_pod_phase": status.get("phase", ""),
        "__meta_kubernetes_pod_node_name": spec.get("nodeName", ""),
        "__meta_kubernetes_pod_host_ip": status.get("hostIP", ""),
        "__meta_kubernetes_pod_uid": meta.get("uid", ""),
        **_labels("__meta_kubernetes_pod", meta),
    }
    if owner:
        out["__meta_kubernetes_pod_controller_kind"] = owner["kind"]
        out["__meta_kubernetes_pod_controller_name"] = owner["name"]
    return out


def _container_port(pod: Obj, number: int) -> dict[str, str]:
    for container in (pod.get("spec") or {}).get("containers") or ():
        for port in container.get("ports") or ():
            if port.get("containerPort") == number:
                return {
                    "__meta_kubernetes_pod_container_name": container["name"],
                    "__meta_kubernetes_pod_container_image": container.get("image", ""),
                    "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                    "__meta_kubernetes_pod_container_port_number": str(number),
                    "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP"),
                }
    return {}


def pod_groups(pods: Iterable[Obj]) -> list[Group]:
    """Role `pod`: one target per declared container port of every pod with an IP."""
    groups = []
    for pod in pods:
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            continue
        base = pod_labels(pod)
        for container in (pod.get("spec") or {}).get("containers") or ():
            for port in container.get("ports") or ():
                number = port["containerPort"]
                labels = {**base, **_container_port(pod, number)}
                labels["__meta_kubernetes_pod_container_name"] = container["name"]
                groups.append({"targets": [f"{ip}:{number}"], "labels": labels})
    return groups


def endpointslice_groups(
    slices: Iterable[Obj], services: Mapping[str, Obj], pods: Mapping[str, Obj]
) -> list[Group]:
    """Role `endpointslice`: one target per address and port of every slice, with its Service's
    and (for pod endpoints) its pod's labels; not-ready endpoints included, as Prometheus does.
    `services` and `pods` are keyed by "namespace/name"."""
    groups = []
    for eps in slices:
        meta = eps["metadata"]
        namespace = meta["namespace"]
        base = {
            "__meta_kubernetes_namespace": namespace,
            "__meta_kubernetes_endpointslice_name": meta["name"],
            "__meta_kubernetes_endpointslice_address_type": eps.get("addressType", ""),
            **_labels("__meta_kubernetes_endpointslice", meta),
        }
        service_name = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
        service = services.get(f"{namespace}/{service_name}") if service_name else None
        if service is not None:
            base["__meta_kubernetes_service_name"] = service_name or ""
            base.update(_labels("__meta_kubernetes_service", service["metadata"]))
        for endpoint in eps.get("endpoints") or ():
            conditions = endpoint.get("conditions") or {}
            ref = endpoint.get("targetRef") or {}
            pod = pods.get(f"{namespace}/{ref.get('name')}") if ref.get("kind") == "Pod" else None
            for address in endpoint.get("addresses") or ():
                for port in eps.get("ports") or ():
                    labels = {
                        **base,
                        "__meta_kubernetes_endpointslice_port_name": port.get("name", ""),
                        "__meta_kubernetes_endpointslice_port_protocol": port.get(
                            "protocol", "TCP"
                        ),
                        "__meta_kubernetes_endpointslice_port": str(port["port"]),
                        "__meta_kubernetes_endpointslice_endpoint_conditions_ready": _bool(
                            conditions.get("ready")
                        ),
                        "__meta_kubernetes_endpointslice_endpoint_conditions_serving": _bool(
                            conditions.get("serving")
                        ),
                        "__meta_kubernetes_endpointslice_endpoint_conditions_terminating": _bool(
                            conditions.get("terminating")
                        ),
                    }
                    if ref:
                        labels["__meta_kubernetes_endpointslice_address_target_kind"] = ref["kind"]
                        labels["__meta_kubernetes_endpointslice_address_target_name"] = ref["name"]
                    if node := endpoint.get("nodeName"):
                        labels["__meta_kubernetes_endpointslice_endpoint_node_name"] = node
                    if pod is not None:
                        labels.update(pod_labels(pod))
                        labels.update(_container_port(pod, port["port"]))
                    groups.append({"targets": [f"{address}:{port['port']}"], "labels": labels})
    return groups


def _key(obj: Obj) -> str:
    return f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"


class SdBridge:
    """An HTTP SD endpoint on 127.0.0.1: GET /targets?role=endpointslice|pod&namespace=NS..."""

    def __init__(self, get: Callable[[str], Any]) -> None:
        """`get(path)`: one GET on the API server, parsed (e.g. `Cluster.api.get`)."""
        self._get = get
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.polls = 0
        self.errors: list[str] = []

    def _items(self, kind_path: str, namespaces: list[str]) -> list[Obj]:
        if not namespaces:
            return list(self._get(kind_path.format(ns=""))["items"])
        out: list[Obj] = []
        for ns in namespaces:
            out += self._get(kind_path.format(ns=f"/namespaces/{ns}"))["items"]
        return out

    def groups(self, role: str, namespaces: list[str]) -> list[Group]:
        pods = self._items("/api/v1{ns}/pods", namespaces)
        if role == "pod":
            return pod_groups(pods)
        if role != "endpointslice":
            raise ValueError(f"role {role!r}")
        slices = self._items("/apis/discovery.k8s.io/v1{ns}/endpointslices", namespaces)
        services = self._items("/api/v1{ns}/services", namespaces)
        return endpointslice_groups(
            slices, {_key(s): s for s in services}, {_key(p): p for p in pods}
        )

    def start(self) -> SdBridge:
        bridge = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlparse(self.path)
                query = parse_qs(url.query)
                try:
                    role = query.get("role", ["endpointslice"])[0]
                    body = json.dumps(bridge.groups(role, query.get("namespace", []))).encode()
                    status = 200
                except Exception as exc:  # Prometheus keeps the last good targets on a 5xx
                    bridge.errors.append(repr(exc))
                    body, status = repr(exc).encode(), 500
                bridge.polls += 1
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(10)


def has_kubernetes_sd(check_config: Callable[[str], tuple[int, str]]) -> bool:
    """Whether this Prometheus build knows `kubernetes_sd_configs`: `check_config(text)` runs
    `promtool check config` on a config text and returns (exit code, output)."""
    probe = "scrape_configs:\n- job_name: probe\n  kubernetes_sd_configs: [{role: pod}]\n"
    code, output = check_config(probe)
    return not (code != 0 and re.search(r"kubernetes_sd_configs not found", output))

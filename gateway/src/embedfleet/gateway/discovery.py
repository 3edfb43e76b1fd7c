"""Where the workers are: a static list, a watched file, or a Kubernetes Service's EndpointSlices.

The Kubernetes watch is a plain streaming HTTP GET (httpx) with the pod's service-account token or
a kubeconfig's client certificate: one list+watch of one resource needs no client library, and
kubernetes_asyncio would add a large generated package (and aiohttp) to the gateway image.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import ssl
import tempfile
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from embedfleet.gateway.settings import GatewaySettings

log = logging.getLogger(__name__)

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
Update = Callable[[Collection[str]], None]


# --- pure parts ----------------------------------------------------------------------------


def parse_workers_file(text: str) -> list[str]:
    """One host:port per line; blank lines and # comments ignored."""
    out = []
    for line in text.splitlines():
        item = line.split("#", 1)[0].strip()
        if item:
            out.append(item)
    return out


def is_address(item: str) -> bool:
    """host:port (a bracketed IPv6 host included) with a port of 1-65535 and no whitespace: what
    a workers file's line must be to name a worker."""
    host, sep, port = item.rpartition(":")
    return (
        bool(sep and host)
        and port.isdigit()
        and 0 < int(port) < 65536
        and not any(c.isspace() for c in item)
    )


def _host_port(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def slice_addresses(endpoint_slice: Mapping[str, Any], port_name: str) -> set[str]:
    """host:port of every engine of every endpoint in the slice that is ready (or not known to be
    unready); a pod with several engine processes gives one address per engine port.

    An endpoint without a `ready` condition counts as ready, as the API documents; terminating
    endpoints are not ready and drop out here, so a draining worker takes no new work.
    """
    ports = sorted(
        {
            int(p["port"])
            for p in endpoint_slice.get("ports") or []
            if engine_port(str(p.get("name") or ""), port_name) and p.get("port")
        }
    )
    if not ports:
        return set()
    out: set[str] = set()
    for endpoint in endpoint_slice.get("endpoints") or []:
        if (endpoint.get("conditions") or {}).get("ready", True) is False:
            continue
        for address in endpoint.get("addresses") or []:
            out.update(_host_port(str(address), port) for port in ports)
    return out


def engine_port(name: str, port_name: str) -> bool:
    """Whether a Service port is one engine's: `port_name`, or `port_name`-N for the further
    engine processes of a pod (the operator's enginesPerGPU), each a worker of its own."""
    if name == port_name:
        return True
    prefix = port_name + "-"
    return name.startswith(prefix) and name[len(prefix) :].isdigit()


@dataclass
class SliceSet:
    """The Service's slices by name; the union of their addresses is the worker set."""

    port_name: str
    slices: dict[str, set[str]]

    def reset(self, items: Iterable[Mapping[str, Any]]) -> None:
        self.slices = {
            str(s["metadata"]["name"]): slice_addresses(s, self.port_name) for s in items
        }

    def apply(self, event_type: str, obj: Mapping[str, Any]) -> bool:
        """Apply one watch event; returns False for events that carry no slice (BOOKMARK)."""
        if event_type not in ("ADDED", "MODIFIED", "DELETED"):
            return False
        name = str(obj["metadata"]["name"])
        if event_type == "DELETED":
            self.slices.pop(name, None)
        else:
            self.slices[name] = slice_addresses(obj, self.port_name)
        return True

    def addresses(self) -> set[str]:
        return set().union(*self.slices.values()) if self.slices else set()


def parse_service(value: str, default_namespace: str) -> tuple[str, str]:
    namespace, _, name = value.rpartition("/")
    return (namespace or default_namespace), name


# --- Kubernetes connection -----------------------------------------------------------------


@dataclass
class KubeAccess:
    server: str
    headers: dict[str, str]
    ssl: ssl.SSLContext
    namespace: str


def _load_kubeconfig(path: Path, keep: tempfile.TemporaryDirectory[str]) -> KubeAccess:
    import yaml  # only the kubeconfig path needs it (in-cluster needs no YAML)

    doc = yaml.safe_load(path.read_text())
    current = doc.get("current-context")
    context = next(c["context"] for c in doc["contexts"] if c["name"] == current)
    cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in doc["users"] if u["name"] == context["user"])
    ctx = ssl.create_default_context()
    if "certificate-authority-data" in cluster:
        ctx.load_verify_locations(
            cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
        )
    elif "certificate-authority" in cluster:
        ctx.load_verify_locations(cafile=cluster["certificate-authority"])
    headers: dict[str, str] = {}
    if "token" in user:
        headers["Authorization"] = f"Bearer {user['token']}"
    cert, key = user.get("client-certificate"), user.get("client-key")
    if "client-certificate-data" in user:
        # ssl wants files; they live in a private temp dir for the watcher's lifetime.
        cert = os.path.join(keep.name, "client.crt")
        key = os.path.join(keep.name, "client.key")
        for file, field in ((cert, "client-certificate-data"), (key, "client-key-data")):
            fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(base64.b64decode(user[field]))
    if cert and key:
        ctx.load_cert_chain(cert, key)
    namespace = context.get("namespace", "default")
    return KubeAccess(str(cluster["server"]).rstrip("/"), headers, ctx, namespace)


def kube_access(kubeconfig: str, keep: tempfile.TemporaryDirectory[str]) -> KubeAccess:
    path = kubeconfig or ("" if (SA_DIR / "token").exists() else os.environ.get("KUBECONFIG", ""))
    if path:
        return _load_kubeconfig(Path(path), keep)
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    ctx = ssl.create_default_context(cafile=str(SA_DIR / "ca.crt"))
    # The token is re-read on each (re)connect: projected tokens rotate.
    token = (SA_DIR / "token").read_text().strip()
    namespace = (SA_DIR / "namespace").read_text().strip()
    return KubeAccess(
        f"https://{_host_port(host, int(port))}",
        {"Authorization": f"Bearer {token}"},
        ctx,
        namespace,
    )


# --- the watchers --------------------------------------------------------------------------


class Discovery:
    def __init__(self, settings: GatewaySettings, update: Update) -> None:
        self.settings = settings
        self.update = update
        self._tasks: list[asyncio.Task[None]] = []
        self._static = list(settings.workers)

    async def start(self) -> None:
        s = self.settings
        if s.workers_file:
            self._tasks.append(asyncio.create_task(self._watch_file(Path(s.workers_file))))
        elif s.k8s_service:
            self._tasks.append(asyncio.create_task(self._watch_k8s()))
        else:
            self.update(self._static)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch_file(self, path: Path, interval: float = 0.5) -> None:
        """Follows the file: gone, only the static workers; unreadable or not UTF-8 (a partial
        write, a permission change), the last set kept and the file read again until it reads,
        said once per streak; a line that is no address, left out and said once per content."""
        seen: tuple[float, int] | None = None
        failing = False
        while True:
            try:
                stat = path.stat()
                key = (stat.st_mtime, stat.st_size)
                if key != seen:
                    items = parse_workers_file(path.read_text())
                    seen, failing = key, False
                    for item in items:
                        if not is_address(item):
                            log.warning("worker address skipped", extra={"line": item[:200]})
                    self.update(self._static + [item for item in items if is_address(item)])
            except FileNotFoundError:
                if seen is not None:
                    seen = None
                    self.update(self._static)
            except (OSError, ValueError) as exc:
                if not failing:
                    failing = True
                    log.warning(
                        "workers file unreadable; keeping the last set",
                        extra={"path": str(path), "error": type(exc).__name__},
                    )
            await asyncio.sleep(interval)

    async def _watch_k8s(self) -> None:
        keep = tempfile.TemporaryDirectory(prefix="embedfleet-kube-")
        try:
            backoff = 0.5
            while True:
                try:
                    await self._list_and_watch(kube_access(self.settings.kubeconfig, keep))
                    backoff = 0.5
                except (httpx.HTTPError, KeyError, ValueError, OSError) as exc:
                    log.warning("endpointslice watch failed", extra={"error": repr(exc)})
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 10.0)
        finally:
            keep.cleanup()

    async def _list_and_watch(self, kube: KubeAccess) -> None:
        namespace, name = parse_service(self.settings.k8s_service, kube.namespace)
        url = f"{kube.server}/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
        selector = {"labelSelector": f"kubernetes.io/service-name={name}"}
        slices = SliceSet(self.settings.k8s_port_name, {})
        # Reads stall silently on a dead connection unless they time out; the server ends watches
        # after timeoutSeconds, so a read gap longer than that means the connection is gone.
        timeout = httpx.Timeout(10.0, read=330.0)
        async with httpx.AsyncClient(
            verify=kube.ssl, headers=kube.headers, timeout=timeout
        ) as http:
            listed = await http.get(url, params=selector)
            listed.raise_for_status()
            doc = listed.json()
            slices.reset(doc.get("items") or [])
            self.update(sorted(slices.addresses()))
            version = doc["metadata"]["resourceVersion"]
            while True:
                params = {
                    **selector,
                    "watch": "1",
                    "resourceVersion": version,
                    "allowWatchBookmarks": "true",
                    "timeoutSeconds": "300",
                }
                async with http.stream("GET", url, params=params) as stream:
                    stream.raise_for_status()
                    async for line in stream.aiter_lines():
                        if not line:
                            continue
                        event = orjson.loads(line)
                        obj = event.get("object") or {}
                        if event.get("type") == "ERROR":
                            # Usually 410 Gone: our version is too old; list again.
                            raise ValueError(f"watch error: {obj.get('message')}")
                        version = obj.get("metadata", {}).get("resourceVersion", version)
                        if slices.apply(str(event.get("type")), obj):
                            self.update(sorted(slices.addresses()))

"""A thin JSON client for the Kubernetes API on top of the kubernetes package's connection setup.

The operator speaks raw paths (server-side apply, status merge patches, leases); the typed models
of the kubernetes package would only get in the way. Calls are blocking: from the event loop, run
them (or a function made of them, like a reconcile) with `await kube.call(fn, *args)`.

Why not asyncio.to_thread: a thread cannot be cancelled, and asyncio.run joins every thread of
its default executor before it returns, so a SIGTERM during a reconcile waited for all of that
reconcile's remaining API calls (each up to `timeout` on a slow API server) while the operator
looked stopped. `call` runs each function on a daemon thread that the exit does not wait for,
and `close` (at shutdown) makes every later request fail at once, so an abandoned reconcile ends
at its next call instead of carrying on.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar
from urllib.parse import urlencode

from kubernetes import client, config

from embedfleet.operator import metrics

T = TypeVar("T")

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
JSON = "application/json"


#: Connections held open besides the calls: the child watches (informer.py) and the lease.
WATCH_CONNECTIONS = 12


def resource_of(path: str) -> str:
    """The resource a REST path names, with its subresource ("deployments", "leases",
    "embeddingdeployments/status"), for the request counter."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    # /api/v1/... or /apis/group/version/...
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if len(rest) >= 2 and rest[0] == "namespaces":
        rest = rest[2:] if len(rest) > 2 else ["namespaces"]
    if not rest:
        return "discovery"
    return "/".join([rest[0], *rest[2:3]])


class KubeError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        message: Any = body
        causes: tuple[str, ...] = ()
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            parsed = json.loads(body)
            message = parsed.get("message", body)
            details = parsed.get("details") or {}
            causes = tuple(str(c.get("reason", "")) for c in details.get("causes") or ())
        super().__init__(f"{method} {path}: HTTP {status}: {message}")
        self.status = status
        self.message = str(message)
        self.causes = causes
        """The Status's details.causes reasons ("NamespaceTerminating", "FieldValueInvalid")."""

    @property
    def namespace_terminating(self) -> bool:
        """Refused because the namespace is being deleted: nothing new can be made there, and
        whatever asked for it goes with the namespace, so a retry only adds load."""
        return self.status == 403 and "NamespaceTerminating" in self.causes


class KubeClosedError(RuntimeError):
    """A request after `Kube.close`: the operator is stopping (deliberately not a KubeError, which
    callers handle and carry on after)."""


async def in_daemon_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` on a new daemon thread: cancelling the await abandons the call, and the
    interpreter's exit never waits for it."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def settle(outcome: Callable[[Any], None], value: Any) -> None:
        def unless_cancelled() -> None:
            if not future.done():
                outcome(value)

        # A closed loop means nobody waits for the answer any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(unless_cancelled)

    def target() -> None:
        try:
            result = context.run(fn, *args, **kwargs)
        except BaseException as err:  # handed to the awaiting task, which re-raises it
            settle(future.set_exception, err)
        else:
            settle(future.set_result, result)

    name = f"kube-{getattr(fn, '__name__', 'call')}"
    threading.Thread(target=target, name=name, daemon=True).start()
    return await future


class Kube:
    #: Blocking calls in flight at once (what asyncio's default executor would allow).
    max_calls = min(32, (os.cpu_count() or 1) + 4)

    def __init__(
        self, api: client.ApiClient, timeout: float = 30.0, max_calls: int | None = None
    ) -> None:
        self._api = api
        self._timeout = timeout
        self._closed = False
        if max_calls is not None:
            self.max_calls = max_calls
        self._slots = asyncio.Semaphore(self.max_calls)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Runs a blocking function of this client's calls (see the module docstring)."""
        async with self._slots:
            return await in_daemon_thread(fn, *args, **kwargs)

    def close(self) -> None:
        """Every later request raises KubeClosedError; calls in flight finish or are dropped."""
        self._closed = True

    @classmethod
    def connect(cls, max_calls: int | None = None) -> Kube:
        """In-cluster service account when in a pod, else $KUBECONFIG / ~/.kube/config;
        `max_calls` overrides the class's bound on calls in flight."""
        configuration = client.Configuration()
        try:
            # The kubernetes package's config loaders carry no annotations.
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        # Every call in flight, every long-lived watch and the lease renewal each hold a
        # connection: a smaller pool opens (and TLS-handshakes) a new one for the overflow.
        calls = cls.max_calls if max_calls is None else max_calls
        configuration.connection_pool_maxsize = calls + WATCH_CONNECTIONS
        return cls(client.ApiClient(configuration), max_calls=calls)

    def _send(
        self,
        method: str,
        path: str,
        body: Any,
        content_type: str,
        query: Mapping[str, str] | None,
        timeout: float | tuple[float, float],
    ) -> Any:
        if self._closed:
            raise KubeClosedError(f"{method} {path}: the operator is stopping")
        metrics.API_REQUESTS.labels(verb=method, resource=resource_of(path)).inc()
        full = f"{path}?{urlencode(dict(query))}" if query else path
        headers = {"Accept": JSON}
        if body is not None:
            # The client serialises a mapping as JSON for JSON and YAML content types alike
            # (JSON is YAML), so apply patches go out as JSON text too.
            headers["Content-Type"] = content_type
        _, url, headers, payload, _ = self._api.param_serialize(
            method=method,
            resource_path=full,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        return self._api.call_api(
            method, url, header_params=headers, body=payload, _request_timeout=timeout
        )

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = JSON,
        query: Mapping[str, str] | None = None,
    ) -> Any:
        """Decoded JSON of a 2xx reply; raises KubeError otherwise, KubeClosedError once closed."""
        response = self._send(method, path, body, content_type, query, self._timeout)
        text = bytes(response.read()).decode()
        if not 200 <= response.status < 300:
            raise KubeError(method, path, response.status, text)
        return json.loads(text) if text else None

    def watch(
        self, path: str, query: Mapping[str, str], read_timeout: float
    ) -> Iterator[dict[str, Any]]:
        """The events of a watch on `path` (a collection), one decoded JSON object each, until
        the server ends the watch; a silence longer than `read_timeout` raises. Blocking."""
        response = self._send(
            "GET", path, None, JSON, {**query, "watch": "true"}, (self._timeout, read_timeout)
        )
        raw = response.response
        ended = False
        try:
            if not 200 <= response.status < 300:
                text = bytes(response.read()).decode()
                raise KubeError("GET", path, response.status, text)
            pending = b""
            for chunk in raw.stream(65536):
                if self._closed:
                    return
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
            ended = True
        finally:
            if not ended:
                raw.close()  # a half-read stream must never go back to the pool
            raw.release_conn()

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def get_or_none(self, path: str) -> Any:
        try:
            return self.get(path)
        except KubeError as err:
            if err.status == 404:
                return None
            raise

    def delete(self, path: str) -> None:
        try:
            self.request("DELETE", path)
        except KubeError as err:
            if err.status != 404:
                raise

    def apply(self, path: str, manifest: Mapping[str, Any], manager: str) -> Any:
        """Server-side apply, taking over fields another manager holds (we own these objects)."""
        query = {"fieldManager": manager, "force": "true"}
        return self.request("PATCH", path, manifest, content_type=APPLY, query=query)

    def merge_status(self, path: str, status: Mapping[str, Any]) -> Any:
        return self.request("PATCH", f"{path}/status", {"status": status}, content_type=MERGE)

    def has_resource(self, group_version: str, plural: str) -> bool:
        """Whether the API serves `plural` in `group_version` (e.g. prometheus-operator's CRDs)."""
        found = self.get_or_none(f"/apis/{group_version}")
        resources = (found or {}).get("resources", ())
        return any(r.get("name") == plural for r in resources)

"""A minimal JSON client for the Kubernetes API, authenticated by client certificate.

Enough for the harness's own needs (readiness, nodes, namespaces); tests that need more use
kubectl or the kubernetes package against the cluster's kubeconfig.
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from embedfleet.testing.pki import KeyPair


class ApiError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path} -> HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


class ApiClient:
    def __init__(self, server: str, ca_cert: Path, client: KeyPair, timeout: float = 10.0) -> None:
        parts = urlsplit(server)
        if parts.scheme != "https" or parts.hostname is None or parts.port is None:
            raise ValueError(f"expected https://host:port, got {server!r}")
        self.server = server
        self._host = parts.hostname
        self._port = parts.port
        self._timeout = timeout
        self._context = ssl.create_default_context(cafile=str(ca_cert))
        self._context.load_cert_chain(str(client.cert), str(client.key))

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, str]:
        """Sends one request on a fresh connection; returns (status, body text)."""
        conn = http.client.HTTPSConnection(
            self._host, self._port, context=self._context, timeout=self._timeout
        )
        try:
            headers = {"Accept": "application/json"}
            payload = None
            if body is not None:
                payload = json.dumps(body).encode()
                headers["Content-Type"] = content_type
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            return response.status, response.read().decode()
        finally:
            conn.close()

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        """Like request, but returns the decoded JSON and raises ApiError unless 2xx."""
        status, text = self.request(method, path, body)
        if not 200 <= status < 300:
            raise ApiError(method, path, status, text)
        return json.loads(text) if text else None

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def create(self, path: str, obj: Mapping[str, Any]) -> Any:
        return self.call("POST", path, obj)

    def delete(self, path: str) -> Any:
        return self.call("DELETE", path)

    def patch(self, path: str, patch: Mapping[str, Any]) -> Any:
        """A JSON merge patch."""
        status, text = self.request("PATCH", path, patch, "application/merge-patch+json")
        if not 200 <= status < 300:
            raise ApiError("PATCH", path, status, text)
        return json.loads(text) if text else None

    def watch(
        self, path: str, query: str = "", timeout_seconds: int = 300
    ) -> Iterator[dict[str, Any]]:
        """The events of one watch of a collection (decoded JSON each) until the server ends it
        after `timeout_seconds`; a silence of that long plus 30 s raises."""
        sep = "&" if query else ""
        full = f"{path}?{query}{sep}watch=true&allowWatchBookmarks=true"
        full += f"&timeoutSeconds={timeout_seconds}"
        conn = http.client.HTTPSConnection(
            self._host, self._port, context=self._context, timeout=timeout_seconds + 30
        )
        try:
            conn.request("GET", full, headers={"Accept": "application/json"})
            response = conn.getresponse()
            if response.status != 200:
                raise ApiError("GET", full, response.status, response.read().decode())
            while line := response.readline():
                if line.strip():
                    yield json.loads(line)
        finally:
            conn.close()

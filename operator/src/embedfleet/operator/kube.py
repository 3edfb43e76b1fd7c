"""A thin JSON client for the Kubernetes API on top of the kubernetes package's connection setup.

The operator speaks raw paths (server-side apply, status merge patches, leases); the typed models
of the kubernetes package would only get in the way. Calls are blocking: use them via
asyncio.to_thread from handlers.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from kubernetes import client, config

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
JSON = "application/json"


class KubeError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        message = body
        with contextlib.suppress(ValueError, AttributeError):
            message = json.loads(body).get("message", body)
        super().__init__(f"{method} {path}: HTTP {status}: {message}")
        self.status = status
        self.message = str(message)


class Kube:
    def __init__(self, api: client.ApiClient, timeout: float = 30.0) -> None:
        self._api = api
        self._timeout = timeout

    @classmethod
    def connect(cls) -> Kube:
        """In-cluster service account when in a pod, else $KUBECONFIG / ~/.kube/config."""
        configuration = client.Configuration()
        try:
            # The kubernetes package's config loaders carry no annotations.
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return cls(client.ApiClient(configuration))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = JSON,
        query: Mapping[str, str] | None = None,
    ) -> Any:
        """Decoded JSON of a 2xx reply; raises KubeError otherwise."""
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
        response = self._api.call_api(
            method, url, header_params=headers, body=payload, _request_timeout=self._timeout
        )
        text = bytes(response.read()).decode()  # type: ignore[no-untyped-call]
        if not 200 <= response.status < 300:
            raise KubeError(method, path, response.status, text)
        return json.loads(text) if text else None

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

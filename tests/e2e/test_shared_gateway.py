"""Two fleets behind one shared gateway on the real node: `gateway.shared` on both, requests to
the shared Service routed by `model` to each fleet's own worker pod. Runs on its own (its own
helm install):

    pytest tests/e2e/test_shared_gateway.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import numpy as np
import yaml

from .e2efleet import EXAMPLE, NAMESPACE, Fleet, is_ready

SHARED = "search"
SERVICE = f"{SHARED}-shared-gateway"
TEXTS = ["one endpoint", "several models", "routed by name"]
#: (EmbeddingDeployment, served name); the first keeps the example's servedModelName
FLEETS = (("minilm", "all-MiniLM-L6-v2"), ("minilm-b", "mini-b"))

POST = """
import json, sys, urllib.error, urllib.request
url, body = sys.argv[1], sys.argv[2]
req = urllib.request.Request(url, data=body.encode() or None,
                             headers={"content-type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=60) as r:
        print(json.dumps({"status": r.status, "body": json.loads(r.read())}))
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code, "body": json.loads(e.read())}))
"""


def _manifest(name: str, served: str) -> dict[str, Any]:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["metadata"]["name"] = name
    manifest["spec"]["model"]["servedModelName"] = served
    manifest["spec"]["worker"]["replicas"] = 1
    manifest["spec"]["gateway"]["shared"] = SHARED
    return dict(manifest)


def _call(fleet: Fleet, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    ip = fleet.get("service", "-n", NAMESPACE, SERVICE)["spec"]["clusterIP"]
    argv = [sys.executable, "-c", POST, f"http://{ip}{path}", json.dumps(body) if body else ""]
    proc = subprocess.run(
        fleet.in_node(argv), capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def _routed(fleet: Fleet) -> bool:
    """The shared Service answers at its ClusterIP (kube-proxy has an endpoint for it)."""
    ip = fleet.get("service", "-n", NAMESPACE, SERVICE)["spec"]["clusterIP"]
    probe = "import socket, sys; socket.create_connection((sys.argv[1], 80), timeout=5).close()"
    argv = [sys.executable, "-c", probe, ip]
    proc = subprocess.run(fleet.in_node(argv), capture_output=True, timeout=30, check=False)
    return proc.returncode == 0


def _worker_pod(fleet: Fleet, name: str) -> dict[str, Any]:
    selector = f"app.kubernetes.io/instance={name},app.kubernetes.io/component=worker"
    (pod,) = [
        p
        for p in fleet.api(f"/api/v1/namespaces/{NAMESPACE}/pods", labelSelector=selector)["items"]
        if is_ready(p)
    ]
    return dict(pod)


def test_two_fleets_behind_one_shared_gateway(installed: Fleet, reference: Any) -> None:
    fleet = installed
    started = time.monotonic()
    for name, served in FLEETS:
        fleet.kubectl("apply", "-f", "-", input=json.dumps(_manifest(name, served)))
    selector = f"app.kubernetes.io/instance={SERVICE},app.kubernetes.io/component=shared-gateway"

    def ready() -> bool:
        pods = fleet.api(f"/api/v1/namespaces/{NAMESPACE}/pods", labelSelector=selector)["items"]
        if not pods or not all(is_ready(p) for p in pods):
            return False
        try:
            if not all(_worker_pod(fleet, name) for name, _ in FLEETS):
                return False
        except ValueError:  # not exactly one ready worker yet
            return False
        # A Ready pod is not yet a routed Service: until the EndpointSlice controller and
        # kube-proxy have caught up, the ClusterIP has no endpoint and kube-proxy rejects the
        # connection (the refusal a CI run hit right after the pods turned Ready).
        return _routed(fleet)

    try:
        fleet.wait("the shared gateway and both fleets' workers ready", ready, timeout=600)
        models = _call(fleet, "/v1/models")
        assert models["status"] == 200
        ids = [m["id"] for m in models["body"]["data"]]
        assert ids == ["all-MiniLM-L6-v2", "mini-b"]  # members by name: minilm, minilm-b
        want = reference.encode(TEXTS, normalize_embeddings=False, convert_to_numpy=True)
        for name, served in FLEETS:
            mine = _worker_pod(fleet, name)
            other = _worker_pod(fleet, next(n for n, _ in FLEETS if n != name))
            before = (fleet.embed_ok(mine), fleet.embed_ok(other))
            reply = _call(fleet, "/v1/embeddings", {"model": served, "input": TEXTS})
            assert reply["status"] == 200, reply
            assert reply["body"]["model"] == served
            got = np.asarray([d["embedding"] for d in reply["body"]["data"]], dtype=np.float64)
            cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
            assert float(cos.min()) >= 0.999, cos
            after = (fleet.embed_ok(mine), fleet.embed_ok(other))
            assert after[0] > before[0], (name, before, after)
            assert after[1] == before[1], (name, before, after)
        unknown = _call(fleet, "/v1/embeddings", {"model": "nope", "input": "x"})
        assert unknown["status"] == 404
        assert unknown["body"]["error"]["code"] == "model_not_found"
    except AssertionError as err:
        raise AssertionError(f"{err}\n{fleet.describe()}") from err
    print(
        f"shared gateway: both models served {round(time.monotonic() - started, 1)} s after apply"
    )
    for name, served in FLEETS:
        fleet.kubectl("delete", "-f", "-", input=json.dumps(_manifest(name, served)))
    path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{SERVICE}"

    def gone() -> bool | None:
        return fleet.api_or_none(path) is None or None

    fleet.wait("the shared gateway gone with its members", gone, timeout=120)

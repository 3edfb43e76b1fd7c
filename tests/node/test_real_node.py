"""A real node joined to its own control plane: pods run from an imported image, get addresses
on the node's bridge, pass probes, serve logs, exec and port-forward, reach the API server
through the `kubernetes` Service with their token, and Services route; deletion is quick; a
killed run's leftovers are all found and removed."""

from __future__ import annotations

import ipaddress
import json
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from embedfleet.testing import nodeslots
from embedfleet.testing.cluster import CommandError
from embedfleet.testing.node import RealNode, leftovers, undo
from embedfleet.testing.nodeconfig import NodeSlot
from embedfleet.testing.polling import wait_for

PORT = 8080


def server_pod(node: RealNode, name: str) -> Any:
    """A pod of the harness's test image, locked down as our charts run images."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "containers": [
                {
                    "name": "server",
                    "image": node.image_ref("testserver"),
                    "imagePullPolicy": "Never",
                    "ports": [{"containerPort": PORT}],
                    "readinessProbe": {
                        "httpGet": {"path": "/healthz", "port": PORT},
                        "periodSeconds": 1,
                    },
                    "livenessProbe": {"exec": {"command": ["/testserver", "probe"]}},
                    "securityContext": {
                        "runAsNonRoot": True,
                        "readOnlyRootFilesystem": True,
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ]
        },
    }


def apply(node: RealNode, namespace: str, *objects: Any) -> None:
    manifest = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    node.cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))


def wait_ready(node: RealNode, namespace: str, *pods: str) -> None:
    names = [f"pod/{pod}" for pod in pods]
    try:
        node.cluster.kubectl(
            "wait", "-n", namespace, "--for=condition=Ready", "--timeout=90s", *names, timeout=100
        )
    except CommandError as err:
        described = node.cluster.kubectl("describe", "-n", namespace, *names, check=False)
        raise AssertionError(f"{err}\n{described.stdout}") from err


def pod(node: RealNode, namespace: str, name: str) -> Any:
    return json.loads(
        node.cluster.kubectl("get", "-n", namespace, "pod", name, "-o", "json").stdout
    )


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        body: bytes = response.read()
        return body.decode()


def test_node_is_ready_and_alone(k8s_real_node: RealNode) -> None:
    node_obj = k8s_real_node.cluster.api.get(f"/api/v1/nodes/{k8s_real_node.name}")
    info = node_obj["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.37.2"
    assert info["containerRuntimeVersion"].startswith("containerd://2.")
    addresses = {a["type"]: a["address"] for a in node_obj["status"]["addresses"]}
    assert addresses["InternalIP"] == k8s_real_node.slot.node_ip
    nodes = k8s_real_node.cluster.api.get("/api/v1/nodes")["items"]
    assert [n["metadata"]["name"] for n in nodes] == [k8s_real_node.name]
    assert k8s_real_node.image_ref("testserver") in k8s_real_node.images()


def test_pod_runs_with_probes_logs_exec_port_forward_and_api_access(
    k8s_real_node: RealNode, k8s_real_node_namespace: str
) -> None:
    node, ns = k8s_real_node, k8s_real_node_namespace
    apply(node, ns, server_pod(node, "web"))
    wait_ready(node, ns, "web")
    ip = pod(node, ns, "web")["status"]["podIP"]
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(node.slot.pod_cidr)

    # The host reaches the pod directly (its route to the node's pod range).
    assert http_get(f"http://{ip}:{PORT}/") == "hello from web\n"
    exec_out = node.cluster.kubectl("exec", "-n", ns, "web", "--", "/testserver", "probe").stdout
    assert exec_out == "ok\n"
    logs = node.cluster.kubectl("logs", "-n", ns, "web").stdout
    assert "testserver: listening on :8080" in logs
    assert "testserver: GET / from" in logs

    forward = subprocess.Popen(
        [
            str(node.cluster.tools.path("kubectl")),
            f"--kubeconfig={node.cluster.kubeconfig}",
            *("port-forward", "-n", ns, "pod/web", f":{PORT}"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert forward.stdout is not None
        line = forward.stdout.readline()
        match = re.search(r"127\.0\.0\.1:(\d+) -> 8080", line)
        assert match, line
        assert http_get(f"http://127.0.0.1:{match.group(1)}/") == "hello from web\n"
    finally:
        forward.terminate()
        forward.wait(timeout=10)

    # Through the `kubernetes` Service (kube-proxy -> the API server on the host's end of the
    # link), TLS verified against the ServiceAccount CA, authenticated by the pod's own token.
    review = json.loads(http_get(f"http://{ip}:{PORT}/apiserver"))
    assert review["status"]["userInfo"]["username"] == f"system:serviceaccount:{ns}:default"


def test_cluster_ip_service_from_the_node_and_from_pods(
    k8s_real_node: RealNode, k8s_real_node_namespace: str
) -> None:
    node, ns = k8s_real_node, k8s_real_node_namespace
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": PORT}]},
    }
    apply(node, ns, server_pod(node, "web"), server_pod(node, "client"), service)
    wait_ready(node, ns, "web", "client")
    cluster_ip = json.loads(
        node.cluster.kubectl("get", "-n", ns, "service", "web", "-o", "json").stdout
    )["spec"]["clusterIP"]
    url = f"http://{cluster_ip}/"

    # From the node's own network (where kube-proxy's rules live), with our static client.
    client = [str(node.tools.bin_dir / "testserver"), "get", url]

    def from_node() -> str | None:
        argv = node.netns_argv(client)
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
        return proc.stdout if proc.returncode == 0 else None

    # kube-proxy programs the Service once its EndpointSlice shows the Ready pod.
    assert wait_for("Service reachable from the node", from_node, timeout=30) == "hello from web\n"
    for source in ("client", "web"):  # another pod, and the backend itself (hairpin)
        out = node.cluster.kubectl("exec", "-n", ns, source, "--", "/testserver", "get", url)
        assert out.stdout == "hello from web\n"


def test_pod_deletion_is_quick(k8s_real_node: RealNode, k8s_real_node_namespace: str) -> None:
    node, ns = k8s_real_node, k8s_real_node_namespace
    apply(node, ns, server_pod(node, "short"))
    wait_ready(node, ns, "short")
    began = time.monotonic()
    node.cluster.kubectl("delete", "-n", ns, "pod", "short", "--wait=true", timeout=60)
    # The grace period is 30 s; a PID 1 that handles SIGTERM is gone in well under that.
    assert time.monotonic() - began < 10


KILLED_RUN = """
import json, sys, time
from embedfleet.testing.node import start_with_cluster
node = start_with_cluster()
node.cluster.kubectl("run", "leftover", "--image", node.image_ref("testserver"),
                     "--image-pull-policy=Never", "--restart=Never")
node.cluster.kubectl("wait", "--for=condition=Ready", "--timeout=90s", "pod/leftover", timeout=100)
print(json.dumps({"index": node.slot.index, "run": node.slot.run, "dir": str(node.paths.root),
                  "run_dir": str(node.cluster.layout.run_dir)}), flush=True)
time.sleep(600)
"""


def test_a_killed_run_is_reclaimed_leaving_nothing(k8s_real_node: RealNode, tmp_path: Path) -> None:
    # A run killed by SIGKILL never tears down: its daemons die with it (PR_SET_PDEATHSIG),
    # while shims, containers, mounts, the network namespace and cgroups stay. The next claim
    # of a slot reclaims it from the record alone.
    errors = tmp_path / "stderr"
    with errors.open("w") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-c", KILLED_RUN], stdout=subprocess.PIPE, stderr=stderr, text=True
        )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line, f"the run to be killed failed:\n{errors.read_text()[-3000:]}"
        started = json.loads(line)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    slot, directory = NodeSlot(started["index"], started["run"]), Path(started["dir"])
    shutil.rmtree(started["run_dir"], ignore_errors=True)  # the dead control plane's temp dir
    before = leftovers(slot, directory)
    for kind in ("processes", "cgroups", "mounts", "network", "files"):
        assert before[kind], f"expected the killed run to leave {kind}"

    root = nodeslots.node_root()
    state = nodeslots.read(root, slot.index)
    assert state is not None
    wait_for("the killed run's daemons to die", lambda: not nodeslots.is_live(state), timeout=10)
    # Any node starting on this machine reclaims stale slots, so another run may have done it
    # (and even claimed the slot anew, under another run id) before this one gets the lock.
    with nodeslots.locked(root):
        nodeslots.reclaim_stale(root, undo)
        record = nodeslots.read(root, slot.index)
    assert record is None or record.get("run") != slot.run
    assert leftovers(slot, directory) == {kind: [] for kind in before}
    k8s_real_node.assert_running()

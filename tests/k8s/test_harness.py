"""The harness's pure parts and process handling, without the Kubernetes binaries."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from embedfleet.common.net import free_ports
from embedfleet.testing import components
from embedfleet.testing.cluster import ClusterConfig, stop_recorded
from embedfleet.testing.components import Layout
from embedfleet.testing.kubeconfig import kubeconfig_document
from embedfleet.testing.nodes import GPU_RESOURCE, NodeShape, fake_gpu_node, node_is_ready
from embedfleet.testing.pki import create_pki
from embedfleet.testing.polling import wait_for
from embedfleet.testing.process import ProcessRecord, is_running, spawn, start_ticks, stop
from embedfleet.testing.pytest_plugin import namespace_name
from embedfleet.testing.tools import Toolset


def test_namespace_names_are_dns_labels_and_unique() -> None:
    name = namespace_name("test_deploy[GPU-8 replicas]" + "x" * 80)
    assert len(name) <= 63
    assert name.startswith("test-deploy-gpu-8-replicas-")
    assert all(c.isalnum() or c == "-" for c in name)
    assert name != namespace_name("test_deploy[GPU-8 replicas]" + "x" * 80)


def test_fake_node_advertises_gpus_without_taints() -> None:
    node = fake_gpu_node("kwok-gpu-0", NodeShape(gpus=4), "v1.37.2")
    assert node["status"]["capacity"][GPU_RESOURCE] == "4"
    assert node["status"]["allocatable"] == node["status"]["capacity"]
    assert node["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}
    assert "taints" not in node.get("spec", {})
    assert not node_is_ready(node)
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    assert node_is_ready(node)


def test_free_ports_are_distinct() -> None:
    ports = free_ports(20)
    assert len(set(ports)) == 20


def test_pki_chains_to_its_ca_with_rbac_identities(tmp_path: Path) -> None:
    pki = create_pki(
        tmp_path,
        server_names=components.API_SERVER_NAMES,
        server_ips=("127.0.0.1", components.SERVICE_IP),
        clients=components.CLIENTS,
    )
    certs = [str(pki.apiserver.cert), *(str(pair.cert) for pair in pki.clients.values())]
    subprocess.run(["openssl", "verify", "-CAfile", str(pki.ca.cert), *certs], check=True)
    subject = subprocess.run(
        ["openssl", "x509", "-noout", "-subject", "-in", str(pki.clients["admin"].cert)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "O = system:masters" in subject
    assert "CN = embedfleet-admin" in subject
    sans = subprocess.run(
        ["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", str(pki.apiserver.cert)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "IP Address:127.0.0.1" in sans
    assert "DNS:kubernetes.default.svc" in sans
    assert pki.clients["admin"].key.stat().st_mode & 0o077 == 0
    doc = kubeconfig_document("https://127.0.0.1:1", pki.ca.cert, pki.clients["admin"], "admin")
    assert doc["current-context"] == doc["contexts"][0]["name"]


def test_component_flags_use_the_layout_ports_on_localhost(tmp_path: Path) -> None:
    pki = create_pki(tmp_path, server_names=(), server_ips=("127.0.0.1",), clients={})
    ports = dict(zip(components.PORT_NAMES, free_ports(len(components.PORT_NAMES)), strict=True))
    kubeconfigs = {name: tmp_path / f"{name}.kubeconfig" for name in components.CLIENTS}
    layout = Layout(run_dir=tmp_path, ports=ports, pki=pki, kubeconfigs=kubeconfigs)
    tools = Toolset(bin_dir=tmp_path / "bin", built=False)
    argvs = [
        components.etcd_argv(tools, layout),
        components.apiserver_argv(tools, layout),
        components.controller_manager_argv(tools, layout),
        components.scheduler_argv(tools, layout),
        components.kwok_argv(tools, layout),
    ]
    flat = " ".join(" ".join(argv) for argv in argvs)
    for port in ports.values():
        assert f":{port}" in flat or f"={port}" in flat
    # No component may fall back to a fixed default port another cluster could hold.
    for argv in argvs[2:4]:
        assert any(arg.startswith("--secure-port=") for arg in argv)
        assert "--bind-address=127.0.0.1" in argv
    assert "0.0.0.0" not in flat


def test_client_rate_reaches_the_controller_manager_and_scheduler_only_when_set(
    tmp_path: Path,
) -> None:
    pki = create_pki(tmp_path, server_names=(), server_ips=("127.0.0.1",), clients={})
    ports = dict(zip(components.PORT_NAMES, free_ports(len(components.PORT_NAMES)), strict=True))
    kubeconfigs = {name: tmp_path / f"{name}.kubeconfig" for name in components.CLIENTS}
    layout = Layout(run_dir=tmp_path, ports=ports, pki=pki, kubeconfigs=kubeconfigs)
    tools = Toolset(bin_dir=tmp_path / "bin", built=False)
    rate = components.ClientRate(qps=500, burst=1000)
    for argv_of in (components.controller_manager_argv, components.scheduler_argv):
        # Unset: the components' own defaults, as every test cluster had them.
        assert not any("--kube-api-" in arg for arg in argv_of(tools, layout))
        argv = argv_of(tools, layout, rate)
        assert "--kube-api-qps=500" in argv
        assert "--kube-api-burst=1000" in argv
    assert ClusterConfig().client_rate is None
    assert ClusterConfig().controller_syncs is None
    default = components.controller_manager_argv(tools, layout)
    assert not any(arg.startswith("--concurrent-") for arg in default)
    scaled = components.controller_manager_argv(tools, layout, syncs=50)
    assert "--concurrent-deployment-syncs=50" in scaled
    assert "--concurrent-replicaset-syncs=50" in scaled
    with pytest.raises(ValueError, match="qps > 0"):
        components.ClientRate(qps=0, burst=10)


def test_stop_signals_only_the_recorded_processes(tmp_path: Path) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    child, record = spawn("sleeper", sleeper, tmp_path / "sleeper.log")
    bystander = subprocess.Popen(sleeper)
    try:
        assert is_running(record)
        # A record whose start time does not match is a different (reused-pid) process.
        impostor = ProcessRecord("impostor", bystander.pid, record.start_ticks - 1, record.log)
        assert not is_running(impostor)
        assert stop([record, impostor], [child], grace_seconds=5) == []
        assert child.returncode is not None
        assert start_ticks(record.pid) is None
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_stop_waits_for_a_child_whose_main_thread_is_a_zombie(tmp_path: Path) -> None:
    """The operator teardown flake: while a process exits, its main thread can show as a zombie
    in /proc with other threads still running. stop() took that for gone, returned, and left
    the child unreaped (returncode None). Here the main thread exits for good and another
    thread keeps the process alive until a signal ends it."""
    lingering = (
        "import ctypes, threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,)).start()\n"
        "ctypes.CDLL(None).pthread_exit(None)\n"
    )
    child, record = spawn("lingering", [sys.executable, "-c", lingering], tmp_path / "l.log")
    try:
        wait_for("the main thread a zombie", lambda: start_ticks(record.pid) is None, timeout=10)
        assert child.poll() is None  # the process lives on
        assert stop([record], [child], grace_seconds=5) == []
        assert child.returncode == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()


def test_stop_recorded_from_state_kills_stubborn_processes(tmp_path: Path) -> None:
    ignores_term = [
        sys.executable,
        "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)",
    ]
    child, record = spawn("stubborn", ignores_term, tmp_path / "stubborn.log")
    state = {"processes": [record.to_json()], "run_dir": str(tmp_path), "owns_run_dir": False}
    # A real dev-cluster `down` runs in another process; here the child is ours, so reap it
    # in the background the way init would.
    reaper = threading.Thread(target=child.wait)
    reaper.start()
    assert stop_recorded(state, grace_seconds=0.5) == []
    reaper.join(timeout=10)
    assert child.returncode is not None
    assert tmp_path.exists()

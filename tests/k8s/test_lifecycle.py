"""Starting and stopping clusters: cached binaries are reused, nothing outlives a cluster, and
hack/dev-cluster up/env/down work from separate processes."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from embedfleet.testing.cluster import Cluster, ClusterConfig
from embedfleet.testing.polling import wait_for
from embedfleet.testing.process import ProcessRecord, is_running
from embedfleet.testing.tools import BINARIES, REPO_ROOT, ensure_tools

pytestmark = pytest.mark.k8s

DEV_CLUSTER = REPO_ROOT / "hack" / "dev-cluster"


def processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains `text` (every component's flags name its run dir)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            pids.append(int(entry.name))
    return pids


def test_second_start_reuses_binaries_and_stop_leaves_no_process(k8s_cluster: Cluster) -> None:
    # k8s_cluster has made sure a build exists; asking again must not compile anything.
    mtimes = {name: k8s_cluster.tools.path(name).stat().st_mtime_ns for name in BINARIES}
    tools = ensure_tools(build=False)
    assert not tools.built
    assert tools.bin_dir == k8s_cluster.tools.bin_dir

    second = Cluster.start(ClusterConfig(gpu_nodes=1, build=False))
    run_dir = second.layout.run_dir
    try:
        assert not second.tools.built
        assert second.server != k8s_cluster.server
        nodes = second.api.get("/api/v1/nodes")["items"]
        assert [node["metadata"]["name"] for node in nodes] == ["kwok-gpu-0"]
        started = {record.pid for record in second.processes}
        assert len(started) == 5
        assert started <= set(processes_mentioning(str(run_dir)))
    finally:
        second.stop()

    assert not any(is_running(record) for record in second.processes)
    assert processes_mentioning(str(run_dir)) == []
    assert not run_dir.exists()
    k8s_cluster.assert_running()
    assert {n: k8s_cluster.tools.path(n).stat().st_mtime_ns for n in BINARIES} == mtimes


KILLED_PARENT = """
import json, sys, time
from embedfleet.testing.cluster import Cluster, ClusterConfig
config = ClusterConfig(controller_manager=False, scheduler=False, kwok=False, build=False)
cluster = Cluster.start(config)
print(json.dumps(cluster.to_state()), flush=True)
time.sleep(600)
"""


def test_components_die_with_a_killed_parent(k8s_cluster: Cluster) -> None:
    # A test run killed by a timeout never reaches fixture teardown; its cluster must not linger.
    parent = subprocess.Popen(
        [sys.executable, "-c", KILLED_PARENT], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        state = json.loads(parent.stdout.readline())
    finally:
        parent.kill()
        parent.wait()
    records = [ProcessRecord.from_json(item) for item in state["processes"]]
    assert [record.name for record in records] == ["etcd", "kube-apiserver"]
    wait_for(
        "the orphaned components to exit",
        lambda: not any(is_running(record) for record in records),
        timeout=30,
    )
    assert processes_mentioning(state["run_dir"]) == []
    shutil.rmtree(state["run_dir"])
    k8s_cluster.assert_running()


def run_dev_cluster(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EMBEDFLEET_DEV_CLUSTER_DIR": str(state_dir)}
    return subprocess.run(
        [str(DEV_CLUSTER), *args], env=env, capture_output=True, text=True, timeout=300, check=True
    )


def test_dev_cluster_up_env_down(k8s_cluster: Cluster, tmp_path: Path) -> None:
    up = run_dev_cluster(tmp_path, "up", "--gpu-nodes", "1")
    kubeconfig = Path(up.stdout.strip().splitlines()[-1])
    state = json.loads((tmp_path / "state.json").read_text())
    records = [ProcessRecord.from_json(item) for item in state["processes"]]
    try:
        assert kubeconfig == tmp_path / "kubeconfig"
        assert all(is_running(record) for record in records)

        exports = run_dev_cluster(tmp_path, "env").stdout
        env = dict(os.environ)
        for line in exports.splitlines():
            # `export NAME=VALUE`, VALUE shell-quoted and possibly referring to "$PATH".
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = shlex.split(value.replace('"$PATH"', shlex.quote(os.environ["PATH"])))[0]
        assert env["KUBECONFIG"] == str(kubeconfig)
        assert env["PATH"].split(":")[0] == state["bin_dir"]
        nodes = subprocess.run(
            ["kubectl", "get", "nodes", "-o", "name"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert nodes == ["node/kwok-gpu-0"]

        again = run_dev_cluster(tmp_path, "up")
        assert again.stdout.strip().splitlines()[-1] == str(kubeconfig)
        assert "already up" in again.stderr
    finally:
        run_dev_cluster(tmp_path, "down")

    assert not any(is_running(record) for record in records)
    assert not (tmp_path / "state.json").exists()
    assert processes_mentioning(state["run_dir"]) == []
    k8s_cluster.assert_running()

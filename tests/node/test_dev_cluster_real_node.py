"""hack/dev-cluster up --real-node / down from separate processes: the node serves pods while
up, and `down` leaves nothing of it on the host."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from embedfleet.testing.node import leftovers
from embedfleet.testing.nodeconfig import NodeSlot
from embedfleet.testing.nodetools import ensure_node_tools
from embedfleet.testing.process import ProcessRecord, is_running
from embedfleet.testing.tools import REPO_ROOT

pytestmark = [pytest.mark.k8s, pytest.mark.real_node]

DEV_CLUSTER = REPO_ROOT / "hack" / "dev-cluster"


def run(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(a) for a in args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_up_real_node_runs_pods_and_down_removes_everything(tmp_path: Path) -> None:
    env = {**os.environ, "EMBEDFLEET_DEV_CLUSTER_DIR": str(tmp_path)}
    kubeconfig = run(env, DEV_CLUSTER, "up", "--real-node").stdout.strip().splitlines()[-1]
    state = json.loads((tmp_path / "state.json").read_text())
    records = [ProcessRecord.from_json(item) for item in state["node"]["processes"]]
    slot = NodeSlot(state["node"]["index"], state["node"]["run"])
    directory = Path(state["node"]["dir"])
    try:
        assert [r.name for r in records] == ["containerd", "kubelet", "kube-proxy"]
        assert all(is_running(record) for record in records)  # outlived `up`
        kubectl = [str(Path(state["bin_dir"]) / "kubectl"), f"--kubeconfig={kubeconfig}"]
        image = ensure_node_tools(build=False).image("testserver").ref
        run(env, *kubectl, "run", "hello", f"--image={image}", "--image-pull-policy=Never")
        run(env, *kubectl, "wait", "--for=condition=Ready", "--timeout=90s", "pod/hello")
        assert leftovers(slot, directory)["mounts"]  # the pod's rootfs, netns and token volume
    finally:
        run(env, DEV_CLUSTER, "down")
    assert not any(is_running(record) for record in records)
    assert leftovers(slot, directory) == {
        "processes": [],
        "cgroups": [],
        "mounts": [],
        "network": [],
        "cni cache": [],
        "files": [],
    }
    assert not (tmp_path / "state.json").exists()

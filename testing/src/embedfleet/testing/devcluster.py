"""hack/dev-cluster: one long-lived local cluster per user, for development by hand.

    hack/dev-cluster up [--gpu-nodes N]   start (building the binaries on first use); the last
                                          line printed is the admin kubeconfig's path
    hack/dev-cluster up --real-node       the same plus one real node (containerd, kubelet,
                                          kube-proxy; root), and no KWOK nodes unless asked
    hack/dev-cluster env                  `export` lines: KUBECONFIG, PATH with kubectl and helm
    hack/dev-cluster status               the recorded processes and whether each still runs
    hack/dev-cluster down                 stop exactly the processes `up` started

State lives in $EMBEDFLEET_DEV_CLUSTER_DIR (default: ${EMBEDFLEET_CACHE:-~/.cache/embedfleet}/
dev-cluster): state.json (pids with their start times, so `down` never signals a reused pid)
and a stable copy of the kubeconfig.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shlex
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from embedfleet.testing import node
from embedfleet.testing.cluster import Cluster, ClusterConfig, stop_recorded
from embedfleet.testing.process import ProcessRecord, is_running


def state_dir() -> Path:
    if explicit := os.environ.get("EMBEDFLEET_DEV_CLUSTER_DIR"):
        return Path(explicit)
    cache = os.environ.get("EMBEDFLEET_CACHE") or str(Path.home() / ".cache" / "embedfleet")
    return Path(cache) / "dev-cluster"


def _state_file() -> Path:
    return state_dir() / "state.json"


def _stable_kubeconfig() -> Path:
    return state_dir() / "kubeconfig"


@contextmanager
def _locked() -> Iterator[None]:
    """Serialises up/down so two concurrent `up`s cannot start two clusters."""
    state_dir().mkdir(parents=True, exist_ok=True)
    with (state_dir() / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _read_state() -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(_state_file().read_text())
    except FileNotFoundError:
        return None
    return state


def _records(state: dict[str, Any]) -> list[ProcessRecord]:
    items = state["processes"] + state.get("node", {}).get("processes", [])
    return [ProcessRecord.from_json(item) for item in items]


def _all_running(state: dict[str, Any]) -> bool:
    return all(is_running(record) for record in _records(state))


def _stop(state: dict[str, Any]) -> None:
    real_node = state.get("node")
    if real_node:
        # The API server's clients first; its address (on the node's link) goes last.
        node.stop_daemons([ProcessRecord.from_json(item) for item in real_node["processes"]])
    left = stop_recorded(state)
    if real_node:
        node.stop_recorded(real_node)
    if left:
        names = ", ".join(f"{r.name} (pid {r.pid})" for r in left)
        raise SystemExit(f"dev-cluster: could not stop {names}")
    _state_file().unlink(missing_ok=True)
    _stable_kubeconfig().unlink(missing_ok=True)


def up(gpu_nodes: int | None, real_node: bool) -> int:
    with _locked():
        state = _read_state()
        if state is not None and _all_running(state):
            print(f"dev-cluster: already up at {state['server']}", file=sys.stderr)
            print(_stable_kubeconfig())
            return 0
        if state is not None:
            print("dev-cluster: a component had died; stopping the rest first", file=sys.stderr)
            _stop(state)
        if gpu_nodes is None:
            gpu_nodes = 0 if real_node else 3
        kwok = gpu_nodes > 0 or not real_node
        config = ClusterConfig(gpu_nodes=gpu_nodes, kwok=kwok, outlive_caller=True)
        if real_node:
            real = node.start_with_cluster(config, node.NodeConfig(outlive_caller=True))
            cluster = real.cluster
            state = {**cluster.to_state(), "node": real.to_state()}
        else:
            cluster = Cluster.start(config)
            state = cluster.to_state()
        shutil.copyfile(cluster.kubeconfig, _stable_kubeconfig())
        _stable_kubeconfig().chmod(0o600)
        tmp = _state_file().with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(_state_file())
    print(
        f"dev-cluster: up at {cluster.server} in {cluster.startup_seconds:.1f}s "
        f"({gpu_nodes} KWOK GPU nodes{', 1 real node' if real_node else ''}); "
        f"logs in {cluster.layout.run_dir / 'logs'}",
        file=sys.stderr,
    )
    print(_stable_kubeconfig())
    return 0


def down() -> int:
    with _locked():
        state = _read_state()
        if state is None:
            print("dev-cluster: not running", file=sys.stderr)
            return 0
        _stop(state)
    print("dev-cluster: stopped", file=sys.stderr)
    return 0


def env() -> int:
    state = _read_state()
    if state is None or not _all_running(state):
        print("dev-cluster: not running; run `hack/dev-cluster up`", file=sys.stderr)
        return 1
    print(f"export KUBECONFIG={shlex.quote(str(_stable_kubeconfig()))}")
    print(f'export PATH={shlex.quote(state["bin_dir"])}:"$PATH"')
    return 0


def status() -> int:
    state = _read_state()
    if state is None:
        print("dev-cluster: not running")
        return 1
    print(f"server {state['server']}  kubeconfig {_stable_kubeconfig()}")
    for record in _records(state):
        print(
            f"{record.name:<24} pid {record.pid:<8} {'running' if is_running(record) else 'DEAD'}"
        )
    return 0 if _all_running(state) else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dev-cluster", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    up_parser = commands.add_parser("up", help="start the cluster (idempotent)")
    up_parser.add_argument(
        "--gpu-nodes", type=int, default=None, help="KWOK GPU nodes (default 3; 0 with --real-node)"
    )
    up_parser.add_argument(
        "--real-node", action="store_true", help="also join one real node (needs root)"
    )
    commands.add_parser("down", help="stop exactly what `up` started")
    commands.add_parser("env", help="print export lines for KUBECONFIG and PATH")
    commands.add_parser("status", help="show the recorded processes")
    args = parser.parse_args(argv)
    if args.command == "up":
        return up(args.gpu_nodes, args.real_node)
    if args.command == "down":
        return down()
    if args.command == "env":
        return env()
    return status()


if __name__ == "__main__":
    sys.exit(main())

"""The network of one real node: its own network namespace, a veth pair to the host and the pod
bridge inside. Deleting the namespace takes the bridge, the veth pair (and with it the host's
route), kube-proxy's nftables table and ip_forward=1 with it: nothing is left on the host.

Traffic stays on this machine: pods have routes only to the Service range and the link, the
namespace has no default route, and the host keeps ip_forward=0.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from embedfleet.testing.nodeconfig import BRIDGE, SERVICE_CIDR, UPLINK, NodeSlot
from embedfleet.testing.polling import wait_for

NETNS_DIR = Path("/run/netns")


class NetworkError(RuntimeError):
    """An `ip` or `sysctl` command failed."""


def netns_path(slot: NodeSlot) -> Path:
    return NETNS_DIR / slot.host_name


def in_netns(slot: NodeSlot, argv: Sequence[str]) -> list[str]:
    """argv run inside the node's network namespace (nsenter execs it: the pid stays the same)."""
    return ["nsenter", f"--net={netns_path(slot)}", "--", *argv]


def setup_commands(slot: NodeSlot) -> list[list[str]]:
    ns = slot.host_name
    host_prefix = slot.link_cidr.split("/")[1]
    pod_prefix = slot.pod_cidr.split("/")[1]
    return [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", slot.host_veth, "type", "veth", "peer", "name", UPLINK, "netns", ns],
        ["ip", "addr", "add", f"{slot.host_ip}/{host_prefix}", "dev", slot.host_veth],
        ["ip", "link", "set", slot.host_veth, "up"],
        ["ip", "-n", ns, "link", "set", "lo", "up"],
        ["ip", "-n", ns, "addr", "add", f"{slot.node_ip}/{host_prefix}", "dev", UPLINK],
        ["ip", "-n", ns, "link", "set", UPLINK, "up"],
        # nf_call_iptables: pod-to-pod replies of Service traffic cross the bridge and must pass
        # conntrack to be un-NATed.
        ["ip", "-n", ns, "link", "add", BRIDGE, "type", "bridge", "nf_call_iptables", "1"],
        ["ip", "-n", ns, "addr", "add", f"{slot.pod_gateway}/{pod_prefix}", "dev", BRIDGE],
        ["ip", "-n", ns, "link", "set", BRIDGE, "up"],
        # The node has no default route; its own connections to Service addresses need one to
        # reach the OUTPUT hook, where kube-proxy rewrites them.
        ["ip", "-n", ns, "route", "add", SERVICE_CIDR, "dev", BRIDGE],
        # Forwarding inside the namespace only: between the bridge and the link to the host.
        in_netns(slot, ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]),
        # The host reaches pods (and answers them) through the node's end of the link.
        ["ip", "route", "add", slot.pod_cidr, "via", slot.node_ip, "dev", slot.host_veth],
    ]


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
    if check and proc.returncode != 0:
        raise NetworkError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def setup(slot: NodeSlot) -> None:
    for argv in setup_commands(slot):
        _run(argv)


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def teardown(slot: NodeSlot) -> None:
    """Idempotent: removes the namespace and the host's veth, whichever still exist. Processes
    that hold the namespace must be gone first (pods' namespaces are separate mounts)."""
    if netns_path(slot).exists():
        _run(["ip", "netns", "delete", slot.host_name])
    # The namespace's end going takes the host's end too, asynchronously: a failed delete of an
    # already vanishing link is fine; one that stays is not.
    if link_exists(slot.host_veth):
        _run(["ip", "link", "delete", slot.host_veth], check=False)
    wait_for(f"{slot.host_veth} to go", lambda: not link_exists(slot.host_veth), timeout=5)


def host_mentions(slot: NodeSlot) -> list[str]:
    """Lines of the host's addresses, routes, namespaces and firewall rules naming this run's
    interface or namespace: empty once the node is gone. (By name, not address: a later run in
    the same slot reuses the addresses.)"""
    needles = (slot.host_veth, slot.host_name)
    outputs = [
        _run(["ip", "-o", "addr"]).stdout,
        _run(["ip", "route"]).stdout,
        _run(["ip", "netns", "list"]).stdout,
        _run(["nft", "list", "ruleset"], check=False).stdout,
    ]
    # Whole words only: embedfleet-1-... must not match embedfleet-12-...
    pattern = re.compile("|".join(rf"(?<![\w.-]){re.escape(n)}(?![\w-]|\.\d)" for n in needles))
    return [line for out in outputs for line in out.splitlines() if pattern.search(line)]

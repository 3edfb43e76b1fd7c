"""The real node's configuration as pure data: no root, no binaries."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from embedfleet.testing import cgroups, mounts, nodeslots
from embedfleet.testing.nodeconfig import (
    MAX_SLOTS,
    SERVICE_CIDR,
    NodePaths,
    NodeSlot,
    cni_conflist,
    containerd_config,
    import_refusal,
    kube_proxy_config,
    kubelet_config,
)

MOUNTINFO = """\
22 1 254:0 / / rw,relatime - ext4 /dev/vda rw
30 22 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
31 22 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
32 22 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
40 22 0:50 / /var/lib/embedfleet/nodes/3/run/netns/cni-1 rw - nsfs nsfs rw
41 22 0:51 / /var/lib/embedfleet/nodes/3/run/io.containerd/k8s.io/a\\040b/rootfs rw - overlay o rw
42 22 0:52 / /var/lib/embedfleet/nodes/31 rw - tmpfs tmpfs rw
"""


def test_slots_never_share_a_name_or_an_address() -> None:
    slots = [NodeSlot(i, f"{i:06x}") for i in range(MAX_SLOTS)]
    attributes = ("name", "host_name", "host_veth", "host_ip", "node_ip", "pod_cidr", "pod_gateway")
    for attribute in attributes:
        values = [getattr(slot, attribute) for slot in slots]
        assert len(set(values)) == MAX_SLOTS, attribute
    networks = [ipaddress.ip_network(s.link_cidr) for s in slots]
    networks += [ipaddress.ip_network(s.pod_cidr) for s in slots]
    networks.append(ipaddress.ip_network(SERVICE_CIDR))
    for i, a in enumerate(networks):
        assert not any(a.overlaps(b) for b in networks[i + 1 :]), a
    assert all(len(slot.host_veth) <= 15 for slot in slots)
    with pytest.raises(ValueError, match="outside"):
        NodeSlot(MAX_SLOTS, "abcdef")
    with pytest.raises(ValueError, match="hex"):
        NodeSlot(0, "xyz")
    # A later run in the same slot shares the addresses, never a name left on the host.
    again = NodeSlot(3, "fedcba")
    assert again.host_ip == NodeSlot(3, "abcdef").host_ip
    assert again.host_veth != NodeSlot(3, "abcdef").host_veth
    assert again.host_name != NodeSlot(3, "abcdef").host_name


def test_pods_route_only_to_services_and_the_host_link() -> None:
    slot = NodeSlot(3, "abcdef")
    conf = cni_conflist(slot, NodePaths(Path("/n/3")))
    bridge = conf["plugins"][0]
    assert bridge["isGateway"] is False  # the bridge plugin would set ip_forward=1 itself
    assert bridge["ipMasq"] is False
    routes = {route["dst"] for route in bridge["ipam"]["routes"]}
    assert routes == {SERVICE_CIDR, slot.link_cidr}
    assert "0.0.0.0/0" not in routes
    assert bridge["ipam"]["dataDir"].startswith("/n/3/")


def test_runtime_config_keeps_every_path_under_the_node_dir() -> None:
    paths = NodePaths(Path("/var/lib/embedfleet/nodes/3"))
    text = containerd_config(paths, Path("/cache/cni"), Path("/usr/sbin/runc"), "localhost/p:1")
    assert "restrict_oom_score_adj = true" in text
    assert "SystemdCgroup = false" in text
    assert "netns_mounts_under_state_dir = true" in text
    for line in text.splitlines():
        if line.strip().startswith(("root =", "state =", "address =", "socket_dir =", "Root =")):
            value = line.split("=", 1)[1].strip().strip('"')
            assert value == "" or value.startswith(str(paths.root)), line
    kubelet = kubelet_config(NodeSlot(3, "abcdef"), paths, Path("/ca.crt"))
    assert kubelet["failCgroupV1"] is False
    assert kubelet["cgroupDriver"] == "cgroupfs"
    assert kubelet["authentication"]["anonymous"]["enabled"] is False
    assert kubelet["authorization"]["mode"] == "Webhook"
    assert kubelet["address"] == NodeSlot(3, "abcdef").node_ip
    proxy = kube_proxy_config(NodeSlot(3, "abcdef"), Path("/kp.kubeconfig"))
    assert proxy["conntrack"]["maxPerCore"] == 0  # global sysctl: left alone


def test_mount_and_cgroup_discovery_parse_mountinfo() -> None:
    found = mounts.under(Path("/var/lib/embedfleet/nodes/3"), MOUNTINFO)
    assert found == [
        Path("/var/lib/embedfleet/nodes/3/run/io.containerd/k8s.io/a b/rootfs"),
        Path("/var/lib/embedfleet/nodes/3/run/netns/cni-1"),
    ]  # deepest first; nodes/31 is another slot
    assert cgroups.hierarchies(MOUNTINFO) == [
        Path("/sys/fs/cgroup/cpu"),
        Path("/sys/fs/cgroup/unified"),
    ]


def test_a_slot_is_live_while_its_owner_or_a_component_runs() -> None:
    owner = nodeslots.owner_record()
    dead = {**owner, "start_ticks": owner["start_ticks"] - 1}
    assert nodeslots.is_live({"owner": owner, "processes": []})
    assert not nodeslots.is_live({"owner": dead, "processes": []})
    assert nodeslots.is_live({"owner": dead, "processes": [{**owner, "name": "kubelet"}]})


def test_an_import_that_would_fill_the_disk_is_refused_before_it_starts() -> None:
    """A full disk mid-import left containerd unable to write its metadata, and every later
    test of the session erred on it: refused up front instead, saying what to free."""
    gb = 10**9
    assert import_refusal("worker.tar", 5 * gb, 12 * gb, "/var/lib/embedfleet/nodes/0") is None
    refusal = import_refusal("worker.tar", 5 * gb, 9 * gb, "/var/lib/embedfleet/nodes/0")
    assert refusal is not None
    assert "worker.tar (5.0 GB) needs about 11.1 GB" in refusal
    assert "9.0 GB are" in refusal

"""Pure parts of discovery: the workers file and EndpointSlice parsing (the live EndpointSlice watch
against a real kube-apiserver is in test_k8s_discovery.py)."""

from __future__ import annotations

from typing import Any

from embedfleet.gateway.discovery import (
    SliceSet,
    is_address,
    parse_service,
    parse_workers_file,
    slice_addresses,
)


def endpoint_slice(name: str, endpoints: list[dict[str, Any]], port: int = 50051) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": "1"},
        "addressType": "IPv4",
        "ports": [{"name": "metrics", "port": 9090}, {"name": "grpc", "port": port}],
        "endpoints": endpoints,
    }


def test_workers_file() -> None:
    assert parse_workers_file("# fleet\n10.0.0.1:1\n\n 10.0.0.2:2  # b\n") == [
        "10.0.0.1:1",
        "10.0.0.2:2",
    ]


def test_a_workers_file_line_names_a_worker_only_as_host_and_port() -> None:
    for good in ("10.0.0.1:50051", "worker-0.svc:1", "[fd00::5]:50051", "localhost:65535"):
        assert is_address(good), good
    for bad in ("not an address", "10.0.0.1", "10.0.0.1:0", "10.0.0.1:65536", ":50051", "h:p"):
        assert not is_address(bad), bad


def test_slice_addresses_keep_ready_and_unknown_drop_unready() -> None:
    s = endpoint_slice(
        "a",
        [
            {"addresses": ["10.0.0.1"], "conditions": {"ready": True}},
            {"addresses": ["10.0.0.2"], "conditions": {"ready": False, "terminating": True}},
            {"addresses": ["10.0.0.3"]},
            {"addresses": ["fd00::5"], "conditions": {"ready": True}},
        ],
    )
    assert slice_addresses(s, "grpc") == {"10.0.0.1:50051", "10.0.0.3:50051", "[fd00::5]:50051"}
    assert slice_addresses(s, "http") == set()
    assert slice_addresses({"metadata": {"name": "x"}}, "grpc") == set()


def test_slice_set_follows_events() -> None:
    slices = SliceSet("grpc", {})
    slices.reset([endpoint_slice("a", [{"addresses": ["10.0.0.1"]}])])
    assert slices.addresses() == {"10.0.0.1:50051"}
    assert slices.apply("ADDED", endpoint_slice("b", [{"addresses": ["10.0.0.2"]}]))
    assert slices.addresses() == {"10.0.0.1:50051", "10.0.0.2:50051"}
    assert slices.apply(
        "MODIFIED",
        endpoint_slice("a", [{"addresses": ["10.0.0.1"], "conditions": {"ready": False}}]),
    )
    assert slices.addresses() == {"10.0.0.2:50051"}
    assert not slices.apply("BOOKMARK", {"metadata": {"name": "", "resourceVersion": "9"}})
    assert slices.apply("DELETED", endpoint_slice("b", []))
    assert slices.addresses() == set()


def test_parse_service() -> None:
    assert parse_service("ns/svc", "default") == ("ns", "svc")
    assert parse_service("svc", "mine") == ("mine", "svc")


def test_a_pod_with_several_engines_gives_one_address_per_engine_port() -> None:
    # enginesPerGPU: ports grpc, grpc-1, ... of one pod are separate workers for the balancer.
    s = endpoint_slice("a", [{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2"]}])
    s["ports"] += [
        {"name": "grpc-1", "port": 50052},
        {"name": "metrics-1", "port": 9091},
        {"name": "grpc-x", "port": 7},  # not an engine port
        {"name": "grpcx", "port": 8},
    ]
    assert slice_addresses(s, "grpc") == {
        "10.0.0.1:50051",
        "10.0.0.1:50052",
        "10.0.0.2:50051",
        "10.0.0.2:50052",
    }

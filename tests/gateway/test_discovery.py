"""Where the workers are: a watched --workers-file followed live (added, removed, a line that is no
address, a file it cannot read), a Service's EndpointSlices watched on a REAL kube-apiserver (the
`k8s_cluster` fixture), and a kubeconfig it cannot use. FAKE workers (fakes.py) behind the
addresses, whose rows carry their number."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from embedfleet.common.net import free_ports
from embedfleet.testing.cluster import Cluster

from .fakes import FakeWorker
from .helpers import LIMITS, Gateway, host_ip, service_slice, serving, wait_until

#: small chunks, so that 40 inputs spread over every worker there is
SPREAD = {**LIMITS, "chunk_tokens": 10, "min_chunk_tokens": 1}
INPUTS = [[i + 1] * 3 for i in range(40)]


@pytest.fixture
def listed(tmp_path: Path) -> Iterator[tuple[Gateway, Path]]:
    """The gateway reading a workers file, empty at first (a comment), FAKE workers 0 and 1."""
    listing = tmp_path / "workers"
    listing.write_text("# no workers yet\n")
    workers = [FakeWorker(n).start() for n in range(2)]
    try:
        settings = {**SPREAD, "workers_file": listing}
        with serving(settings, tmp_path / "gateway.log", ready=0) as gateway:
            gateway.workers = workers
            yield gateway, listing
    finally:
        for w in workers:
            w.stop()


def _list(gateway: Gateway, listing: Path, lines: list[str | int]) -> None:
    """The file lists `lines`: a number is that FAKE worker's address."""
    text = [gateway.workers[x].address if isinstance(x, int) else x for x in lines]
    listing.write_text(
        "# listed by the test\n" + "\n".join(f"{t}  # a worker" for t in text) + "\n"
    )


def test_workers_are_added_and_removed_as_the_file_changes(listed: tuple[Gateway, Path]) -> None:
    gateway, listing = listed
    assert gateway.request("GET", "/ready").status == 503
    assert gateway.error("/v1/embeddings", {"input": "x"}, 503)["code"] == "no_workers"
    _list(gateway, listing, [0])
    wait_until("one worker", lambda: gateway.worker_counts() == (1, 1))
    assert gateway.served_by(INPUTS) == {0}
    _list(gateway, listing, [0, 1])
    wait_until("two workers", lambda: gateway.worker_counts() == (2, 2))
    assert gateway.served_by(INPUTS) == {0, 1}
    _list(gateway, listing, [1])  # worker 0 removed: nothing goes there any more
    wait_until("worker 0 gone", lambda: gateway.worker_counts() == (1, 1))
    before = len(gateway.workers[0].calls)
    assert gateway.served_by(INPUTS) == {1}
    assert len(gateway.workers[0].calls) == before
    listing.unlink()  # the file gone: only the static list is left, here none
    wait_until("no workers", lambda: gateway.worker_counts() == (0, 0))
    assert gateway.error("/v1/embeddings", {"input": "x"}, 503)["code"] == "no_workers"
    # Each change logged, addresses sorted: a log query follows the fleet.
    first, second = (w.address for w in gateway.workers)
    records = map(json.loads, gateway.log.read_text().splitlines())
    changes = [(r["added"], r["removed"]) for r in records if r["msg"] == "workers changed"]
    assert changes == [([first], []), ([second], []), ([], [first]), ([], [second])]


def _skipped(gateway: Gateway) -> list[str]:
    return [line for line in gateway.log.read_text().splitlines()
            if "worker address skipped" in line]  # fmt: skip


def test_a_line_that_is_not_an_address_is_logged_and_the_others_used(
    listed: tuple[Gateway, Path],
) -> None:
    gateway, listing = listed
    _list(gateway, listing, ["not an address", 0])
    wait_until("worker 0 ready", lambda: gateway.worker_counts() == (1, 1))
    assert gateway.served_by([f"text {i}" for i in range(8)]) == {0}
    (skipped,) = _skipped(gateway)
    assert "not an address" in skipped


def test_a_line_without_a_usable_port_is_skipped(listed: tuple[Gateway, Path]) -> None:
    gateway, listing = listed
    _list(gateway, listing, ["10.0.0.1", "10.0.0.1:0", "10.0.0.1:65536", 0])
    wait_until("worker 0 ready", lambda: gateway.worker_counts()[0] == 1)
    assert gateway.worker_counts() == (1, 1)
    assert len(_skipped(gateway)) == 3


def test_an_unreadable_workers_file_keeps_the_last_set(listed: tuple[Gateway, Path]) -> None:
    gateway, listing = listed
    _list(gateway, listing, [0])
    wait_until("worker 0 ready", lambda: gateway.worker_counts() == (1, 1))
    listing.write_bytes(b"\xff\xfe not UTF-8 \x80\n")
    wait_until("seen", lambda: "workers file unreadable" in gateway.log.read_text())
    time.sleep(1.0)  # several polls
    assert gateway.worker_counts() == (1, 1)
    assert gateway.served_by(["a", "b"]) == {0}
    assert gateway.log.read_text().count("workers file unreadable") == 1  # said once
    _list(gateway, listing, [1])  # readable again: followed

    def moved() -> bool:
        reply = gateway.post("/v1/embeddings", {"input": ["a"]})
        return reply.status == 200 and reply.json()["data"][0]["embedding"][3] == 1

    wait_until("worker 1 alone", moved)


SERVICE = "workers"


def test_endpointslice_changes_reach_the_gateway(
    k8s_cluster: Cluster, k8s_namespace: str, tmp_path: Path
) -> None:
    """Through a kubeconfig with a client certificate: slices appearing, turning unready and
    disappearing. The fakes listen on this host's address: the API refuses loopback ones."""
    fakes = [FakeWorker(n, host=host_ip()).start() for n in range(2)]
    try:
        path = f"/apis/discovery.k8s.io/v1/namespaces/{k8s_namespace}/endpointslices"
        k8s_cluster.api.create(path, service_slice("a", SERVICE, fakes[0].host, fakes[0].port))
        watch = {"k8s_service": f"{k8s_namespace}/{SERVICE}", "kubeconfig": k8s_cluster.kubeconfig}
        with serving({**watch, **SPREAD}, tmp_path / "gateway.log", ready=0) as gateway:
            wait_until("listed slice", lambda: gateway.worker_counts() == (1, 1))
            gateway.workers = fakes
            assert gateway.served_by(INPUTS) == {0}
            k8s_cluster.api.create(path, service_slice("b", SERVICE, fakes[1].host, fakes[1].port))
            wait_until("added slice", lambda: gateway.worker_counts() == (2, 2))
            assert gateway.served_by(INPUTS) == {0, 1}
            # A terminating (not ready) endpoint leaves the rotation; a deleted slice too.
            k8s_cluster.api.delete(f"{path}/a")
            unready = service_slice("a", SERVICE, fakes[0].host, fakes[0].port, ready=False)
            k8s_cluster.api.create(path, unready)
            wait_until("unready dropped", lambda: gateway.worker_counts() == (1, 1))
            assert gateway.served_by(INPUTS) == {1}
            k8s_cluster.api.delete(f"{path}/b")
            wait_until("deleted dropped", lambda: gateway.worker_counts() == (0, 0))
            assert gateway.request("GET", "/ready").status == 503
    finally:
        for w in fakes:
            w.stop()


#: the bearer token of the unusable kubeconfig: never in the log
TOKEN = "s3cret-token-0123456789"


def test_an_unusable_kubeconfig_is_logged_and_retried_with_the_process_up(tmp_path: Path) -> None:
    (port,) = free_ports(1)  # nothing listens there
    config = tmp_path / "kubeconfig"
    config.write_text(
        f"""apiVersion: v1
kind: Config
current-context: test
contexts:
- name: test
  context: {{cluster: test, user: test, namespace: default}}
clusters:
- name: test
  cluster:
    server: https://127.0.0.1:{port}
    certificate-authority-data: bm90IGEgY2VydGlmaWNhdGU=
users:
- name: test
  user: {{token: {TOKEN}}}
"""
    )
    settings = {**LIMITS, "k8s_service": "default/engines", "kubeconfig": config}
    with serving(settings, tmp_path / "gateway.log", ready=0) as gateway:
        # Backoff 0.5 s, 1 s, 2 s: three failures within a few seconds, no more than one a second.
        started = time.monotonic()
        wait_until("three failures", lambda: gateway.log.read_text().count(
            "endpointslice watch failed") >= 3)  # fmt: skip
        failures = gateway.log.read_text().count("endpointslice watch failed")
        assert failures <= time.monotonic() - started + 3
        assert gateway.request("GET", "/health").status == 200
        reply = gateway.request("GET", "/ready")
        assert (reply.status, reply.json()) == (503, {"ready": False})
    assert TOKEN not in gateway.log.read_text()

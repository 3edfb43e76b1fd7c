"""A shared gateway PROCESS in front of REAL worker processes (the bundled MiniLM): each model's
requests reach only its own worker, and the vectors match sentence-transformers."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from embedfleet.common.modeldir import default_model_path
from embedfleet.common.net import free_ports
from embedfleet.gateway.fleet import Fleet
from embedfleet.testing.polling import wait_for
from embedfleet.testing.workers import metric_value, scrape

from .test_fleet import Reference, cos

pytestmark = pytest.mark.slow

TEXTS = ["The cat sits on the mat.", "Quantum computers exploit superposition."]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Fleet]]:
    """Two real workers (started by a `Fleet`); a second gateway serves worker-0 as "mini-a" and
    worker-1 as "mini-b"."""
    tmp = Path(tmp_path_factory.mktemp("shared-fleet"))
    (fleet_port, port) = free_ports(2)
    with Fleet(workers=2, port=fleet_port, log_dir=tmp / "logs") as fleet:
        fleet.start()
        a, b = fleet.worker_children
        models = {
            "models": [
                {
                    "served_model_name": "mini-a",
                    "model": str(default_model_path()),
                    "workers": [a.address],
                },
                {
                    "served_model_name": "mini-b",
                    "model": str(default_model_path()),
                    "workers": [b.address],
                },
            ]
        }
        path = tmp / "models.json"
        path.write_bytes(orjson.dumps(models))
        argv = [sys.executable, "-m", "embedfleet.gateway.cli", "--models-file", str(path)]
        log = (tmp / "logs" / "shared.log").open("wb")
        gateway = subprocess.Popen(
            [*argv, "--port", str(port), "--probe-seconds", "0.2"], stdout=log, stderr=log
        )
        url = f"http://127.0.0.1:{port}"
        try:

            def ready() -> bool:
                assert gateway.poll() is None, (tmp / "logs" / "shared.log").read_text()
                try:
                    text = httpx.get(url + "/metrics", timeout=2).text
                except httpx.HTTPError:
                    return False
                return all(
                    metric_value(text, "embedfleet_gateway_workers", state="ready", model=m) == 1
                    for m in ("mini-a", "mini-b")
                )

            wait_for("the shared gateway sees both workers", ready, timeout=60, interval=0.2)
            yield url, fleet
        finally:
            gateway.terminate()
            gateway.wait(15)
            log.close()


def _embedded(worker_metrics_port: int) -> float:
    text = scrape(worker_metrics_port)
    return metric_value(text, "embedfleet_worker_requests_total", rpc="Embed", code="OK")


def _metrics_port(child: object) -> int:
    argv = child.argv  # type: ignore[attr-defined]
    return int(argv[argv.index("--metrics-port") + 1])


def test_each_model_reaches_only_its_own_worker(shared: tuple[str, Fleet]) -> None:
    url, fleet = shared
    ports = [_metrics_port(c) for c in fleet.worker_children]
    reference = Reference()(TEXTS)
    for model, mine in (("mini-a", 0), ("mini-b", 1), ("mini-a", 0)):
        before = [_embedded(p) for p in ports]
        reply = httpx.post(
            url + "/v1/embeddings", json={"model": model, "input": TEXTS}, timeout=60
        )
        assert reply.status_code == 200, reply.text
        doc = reply.json()
        assert doc["model"] == model
        for row, ref in zip(doc["data"], reference, strict=True):
            assert cos(row["embedding"], ref) >= 0.999
        after = [_embedded(p) for p in ports]
        assert after[mine] > before[mine]
        assert after[1 - mine] == before[1 - mine]
    assert [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]] == ["mini-a", "mini-b"]
    unknown = httpx.post(url + "/v1/embeddings", json={"model": "mini-c", "input": "x"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"

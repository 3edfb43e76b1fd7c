"""A kubeconfig neither gateway can use: each logs the failure and retries with a backoff,
staying up and not ready, and neither logs the kubeconfig's token. (Bad --workers-file input:
test_discovery.py.)"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from embedfleet.common.modeldir import ModelDir
from embedfleet.common.net import free_ports
from embedfleet.gateway.settings import GatewaySettings
from tests.gateway.helpers import wait_until

from .conftest import LIMITS, flags
from .pair import gateways

#: the bearer token of the unusable kubeconfig: in neither gateway's log
TOKEN = "s3cret-token-0123456789"


def _kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig with a token and a cluster whose CA neither gateway can use."""
    path.write_text(
        f"""apiVersion: v1
kind: Config
current-context: test
contexts:
- name: test
  context: {{cluster: test, user: test, namespace: default}}
clusters:
- name: test
  cluster:
    server: {server}
    certificate-authority-data: bm90IGEgY2VydGlmaWNhdGU=
users:
- name: test
  user: {{token: {TOKEN}}}
"""
    )
    return path


def test_an_unusable_kubeconfig_is_logged_and_retried_with_the_process_up(
    minilm: ModelDir, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (port,) = free_ports(1)  # nothing listens there
    config = _kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{port}")
    settings = GatewaySettings(k8s_service="default/engines", kubeconfig=str(config), **LIMITS)  # type: ignore[arg-type]
    rust = ["--k8s-service", "default/engines", "--kubeconfig", str(config), *flags(LIMITS)]
    log = tmp_path / "gateway-rs.log"
    caplog.set_level(logging.INFO)
    with gateways(minilm, settings, rust, log, wait_ready=False) as pair:

        def failures() -> list[int]:
            python = [r for r in caplog.records if r.getMessage() == "endpointslice watch failed"]
            return [len(python), log.read_text().count("endpointslice watch failed")]

        # Backoff 0.5 s, 1 s, 2 s: three failures each within a few seconds, no more than a
        # retry a second could make.
        started = time.monotonic()
        wait_until("three failures each", lambda: min(failures()) >= 3)
        elapsed = time.monotonic() - started
        assert max(failures()) <= elapsed + 3, (failures(), elapsed)
        for one in (pair.python(), pair.rust()):
            assert one.request("GET", "/health").status == 200
            reply = one.request("GET", "/ready")
            assert (reply.status, reply.json()) == (503, {"ready": False})
    assert TOKEN not in log.read_text()
    for record in caplog.records:
        assert TOKEN not in record.getMessage()
        assert TOKEN not in repr(vars(record))

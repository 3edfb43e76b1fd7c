"""Rendering charts/embedfleet with the pinned helm binary (built by hack/build-tools.sh)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from embedfleet.testing.tools import ensure_tools

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "embedfleet"
VALUES_FULL = Path(__file__).with_name("values-full.yaml")


def helm_binary() -> Path:
    return ensure_tools().path("helm")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(helm_binary()), *args], capture_output=True, text=True, timeout=120, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def render(*args: str, namespace: str = "embedfleet-system") -> list[dict[str, Any]]:
    """The documents of `helm template` (release `ef-test`), empty ones dropped."""
    out = helm("template", "ef-test", str(CHART), "--namespace", namespace, *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(docs: Sequence[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def leaf_paths(node: Any, prefix: str = "") -> Iterator[str]:
    """Dotted paths of a values tree; an empty map or list counts as a leaf."""
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from leaf_paths(value, f"{prefix}{key}.")
    else:
        yield prefix.rstrip(".")

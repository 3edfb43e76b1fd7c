"""Shared test configuration: GPU tests skip cleanly where there is no CUDA device."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator

    from embedfleet.testing.families import FamilyDirs
    from embedfleet.testing.otlp import Collector


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device; none here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


# ---- random-weight checkpoints of the served families (embedfleet.testing.families) ------------


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> FamilyDirs:
    """Every family's checkpoint, each built once per session on first use."""
    from embedfleet.testing.families import FamilyDirs

    return FamilyDirs(tmp_path_factory.mktemp("families"))


@pytest.fixture(scope="module")
def collector() -> Iterator[tuple[Collector, str]]:
    """An OTLP/gRPC collector on 127.0.0.1 and its endpoint, for a module's tracing tests."""
    from embedfleet.testing.otlp import running_collector

    with running_collector() as running:
        yield running

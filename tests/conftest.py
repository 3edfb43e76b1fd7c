"""Shared test configuration: GPU tests skip cleanly where there is no CUDA device, and each test
joins the xdist group that keeps what it shares with other tests in one worker process."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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


# First, so that xdist's own hook (which names each test's group in its id) finds the marks.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups = {item.nodeid: xdist_group(item) for item in items}
    items.sort(key=lambda item: run_order(groups[item.nodeid]))
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device; none here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


LONG_GROUPS = ("real-node-e2e", "real-node", "kwok")


def run_order(group: str) -> int:
    """The long groups first (a stable sort keeps file order inside each): each worker takes
    the next group when it is done with its own, so the directories fill in beside them (make
    test passes --no-loadscope-reorder)."""
    return LONG_GROUPS.index(group) if group in LONG_GROUPS else len(LONG_GROUPS)


def xdist_group(item: pytest.Item) -> str:
    """The unit `pytest -n N --dist loadgroup` (make test) hands to one worker process, in file
    order. A real node and a KWOK control plane start once per process and stay up, so every
    test on one of them is in its group. The real-node tests are two chains, each on its own
    node (the harness gives each a slot): the end-to-end modules, and the rest; together they
    were the run's longest chain, mostly waiting. Any other test goes with its directory, whose
    fixtures (fleets, engines, checkpoints) are then built once, as in a serial run."""
    fixtures = getattr(item, "fixturenames", ())
    if "k8s_real_node" in fixtures:
        return "real-node-e2e" if item.path.parent.name == "e2e" else "real-node"
    if "k8s_cluster" in fixtures:
        return "kwok"
    return str(item.path.parent.relative_to(item.config.rootpath))


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


def pytest_collection_finish(session: pytest.Session) -> None:
    """A worker of `--dist loadgroup` whose tests lost their group would start a second real node
    beside the first; xdist says nothing when that happens (pytest-xdist#1386), so this does."""
    if not hasattr(session.config, "workerinput") or not session.config.getvalue("loadgroup"):
        return
    ungrouped = [item.nodeid for item in session.items if "@" not in item.nodeid]
    if ungrouped:
        raise pytest.UsageError(f"xdist did not group {len(ungrouped)} tests, e.g. {ungrouped[0]}")


#: section -> the figures an xdist worker sent back at its end (e.g. tests/e2e's)
WORKER_FIGURES: dict[str, dict[str, Any]] = {}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    for section, figures in getattr(node, "workeroutput", {}).items():
        if section.endswith(" figures"):
            WORKER_FIGURES.setdefault(section, {}).update(figures)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for section, figures in WORKER_FIGURES.items():
        terminalreporter.section(section)
        for name, value in figures.items():
            terminalreporter.write_line(f"{name}: {value}")

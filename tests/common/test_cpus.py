"""The cores a process may use and the local fleet's split of them (pure, plus the cgroup read)."""

from __future__ import annotations

from pathlib import Path

import pytest

from embedfleet.common.cpus import (
    Layout,
    cgroup_quota,
    detect_cores,
    layout,
    usable_cores,
    wait_policy,
)


@pytest.mark.parametrize(
    ("cores", "expected"),
    [
        (1, Layout(1, 1)),
        # A lone request gets both cores; concurrent ones batch in the one worker.
        (2, Layout(1, 2)),
        (4, Layout(1, 4)),
        (8, Layout(2, 4)),
        (10, Layout(2, 5)),
        (16, Layout(4, 4)),
        (0, Layout(1, 1)),  # never less than one of each
    ],
)
def test_layout_gives_each_worker_its_share_of_the_cores(cores: int, expected: Layout) -> None:
    assert layout(cores) == expected


def test_threads_wait_passively_past_one() -> None:
    assert [wait_policy(n) for n in (1, 2, 8)] == ["ACTIVE", "PASSIVE", "PASSIVE"]


def test_a_fixed_worker_count_splits_the_cores_evenly() -> None:
    assert layout(2, workers=2) == Layout(2, 1)
    assert layout(8, workers=3) == Layout(3, 2)
    assert layout(2, workers=4) == Layout(4, 1)  # oversubscribed: one thread each


@pytest.mark.parametrize(
    ("text", "cores"),
    [("200000 100000\n", 2.0), ("150000 100000", 1.5), ("max 100000", None), ("", None),
     ("junk 100000", None), ("0 100000", None)],
)  # fmt: skip
def test_cgroup_quota_reads_cpu_max(text: str, cores: float | None) -> None:
    assert cgroup_quota(text) == cores


def test_usable_cores_is_the_affinity_cut_to_the_quota_rounded_up() -> None:
    assert usable_cores(64, 2.0) == 2
    assert usable_cores(64, 1.5) == 2
    assert usable_cores(64, 0.25) == 1
    assert usable_cores(2, 8.0) == 2  # a quota above the mask gives no more cores
    assert usable_cores(4, None) == 4


def test_detect_cores_reads_a_v2_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert detect_cores(tmp_path) == 1


def test_detect_cores_reads_a_v1_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert detect_cores(tmp_path) == 1


def test_detect_cores_without_a_quota_is_the_affinity(tmp_path: Path) -> None:
    import os

    assert detect_cores(tmp_path) == len(os.sched_getaffinity(0))

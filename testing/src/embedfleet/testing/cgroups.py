"""A named cgroup subtree in every mounted hierarchy (cgroup v1, v2 or hybrid), holding every
process of one real node: its daemons, the shims they fork and the pods' containers. Killing
what is inside and removing the subtree undoes a node, even one whose harness was SIGKILLed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from embedfleet.testing import mounts


def hierarchies(mountinfo: str | None = None) -> list[Path]:
    """The mount points of every cgroup (v1) and cgroup2 hierarchy, each once."""
    found: list[Path] = []
    for point, fstype in mounts.table(mountinfo):
        if fstype in ("cgroup", "cgroup2") and point not in found:
            found.append(point)
    return found


def _inherit_cpuset(directory: Path) -> None:
    # A new v1 cpuset group starts with no CPUs and no memory nodes; no task may join it then.
    for name in ("cpuset.cpus", "cpuset.mems"):
        own = directory / name
        if own.exists() and not own.read_text().strip():
            own.write_text((directory.parent / name).read_text())


def create(relative: str) -> list[Path]:
    """Makes /<relative> (nested dirs allowed) in every hierarchy; returns the leaf dirs."""
    leaves = []
    for mount in hierarchies():
        directory = mount
        for part in Path(relative).parts:
            directory = directory / part
            directory.mkdir(exist_ok=True)
            _inherit_cpuset(directory)
        leaves.append(directory)
    return leaves


def add_process(relative: str, pid: int) -> None:
    """Moves a process (all its threads) into /<relative> of every hierarchy."""
    for mount in hierarchies():
        (mount / relative / "cgroup.procs").write_text(f"{pid}\n")


def _groups(relative: str) -> list[Path]:
    """Every cgroup dir under /<relative> in every hierarchy, deepest first."""
    found: list[Path] = []
    for mount in hierarchies():
        top = mount / relative
        if not top.is_dir():
            continue
        for dirpath, dirnames, _ in os.walk(top):
            found.extend(Path(dirpath) / d for d in dirnames)
        found.append(top)
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def pids(relative: str) -> set[int]:
    """Every process in the subtree, in any hierarchy."""
    found: set[int] = set()
    for group in _groups(relative):
        with contextlib.suppress(FileNotFoundError):
            found.update(int(p) for p in (group / "cgroup.procs").read_text().split())
    return found


def kill_all(relative: str, timeout: float = 10.0) -> set[int]:
    """SIGKILLs everything in the subtree until it is empty; returns pids that outlived it."""
    deadline = time.monotonic() + timeout
    while (left := pids(relative)) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    return left


def remove(relative: str, timeout: float = 5.0) -> list[Path]:
    """Removes the (emptied) subtree in every hierarchy; returns any dir that stayed."""
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for group in _groups(relative):
            try:
                group.rmdir()
            except FileNotFoundError:
                pass
            except OSError:  # EBUSY while a killed task is still exiting
                left.append(group)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def exists(relative: str) -> list[Path]:
    return [mount / relative for mount in hierarchies() if (mount / relative).exists()]

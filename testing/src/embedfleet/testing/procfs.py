"""What benchmarks and tests read about processes from Linux /proc: CPU seconds, resident memory
and its peak, of one process or of a process and all its descendants (a server and the workers
it started). The parsers are pure; the readers return None for a process that is gone."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

PROC = Path("/proc")


def status_kib(text: str, field: str) -> int | None:
    """Pure: a kB field (VmRSS, VmHWM, ...) of a /proc/<pid>/status text; None if absent (a
    kernel thread or a zombie has no memory lines)."""
    prefix = field + ":"
    for line in text.splitlines():
        if line.startswith(prefix):
            return int(line.split()[1])
    return None


def stat_fields(text: str) -> list[str]:
    """Pure: the fields of /proc/<pid>/stat after the command name (which may hold spaces and
    parentheses), so index 0 is the state, 1 the parent pid, 11 and 12 utime and stime."""
    return text[text.rindex(")") + 2 :].split()


def descendants(parents: Mapping[int, int], root: int) -> list[int]:
    """Pure: `root` and every process below it, given each process's parent pid."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    tree, todo = [], [root]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo += children.get(current, [])
    return tree


def _status_kib(pid: int, field: str) -> int | None:
    with contextlib.suppress(OSError):
        return status_kib((PROC / str(pid) / "status").read_text(), field)
    return None


def rss_mb(pid: int) -> float | None:
    """Resident memory now, MiB."""
    kib = _status_kib(pid, "VmRSS")
    return None if kib is None else kib / 1024


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU of one process so far."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        fields = stat_fields((PROC / str(pid) / "stat").read_text())
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return None


def _stats() -> dict[int, list[str]]:
    stats = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError):
                stats[int(entry.name)] = stat_fields((entry / "stat").read_text())
    return stats


def tree(pid: int) -> list[int]:
    """`pid` and its live descendants."""
    return descendants({p: int(f[1]) for p, f in _stats().items()}, pid)


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of `pid` and all its live descendants."""
    tick = os.sysconf("SC_CLK_TCK")
    stats = _stats()
    members = descendants({p: int(f[1]) for p, f in stats.items()}, pid)
    return sum((int(stats[p][11]) + int(stats[p][12])) / tick for p in members if p in stats)


def tree_peak_rss_mb(pid: int) -> float | None:
    """The sum over `pid` and its live descendants of each one's peak resident memory (VmHWM),
    MiB; None if `pid` is gone. Each process's peak is its own, so where they peaked at different
    moments the sum is an upper bound on what the tree held at once."""
    peaks = [_status_kib(p, "VmHWM") for p in tree(pid)]
    if peaks[0] is None:
        return None
    return sum(k for k in peaks if k is not None) / 1024

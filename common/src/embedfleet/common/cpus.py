"""The CPUs a process may use and how a local fleet splits them between workers.

`usable_cores` is what the process may really run on: its affinity mask, cut to the cgroup's CPU
quota (a container limited to 2 CPUs on a 64-core node may still see all 64 in its mask, and
torch's default of one thread per core would then start 64 threads that the quota throttles).
`layout` is the decision, pure: given the cores, how many worker processes with how many torch
threads each; `wait_policy` the OpenMP wait policy of a worker with that many threads (PASSIVE
puts idle OpenMP threads to sleep at once, so they do not spin on cores the gateway's HTTP and
tokenizer work, or another worker, need). docs/benchmarks/results.md has the measurement behind
it (`python -m embedfleet.bench.layouts`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

#: torch threads one worker uses at most: a small encoder's GEMMs at batch 1 stop scaling near
#: here, and past it more workers (each batching its own share) serve concurrent load better
MAX_THREADS_PER_WORKER = 4


@dataclass(frozen=True, slots=True)
class Layout:
    """How a fleet on one machine uses its cores."""

    workers: int
    #: torch intra-op threads per worker (--threads); each worker picks its wait_policy from it
    threads: int


def layout(cores: int, workers: int = 0) -> Layout:
    """The measured best split of `cores` (0 `workers`: decide that too).

    One worker owns up to MAX_THREADS_PER_WORKER cores, so a lone long request runs on all of
    them (on 2 cores one worker with 2 threads halves a 512-token request's time against two
    single-thread workers), while concurrent requests still batch inside it; more cores get more
    workers. A fixed worker count splits the cores evenly between them.
    """
    cores = max(1, cores)
    if workers <= 0:
        workers = max(1, cores // MAX_THREADS_PER_WORKER)
    threads = max(1, cores // workers)
    return Layout(workers, threads)


def wait_policy(threads: int) -> str:
    """OMP_WAIT_POLICY for a process running `threads` torch threads: PASSIVE past one; one
    thread never waits. Measured on 2 shared cores (docs/benchmarks/README.md): ACTIVE was the
    worst policy in every round (about half the concurrent queries of libgomp's default), and
    PASSIVE served 1.19-1.42x the default's concurrent queries, its lone-request and batch
    figures swinging either way by more than the difference."""
    return "PASSIVE" if threads > 1 else "ACTIVE"


def cgroup_quota(cpu_max: str) -> float | None:
    """Cores allowed by a cgroup v2 `cpu.max` ("200000 100000" = 2 cores; "max 100000" = none)."""
    parts = cpu_max.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def usable_cores(affinity: int, quota: float | None) -> int:
    """The cores a process can keep busy: its affinity, cut to the quota rounded up; at least 1."""
    cores = max(1, affinity)
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return cores


def detect_cores(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """This process's usable cores (the I/O around `usable_cores`): affinity and cgroup v2 or v1."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count() or 1
    quota: float | None = None
    try:
        quota = cgroup_quota((cgroup / "cpu.max").read_text())
    except OSError:
        try:
            us = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
            period = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
            quota = us / period if us > 0 and period > 0 else None
        except (OSError, ValueError):
            quota = None
    return usable_cores(affinity, quota)

"""CPU time of a process's threads, grouped by what they run, from /proc (nothing in the process).

`/proc/<pid>/task/<tid>/schedstat` counts each thread's time on a CPU in nanoseconds (its `stat`
counts clock ticks of 10 ms: too coarse for a 0.5 ms request), and `comm` names the thread: the
gateway's tokio workers and tokenizer pool, the worker's event loop (the main thread), its engine
thread, gRPC's pollers and the compute runtime's pool (OpenVINO / OpenMP). Read before and after a
measured run, the difference per request says which threads a request costs, which the stage
histograms (wall time) cannot: a stage that waits costs no CPU, a forward on two threads costs two.
A thread that exits between the reads loses its time; the servers here keep theirs for their life.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from pathlib import Path

PROC = Path("/proc")
#: the group of the process's main thread (a Python worker's event loop)
MAIN = "main"
#: the group of threads that kept the process's own name: CPython 3.11 names no native thread, so
#: a worker's engine thread, its executor threads and the compute runtime's pool land here
UNNAMED = "unnamed threads"
_NUMBERED = re.compile(r"[-_:#.]?\d+$")


def group_of(tid: int, pid: int, comm: str, process_comm: str = "") -> str:
    """Pure: a thread's group: MAIN for the process's own thread, UNNAMED for one named as the
    process is, else its name without a trailing number (tokio-runtime-worker-3 ->
    tokio-runtime-worker)."""
    if tid == pid:
        return MAIN
    name = comm.strip()
    if name == process_comm.strip():
        return UNNAMED
    stripped = _NUMBERED.sub("", name)
    return stripped or name


def run_ns(schedstat: str) -> int:
    """Pure: nanoseconds on a CPU, the first field of a schedstat line."""
    return int(schedstat.split(maxsplit=1)[0])


def thread_ns(pid: int, proc: Path = PROC) -> dict[str, int]:
    """Nanoseconds on a CPU so far of each thread group of `pid` (empty once it is gone)."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        process_comm = (proc / str(pid) / "comm").read_text()
        for task in (proc / str(pid) / "task").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                comm = (task / "comm").read_text()
                ns = run_ns((task / "schedstat").read_text())
                group = group_of(int(task.name), pid, comm, process_comm)
                out[group] = out.get(group, 0) + ns
    return out


def per_request_us(
    before: Mapping[str, int], after: Mapping[str, int], requests: int
) -> dict[str, float]:
    """Pure: microseconds per request of each group between two reads; groups that used no
    CPU in between are left out, and a thread that was born in between counts from zero."""
    out = {}
    for group, ns in after.items():
        spent = ns - before.get(group, 0)
        if spent > 0 and requests > 0:
            out[group] = spent / requests / 1e3
    return out

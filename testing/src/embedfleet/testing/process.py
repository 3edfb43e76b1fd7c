"""Child processes of a cluster: starting them, recognising them later, stopping exactly them.

A pid alone may be reused once its process exits, so a process is identified by its pid plus its
start time in clock ticks since boot (field 22 of /proc/<pid>/stat). Linux only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from embedfleet.common.lifetime import dying_with_parent
from embedfleet.testing import procfs
from embedfleet.testing.polling import WaitTimeoutError, wait_for

T = TypeVar("T")


@dataclass(frozen=True)
class ProcessRecord:
    name: str
    pid: int
    start_ticks: int
    log: Path

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "log": str(self.log)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProcessRecord:
        return cls(
            name=str(data["name"]),
            pid=int(data["pid"]),
            start_ticks=int(data["start_ticks"]),
            log=Path(data["log"]),
        )


def start_ticks(pid: int) -> int | None:
    """The process's start time, or None if there is no such live (non-zombie) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = procfs.stat_fields(stat)
    state, ticks = fields[0], fields[19]
    return None if state in ("Z", "X") else int(ticks)


def is_running(record: ProcessRecord) -> bool:
    return start_ticks(record.pid) == record.start_ticks


def spawn(
    name: str,
    argv: Sequence[str],
    log: Path,
    env: Mapping[str, str] | None = None,
    *,
    die_with_parent: bool = True,
) -> tuple[subprocess.Popen[bytes], ProcessRecord]:
    """Starts argv in its own session (so a terminal's Ctrl-C reaches only us), logging to `log`.

    With `die_with_parent`, the process ends when the calling thread does: start clusters from a
    thread that outlives them (the main thread, normally).
    """
    with log.open("ab") as out:
        proc = subprocess.Popen(
            # SIGKILL, not SIGTERM: etcd and kube-apiserver terminating gracefully at the same
            # moment wait on each other's connections and hang.
            dying_with_parent(argv) if die_with_parent else list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
            start_new_session=True,
        )
    ticks = start_ticks(proc.pid)
    if ticks is None:
        proc.wait()
        raise RuntimeError(f"{name} exited at once ({proc.returncode}); see {log}")
    return proc, ProcessRecord(name=name, pid=proc.pid, start_ticks=ticks, log=log)


def _signal(record: ProcessRecord, sig: signal.Signals, running: bool) -> None:
    if running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.pid, sig)


def stop(
    records: Sequence[ProcessRecord],
    children: Sequence[subprocess.Popen[bytes]] = (),
    *,
    grace_seconds: float = 10.0,
) -> list[ProcessRecord]:
    """SIGTERMs every record still running, SIGKILLs any left after the grace period.

    `children` are the Popen objects when the caller started the processes itself: one of them
    has exited only once waitpid says so (which also reaps it). /proc is not enough there: a
    process's main thread shows as a zombie while its other threads are still exiting, and a
    stop() that returned then left the child unreaped with returncode None (the operator
    fixture's teardown flake). Returns the records that were still running (normally empty).
    """
    owned = {child.pid: child for child in children}

    def running(record: ProcessRecord) -> bool:
        child = owned.get(record.pid)
        if child is not None:
            return child.poll() is None
        return is_running(record)

    def remaining() -> list[ProcessRecord]:
        for child in children:
            child.poll()
        return [record for record in records if running(record)]

    def gone() -> bool:
        return not remaining()

    for record in records:
        _signal(record, signal.SIGTERM, running(record))
    with contextlib.suppress(WaitTimeoutError):
        wait_for("processes to exit on SIGTERM", gone, timeout=grace_seconds, interval=0.05)
    for record in remaining():
        _signal(record, signal.SIGKILL, running(record))
    with contextlib.suppress(WaitTimeoutError):
        wait_for("processes to exit on SIGKILL", gone, timeout=5.0, interval=0.05)
    return remaining()


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def died(record: ProcessRecord) -> str:
    return f"{record.name} exited; last lines of {record.log}:\n{log_tail(record.log)}"


def wait_while_running(
    what: str,
    record: ProcessRecord,
    probe: Callable[[], T | None],
    *,
    timeout: float,
    transient: tuple[type[Exception], ...],
    error: type[Exception],
) -> T:
    """wait_for(probe), failing at once with the log's tail if `record` exits, or with it at the
    timeout; a probe raising one of `transient` counts as not there yet."""

    def checked() -> T | None:
        if not is_running(record):
            raise error(died(record))
        try:
            return probe()
        except transient:
            return None

    try:
        return wait_for(what, checked, timeout=timeout)
    except WaitTimeoutError as err:
        raise error(f"{err}; last lines of {record.log}:\n{log_tail(record.log)}") from err

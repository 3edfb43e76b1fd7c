"""`embedfleet serve` as a user runs it: the console script started as a process, its printed URL,
its child processes read from /proc."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from embedfleet.testing.polling import wait_for

#: null-engine workers: the supervisor's machinery, quickly (real numbers: tests/gateway)
NULL_WORKERS = {"EMBEDFLEET_WORKER_ENGINE": "null", "EMBEDFLEET_WORKER_WARMUP_SECONDS": "0.2"}


def wait_until(what: str, probe: Callable[[], object], timeout: float = 20.0) -> None:
    wait_for(what, probe, timeout=timeout, interval=0.02)


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def cmdline(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def serve(
    port: int,
    *argv: str,
    workers: int = 2,
    env: Mapping[str, str] | None = None,
    stderr: IO[str] | int = subprocess.DEVNULL,
) -> subprocess.Popen[str]:
    """`embedfleet serve --workers N --port P ...`, its stdout piped."""
    script = Path(sys.executable).parent / "embedfleet"
    return subprocess.Popen(
        [str(script), "serve", "--workers", str(workers), "--port", str(port), *argv],
        stdout=subprocess.PIPE,
        stderr=stderr,
        env={**os.environ, **NULL_WORKERS, **(env or {})},
        text=True,
    )


def url_of(proc: subprocess.Popen[str], timeout: float = 120) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, "embedfleet serve exited before printing its URL"
        found = re.search(r"serving at (http://\S+)", line)
        if found:
            return found.group(1)
    raise TimeoutError("no URL printed")


def kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()

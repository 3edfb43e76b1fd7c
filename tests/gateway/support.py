"""Small helpers shared by the gateway tests."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(what: str, probe: Callable[[], object], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)


def metric(text: str, name: str) -> float:
    """The value of an unlabelled series in Prometheus text format."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)

"""Small helpers shared by the gateway tests."""

from __future__ import annotations

from collections.abc import Callable

from embedfleet.testing.polling import wait_for


def wait_until(what: str, probe: Callable[[], object], timeout: float = 20.0) -> None:
    """`wait_for` at the pace of in-process fakes: they change state within milliseconds."""
    wait_for(what, probe, timeout=timeout, interval=0.02)


def metric(text: str, name: str) -> float:
    """The value of an unlabelled series in Prometheus text format."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)

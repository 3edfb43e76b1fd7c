"""Unreachable routes for the address ranges a test cluster hands out but nothing here serves.

KWOK gives its fake pods addresses in POD_CIDR, and a control plane without kube-proxy on the host
hands out ClusterIPs in SERVICE_CIDR. Nothing answers at either, and the host's default route
would carry a packet for them off this machine (an autoscaler scraping a fake pod, a client trying
a ClusterIP). While any cluster of ours runs, both ranges are `unreachable` routes on the host: a
connect() there fails at once and no packet leaves. Every cluster on the host shares the routes, so
each records its API server (pid + start time) as a holder; the last holder to go removes them,
and a holder whose process is gone (a run killed before its teardown) is dropped by the next one.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

from embedfleet.testing.components import POD_CIDR, SERVICE_CIDR
from embedfleet.testing.nodeslots import locked
from embedfleet.testing.process import ProcessRecord, start_ticks

FENCED = (POD_CIDR, SERVICE_CIDR)
ROOT = Path(os.environ.get("EMBEDFLEET_FENCE_DIR", "/var/lib/embedfleet/fence"))


class FenceError(RuntimeError):
    """The unreachable routes could not be put in place."""


def hold(owner: ProcessRecord) -> Path:
    """Puts the routes in place (idempotent) for as long as `owner` runs; returns the holder."""
    with locked(ROOT):
        _drop_stale()
        holder = ROOT / f"{owner.pid}-{owner.start_ticks}-{uuid.uuid4().hex[:8]}.holder"
        holder.touch()
        for cidr in FENCED:
            _ip("route", "replace", "unreachable", cidr)
    return holder


def release(holder: Path) -> None:
    """Drops `holder`; with no live holder left, removes the routes."""
    with locked(ROOT):
        holder.unlink(missing_ok=True)
        _drop_stale()
        if not any(ROOT.glob("*.holder")):
            for cidr in FENCED:
                _ip("route", "del", "unreachable", cidr, check=False)


def routes() -> set[str]:
    """The fenced ranges that are unreachable routes right now."""
    out = subprocess.run(
        ["ip", "-4", "route", "show", "type", "unreachable"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    present = {line.split()[1] for line in out.splitlines() if len(line.split()) > 1}
    return present & set(FENCED)


def _drop_stale() -> None:
    for holder in ROOT.glob("*.holder"):
        pid, ticks = holder.name.split("-")[:2]
        if start_ticks(int(pid)) != int(ticks):
            holder.unlink(missing_ok=True)


def _ip(*args: str, check: bool = True) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise FenceError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")

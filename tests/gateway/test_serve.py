"""`embedfleet serve` as a user runs it: prints the URL, serves, and on SIGTERM stops its children.
Workers use the null engine (EMBEDFLEET_WORKER_ENGINE=null) to keep this quick; the real engine
behind the same machinery is covered by test_fleet.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from embedfleet.common.net import free_ports
from embedfleet.testing.process import start_ticks


def _children(pid: int) -> list[int]:
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


def test_serve_prints_url_serves_and_stops_children_on_sigterm() -> None:
    (port,) = free_ports(1)
    script = Path(sys.executable).parent / "embedfleet"
    env = {
        **os.environ,
        "EMBEDFLEET_WORKER_ENGINE": "null",
        "EMBEDFLEET_WORKER_WARMUP_SECONDS": "0.2",
    }
    proc = subprocess.Popen(
        [str(script), "serve", "--workers", "2", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = None
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "embedfleet serve exited before printing its URL"
            found = re.search(r"serving at (http://\S+)", line)
            url = found.group(1) if found else None
        assert url == f"http://127.0.0.1:{port}"
        children = _children(proc.pid)
        assert len(children) == 3  # two workers and the gateway
        reply = httpx.post(url + "/v1/embeddings", json={"input": ["a", "b c"]}, timeout=30)
        assert reply.status_code == 200
        assert reply.json()["usage"]["prompt_tokens"] == 7
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert all(start_ticks(pid) is None for pid in children)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

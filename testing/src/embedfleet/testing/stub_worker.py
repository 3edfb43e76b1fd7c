"""STUB WORKER (not the real server): a real process serving the worker's real metric families.

It builds `embedfleet.worker.metrics.WorkerMetrics` (the registry the worker serves, so names and
types cannot drift) and serves it with prometheus-client's HTTP server; instead of computing
embeddings it advances the counters at the rates a JSON control file asks for:

    {"tokens_per_second": 12000, "latency_seconds": 0.2, "capacity": 10000, "queued_tokens": 0}

Used where a real worker would need a model and a CPU budget the tests do not have: the
autoscaler's scrape tests and its integration test with KWOK's fake pods. `start_stub` starts one
from a test (the `StubWorker` handle rewrites its control file); by hand:

    python -m embedfleet.testing.stub_worker --port 9101 --control /tmp/load.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from embedfleet.common.net import free_ports
from embedfleet.testing.polling import WaitTimeoutError, wait_for
from embedfleet.worker.metrics import WorkerMetrics

TICK = 0.1
TOKENS_PER_REQUEST = 100


@dataclass
class StubWorker:
    """One stub worker process; `set_load` rewrites its control file."""

    port: int
    control: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def start(self) -> StubWorker:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "embedfleet.testing.stub_worker",
                "--port",
                str(self.port),
                "--control",
                str(self.control),
            ],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.process = process

        def serving() -> bool:
            try:
                with urllib.request.urlopen(self.url, timeout=1) as reply:
                    if reply.status == 200:
                        return True
            except OSError:
                pass
            if process.poll() is not None:
                raise RuntimeError(f"stub worker exited with {process.returncode}")
            return False

        try:
            wait_for(f"the stub worker on port {self.port}", serving, timeout=30, interval=0.05)
        except WaitTimeoutError as exc:
            raise RuntimeError(f"stub worker on port {self.port} did not come up") from exc
        return self

    def set_load(self, **control: float) -> None:
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps(control))
        tmp.replace(self.control)  # atomic: the stub never reads half a file

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_stub(started: list[StubWorker], tmp_path: Path, **control: float) -> StubWorker:
    """A stub worker on a free port, appended to `started` so the caller stops it."""
    (port,) = free_ports(1)
    stub = StubWorker(port, tmp_path / f"stub-{port}.json")
    stub.set_load(**control)
    started.append(stub.start())
    return stub


def main() -> None:
    """The stub process itself: serves the worker's registry and advances it every TICK."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--control", type=Path, required=True)
    args = parser.parse_args()
    metrics = WorkerMetrics()
    metrics.serve("127.0.0.1", args.port)
    control: dict[str, float] = {}
    seen = 0.0
    owed = 0.0  # fractional requests carried between ticks
    last = time.monotonic()
    while True:
        try:
            mtime = args.control.stat().st_mtime
            if mtime != seen:
                control, seen = json.loads(args.control.read_text()), mtime
        except (OSError, ValueError):
            pass  # keep the last control while the file is being replaced
        # By the time that really passed: a busy machine stretches the sleeps.
        now = time.monotonic()
        tokens = float(control.get("tokens_per_second", 0.0)) * (now - last)
        last = now
        metrics.tokens.inc(tokens)
        owed += tokens / TOKENS_PER_REQUEST
        for _ in range(int(owed)):
            metrics.request.observe(float(control.get("latency_seconds", 0.01)))
        owed -= int(owed)
        metrics.capacity.set(float(control.get("capacity", 0.0)))
        metrics.queued_tokens.set(float(control.get("queued_tokens", 0.0)))
        metrics.ready.set(1)
        time.sleep(TICK)


if __name__ == "__main__":
    main()

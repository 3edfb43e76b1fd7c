"""Stub worker processes for the autoscaler's tests (see stub_worker.py: real prometheus-client
registries over HTTP, counters advanced at the rate a control file asks for)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from embedfleet.testing.ports import free_ports

STUB = Path(__file__).with_name("stub_worker.py")


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
        self.process = subprocess.Popen(
            [sys.executable, str(STUB), "--port", str(self.port), "--control", str(self.control)],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url, timeout=1) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                time.sleep(0.05)
            if self.process.poll() is not None:
                raise RuntimeError(f"stub worker exited with {self.process.returncode}")
        raise RuntimeError(f"stub worker on port {self.port} did not come up")

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
    (port,) = free_ports(1)
    stub = StubWorker(port, tmp_path / f"stub-{port}.json")
    stub.set_load(**control)
    started.append(stub.start())
    return stub

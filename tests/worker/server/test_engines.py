"""Several engine processes in one worker (--engines N): the flags that split ports, memory and
threads, and the supervisor, with real child processes (null engine)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from embedfleet.worker.engines import engine_flags
from embedfleet.worker.settings import WorkerSettings


def test_each_engine_gets_its_own_ports_and_share() -> None:
    s = WorkerSettings(port=50051, metrics_port=9090, threads=8, engines=4)
    flags = [engine_flags(s, i, 4) for i in range(4)]

    def value(f: list[str], name: str) -> str:
        return f[f.index(name) + 1]

    assert [value(f, "--port") for f in flags] == ["50051", "50052", "50053", "50054"]
    assert [value(f, "--metrics-port") for f in flags] == ["9090", "9091", "9092", "9093"]
    assert {value(f, "--cuda-memory-fraction") for f in flags} == {"0.2250"}
    assert {value(f, "--threads") for f in flags} == {"2"}
    assert all(value(f, "--engines") == "1" for f in flags)
    # An explicit fraction, free ports and no metrics stay as set.
    own = WorkerSettings(port=0, metrics_port=0, cuda_memory_fraction=0.3, port_file="/tmp/p")
    f1 = engine_flags(own, 1, 2)
    assert "--port" not in f1
    assert "--metrics-port" not in f1
    assert "--cuda-memory-fraction" not in f1
    assert value(f1, "--port-file") == "/tmp/p.1"
    assert value(engine_flags(own, 0, 2), "--port-file") == "/tmp/p"


def _start_two(tmp_path: Path) -> tuple[subprocess.Popen[bytes], list[dict[str, int]]]:
    """`embedfleet-worker --engines 2` (null engine); the two engines' port files once written."""
    port_file = tmp_path / "port.json"
    env = {**os.environ, "EMBEDFLEET_WORKER_ENGINE": "null"}
    args = ["--engines", "2", "--port", "0", "--metrics-port", "0", "--port-file", str(port_file)]
    args += ["--warmup-seconds", "0.1"]
    proc = subprocess.Popen([sys.executable, "-m", "embedfleet.worker.cli", *args], env=env)
    files = [port_file, Path(f"{port_file}.1")]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(p.exists() for p in files):
        time.sleep(0.1)
    return proc, [json.loads(p.read_text()) for p in files if p.exists()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_supervisor_runs_n_workers_and_stops_them_on_sigterm(tmp_path: Path) -> None:
    proc, info = _start_two(tmp_path)
    try:
        assert len(info) == 2
        assert len({i["port"] for i in info}) == 2
        assert len({i["pid"] for i in info}) == 2
        assert proc.pid not in {i["pid"] for i in info}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert not any(_alive(i["pid"]) for i in info)  # both engines are gone
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_supervisor_exits_when_one_engine_dies(tmp_path: Path) -> None:
    proc, info = _start_two(tmp_path)
    try:
        assert len(info) == 2
        os.kill(info[1]["pid"], signal.SIGKILL)
        assert proc.wait(timeout=60) != 0
        assert not _alive(info[0]["pid"])  # the supervisor stopped and reaped the other
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

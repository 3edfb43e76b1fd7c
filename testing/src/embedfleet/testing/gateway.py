"""The Rust gateway binary (gateway/), built on first use by hack/build-gateway.sh and cached
under ~/.cache/embedfleet/gateway by a key of its sources and toolchain."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from embedfleet.common.net import free_ports
from embedfleet.testing.polling import WaitTimeoutError, wait_for
from embedfleet.testing.process import log_tail, spawn, stop
from embedfleet.testing.tools import REPO_ROOT, rust_artifact

BUILD_SCRIPT = REPO_ROOT / "hack" / "build-gateway.sh"
CRATE = REPO_ROOT / "gateway"
#: a prebuilt binary to use instead of building (e.g. outside a clone)
BINARY_ENV = "EMBEDFLEET_TEST_GATEWAY_BINARY"


def bundled_calibration() -> Path:
    """The int8/uint8 calibration the binary compiles in for the bundled all-MiniLM-L6-v2."""
    return CRATE / "src" / "model" / "minilm_quantization.json"


def gateway_binary(*, build: bool = True) -> Path:
    """The binary of this tree's gateway sources, compiled first when no cached build matches
    (minutes cold: its progress goes to this process's stderr)."""
    return rust_artifact("gateway", BINARY_ENV, build=build)


def child_env() -> dict[str, str]:
    """The environment for the binary and its tests: with no --model the binary looks for the
    bundled MiniLM package in $VIRTUAL_ENV's site-packages, so that names this interpreter's
    environment (where the workers find it) when nothing else does."""
    return {"VIRTUAL_ENV": sys.prefix, **os.environ}


def cargo_tool() -> str:
    """cargo: $CARGO, else from PATH, else rustup's default place."""
    return os.environ.get("CARGO") or _tool("cargo")


def _tool(name: str) -> str:
    """A cargo toolchain binary from PATH, else rustup's default place."""
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(directory) / name
        if candidate.is_file():
            return str(candidate)
    return str(Path.home() / ".cargo" / "bin" / name)


@dataclass(frozen=True)
class GatewayProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _ready(port: int, path: str = "/ready") -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def running_gateway(
    workers: Sequence[str],
    *flags: str,
    log: Path,
    ready_timeout: float = 30.0,
    wait_ready: bool = True,
) -> Iterator[GatewayProcess]:
    """The Rust gateway on 127.0.0.1 in front of `workers` (none: `flags` name them, e.g.
    --workers-file), ready (a worker answered Info; with `wait_ready` False only serving
    /health) for the duration of the block; stopped by its pid after it."""
    (port,) = free_ports(1)
    argv = [str(gateway_binary()), "--port", str(port)]
    if workers:
        argv += ["--workers", ",".join(workers)]
    # spawn/stop: its own session, ended with the test process, stopped by pid (process.py).
    proc, record = spawn("embedfleet-gateway", [*argv, *flags], log, child_env())
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"embedfleet-gateway exited: {log_tail(log)}")
            return _ready(port, "/ready" if wait_ready else "/health")

        try:
            wait_for("embedfleet-gateway to be ready", ready, timeout=ready_timeout)
        except WaitTimeoutError as exc:
            raise RuntimeError(f"embedfleet-gateway not ready: {log_tail(log)}") from exc
        yield GatewayProcess(proc, port, log)
    finally:
        stop([record], [proc])

"""The local fleet `embedfleet serve` runs: the gateway (the Rust binary) and N workers on
127.0.0.1, for trying embedfleet on one machine.

The children run in their own sessions so a terminal's Ctrl-C reaches only this process, which then
stops them in order (gateway first, so nothing new reaches a stopping worker) and waits for them.
While serving, `Fleet.supervise` restarts a child that exited, on the same port: at once the first
time, then after a backoff that doubles with each further quick failure; the gateway routes around
a missing worker meanwhile.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TextIO

from prometheus_client.parser import text_string_to_metric_families

from embedfleet.common.caches import user_cache_dir
from embedfleet.common.cpus import Layout, detect_cores, layout
from embedfleet.common.lifetime import dying_with_parent
from embedfleet.common.net import free_ports
from embedfleet.fleet.binary import find_front_library, find_gateway_binary

STOP_SECONDS = 15.0
#: how often `embedfleet serve` looks for exited children
SUPERVISE_SECONDS = 0.1


@dataclass(frozen=True)
class Backoff:
    """How long to wait before restarting a child that exited.

    The first exit of a streak is restarted at once: a wait there only lengthens the outage (it
    was half a second of every measured restart), and a child that keeps exiting is what a backoff
    is for. From the second quick exit on, `first_seconds`, doubling up to `max_seconds`.
    """

    first_seconds: float = 0.5
    max_seconds: float = 30.0
    #: a child that ran at least this long before exiting starts a new streak
    stable_seconds: float = 60.0

    def delay(self, failures: int) -> float:
        """The wait before restart number `failures` (1-based) of a quick-failure streak."""
        if failures <= 1:
            return 0.0
        return min(self.max_seconds, self.first_seconds * 2.0 ** (failures - 2))


class FleetError(RuntimeError):
    """A child process failed to start or exited early."""


def _script(name: str) -> str:
    """A console script of this environment (next to the interpreter), else from PATH."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        raise FleetError(f"{name} not found next to {sys.executable} or on PATH")
    return found


@dataclass
class Child:
    name: str
    argv: list[str]
    port: int
    #: a worker's Prometheus port (0 for the gateway, which serves /metrics on its own port)
    metrics_port: int = 0
    #: variables set for this child on top of the fleet's environment
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    #: exits in a row that came sooner than the backoff's `stable_seconds` after a start
    failures: int = 0
    #: when the exited child is due to start again (None: running, or not supervised)
    restart_at: float | None = None
    restarts: int = 0
    #: the last line the child wrote (relayed children only): why it exited, when it says
    last_line: str = ""
    relay: threading.Thread | None = None

    def exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def front_args(front: str) -> tuple[str, ...]:
    """The workers' --front (and where the Rust one's extension is)."""
    if front == "python":
        return ("--front", "python")
    library = find_front_library()
    return ("--front", "rust", *(("--front-library", library) if library else ()))


@dataclass
class Fleet:
    """Start with `start()` (or `with Fleet(...)`); `url` is the gateway's base URL."""

    #: worker processes; 0 decides from the cores (common.cpus.layout)
    workers: int = 0
    model: str = ""
    #: several models, each `PATH` or `NAME=PATH` ("" the bundled one) on `workers` workers of
    #: its own, behind one gateway routing by `model` (its --models-file); empty: `model` alone
    models: Sequence[str] = ()
    port: int = 8080
    worker_args: Sequence[str] = ()
    gateway_args: Sequence[str] = ()
    log_dir: Path | None = None
    #: the gateway binary; empty: found as binary.find_gateway_binary finds it
    gateway_binary: str = ""
    #: the workers' gRPC front: rust (its extension found as binary.find_front_library finds
    #: it), or python
    front: str = "rust"
    backoff: Backoff = field(default_factory=Backoff)
    #: every child's --log-format ("" leaves it to the children: auto)
    log_format: str = ""
    #: relay the children's lines to stderr, each after its child's name (without a log_dir)
    prefix: bool = False
    children: list[Child] = field(default_factory=list)
    _files: tempfile.TemporaryDirectory[str] | None = None
    #: the split of the cores `plan` decided (None before it ran)
    layout: Layout | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def worker_children(self) -> list[Child]:
        return [c for c in self.children if c.name.startswith("worker")]

    def plan(self) -> None:
        """Decide the children (ports, layout); `start` does it when not done yet."""
        served = [served_model(m) for m in self.models] or [("", self.model)]
        # The cores are split between every model's workers; 0 workers: decided per model.
        per_model = self.workers or max(1, layout(detect_cores()).workers // len(served))
        shape = self.layout = layout(detect_cores(), per_model * len(served))
        self.workers = per_model
        count = shape.workers
        ports = free_ports(2 * count)
        threads: list[str] = []
        if not any(a.startswith("--threads") for a in self.worker_args):
            # Workers on one machine split its cores; oversubscribed OpenMP threads spin.
            threads = ["--threads", str(shape.threads)]
        front = front_args(self.front)
        entries = []
        for m, (name, path) in enumerate(served):
            model = ["--model", path] if path else []
            mine = []
            for i in range(m * self.workers, (m + 1) * self.workers):
                argv = [
                    _script("embedfleet-worker"),
                    *model,
                    "--port",
                    str(ports[2 * i]),
                    "--metrics-port",
                    str(ports[2 * i + 1]),
                    *threads,
                    *front,
                    *self._log_args(),
                    *self.worker_args,
                ]
                mine.append(Child(f"worker-{i}", argv, ports[2 * i], ports[2 * i + 1]))
            self.children += mine
            entry = {"model": path, "workers": [c.address for c in mine]}
            entries.append({**entry, "served_model_name": name} if name else entry)
        binary = str(find_gateway_binary(self.gateway_binary))
        gateway = [binary, "--port", str(self.port), *self._log_args()]
        if self.models:
            self._files = tempfile.TemporaryDirectory(prefix="embedfleet-serve-")
            models_file = Path(self._files.name) / "models.json"
            models_file.write_text(json.dumps({"models": entries}))
            gateway += ["--models-file", str(models_file)]
        else:
            model = ["--model", self.model] if self.model else []
            gateway += [*model, "--workers", ",".join(c.address for c in self.children)]
        # Without --model the binary serves the bundled model's package, from the site-packages
        # of $VIRTUAL_ENV: this environment's, where the workers find it too.
        found = {"VIRTUAL_ENV": sys.prefix}
        self.children.append(Child("gateway", [*gateway, *self.gateway_args], self.port, env=found))

    def _log_args(self) -> list[str]:
        return ["--log-format", self.log_format] if self.log_format else []

    def _spawn(self, child: Child) -> None:
        out: int | None = None
        relay = self.prefix and self.log_dir is None
        if relay:
            out = subprocess.PIPE
        elif self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = os.open(
                self.log_dir / f"{child.name}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND
            )
        try:
            child.process = subprocess.Popen(
                # A fleet whose supervisor is killed outright (SIGKILL, OOM) stops with it:
                # SIGTERM, so each child still drains as on Ctrl-C.
                dying_with_parent(child.argv, signal.SIGTERM),
                env={**os.environ, **child.env} if child.env else None,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if out is not None else None,
                start_new_session=True,
            )
        finally:
            if out is not None and not relay:
                os.close(out)
        child.started_at = time.monotonic()
        if relay:
            width = max(len(c.name) for c in self.children)
            child.relay = threading.Thread(
                target=relay_lines,
                args=(child, f"{child.name:<{width}} | ", sys.stderr),
                name=f"relay-{child.name}",
                daemon=True,
            )
            child.relay.start()

    def start(self, timeout: float = 180.0) -> Fleet:
        if not self.children:
            self.plan()
        for child in self.children:
            self._spawn(child)
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float) -> None:
        """Until /ready answers 200, i.e. the gateway sees at least one ready worker."""
        deadline = time.monotonic() + timeout
        while True:
            for child in self.children:
                if child.process is not None and child.process.poll() is not None:
                    raise FleetError(self._exit_reason(child))
            try:
                with urllib.request.urlopen(self.url + "/ready", timeout=2) as reply:
                    if reply.status == 200 and self.all_workers_ready():
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise FleetError(
                    f"the fleet was not ready within {timeout:g}s; a large model on a CPU may "
                    "need a longer --start-timeout"
                )
            time.sleep(0.2)

    def _exit_reason(self, child: Child) -> str:
        assert child.process is not None
        if child.relay is not None:
            child.relay.join(1.0)  # its last lines
        why = f"{child.name} exited with {child.process.returncode}"
        return f"{why}: {child.last_line}" if child.last_line else why

    def all_workers_ready(self) -> bool:
        """Every live worker is in the gateway's rotation (from its metrics)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=2) as reply:
            text = reply.read().decode()
        alive = sum(1 for c in self.worker_children if c.process and c.process.poll() is None)
        # One series, or one per model (labelled model=...) in a gateway of several.
        ready = sum(
            s.value
            for family in text_string_to_metric_families(text)
            if family.name == "embedfleet_gateway_workers"
            for s in family.samples
            if s.labels.get("state") == "ready"
        )
        return ready == alive

    def supervise(self, now: float | None = None) -> list[str]:
        """One supervision step: plan a restart for each child that exited, start those due.

        Returns what happened, one line per event, for the caller to show.
        """
        now = time.monotonic() if now is None else now
        events: list[str] = []
        for child in self.children:
            if child.restart_at is None and child.exited():
                assert child.process is not None
                quick = now - child.started_at < self.backoff.stable_seconds
                child.failures = child.failures + 1 if quick else 1
                wait = self.backoff.delay(child.failures)
                child.restart_at = now + wait
                events.append(
                    f"{child.name} exited with {child.process.returncode}; "
                    f"restarting in {wait:.1f}s"
                )
            # In the same step when it is due at once: a step later is a poll interval lost.
            if child.restart_at is not None and now >= child.restart_at:
                child.restart_at = None
                child.restarts += 1
                self._spawn(child)
                assert child.process is not None
                events.append(f"{child.name} restarted (pid {child.process.pid})")
        return events

    def stop(self) -> None:
        """SIGTERM to each child, gateway first; SIGKILL whoever outlives STOP_SECONDS."""
        for child in reversed(self.children):
            if child.process is not None and child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_SECONDS
        for child in reversed(self.children):
            if child.process is None:
                continue
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
        if self._files is not None:
            self._files.cleanup()
            self._files = None

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


#: the workers' own setting of their OpenVINO cache, which `embedfleet serve` leaves alone
OPENVINO_CACHE_ENV = "EMBEDFLEET_WORKER_OPENVINO_CACHE_DIR"


def kept_openvino_args() -> tuple[str, ...]:
    """The worker arguments that keep its OpenVINO conversion in this user's cache, unless the
    environment names a cache: this machine's cache outlives the workers, so their CPU runtime
    auto converts the model once and reads it at every later start (docs/engine.md, "CPU
    runtimes")."""
    if os.environ.get(OPENVINO_CACHE_ENV):
        return ()
    return ("--openvino-cache-dir", str(user_cache_dir("openvino")))


_RELAY_LOCK = threading.Lock()


def relay_lines(child: Child, prefix: str, sink: TextIO) -> None:
    """Copy the child's output to `sink` line by line, each after `prefix`, until it closes (the
    child exited): a person sees which child said what."""
    source = child.process.stdout if child.process else None
    if source is None:
        return
    with source:
        for raw in source:
            child.last_line = line = raw.decode(errors="replace").rstrip("\n")
            with _RELAY_LOCK:  # whole lines only, though children write at once
                sink.write(f"{prefix}{line}\n")
                sink.flush()


def served_model(value: str) -> tuple[str, str]:
    """`NAME=PATH` as (NAME, PATH); a bare PATH serves under the model's own name ("")."""
    name, sep, path = value.partition("=")
    return (name, path) if sep and "/" not in name else ("", value)

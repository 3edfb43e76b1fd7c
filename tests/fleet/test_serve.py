"""`embedfleet serve` as a user runs it: prints the URL, serves through the gateway binary, restarts
a worker that dies, routes around one that is stopped, and on SIGTERM stops its children; the
supervisor's plan and backoff (pure). Workers use the null engine (helpers.NULL_WORKERS) to keep
this quick; the real engine behind the same machinery: tests/gateway/test_minilm.py."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from embedfleet.common.net import free_ports
from embedfleet.fleet.binary import BINARY
from embedfleet.fleet.cli import main
from embedfleet.fleet.supervisor import OPENVINO_CACHE_ENV, Backoff, Child, Fleet, FleetError
from embedfleet.testing.process import start_ticks
from embedfleet.testing.workers import health_status, metric_value

from .helpers import children, cmdline, kill, serve, url_of, wait_until


def test_serve_prints_url_serves_and_stops_children_on_sigterm(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    with (tmp_path / "stderr").open("w") as stderr:
        proc = serve(port, "--log-format", "text", stderr=stderr)
    try:
        url = url_of(proc)
        assert url == f"http://127.0.0.1:{port}"
        kids = children(proc.pid)
        assert len(kids) == 3  # two workers and the gateway
        reply = httpx.post(url + "/v1/embeddings", json={"input": ["a", "b c"]}, timeout=30)
        assert reply.status_code == 200
        assert reply.json()["usage"]["prompt_tokens"] == 7
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert all(start_ticks(pid) is None for pid in kids)
    finally:
        kill(proc)
    # Text lines, each after its child's name (padded to the longest), passed on to them all.
    said = {line.partition(" | ")[0] for line in (tmp_path / "stderr").read_text().splitlines()}
    assert said == {"worker-0", "worker-1", "gateway "}


def test_a_killed_serve_leaves_no_children() -> None:
    """SIGKILL (or the OOM killer) gives `embedfleet serve` no chance to stop its children: the
    kernel tells them (PR_SET_PDEATHSIG) and each stops as on Ctrl-C."""
    (port,) = free_ports(1)
    proc = serve(port)
    try:
        url_of(proc)
        kids = children(proc.pid)
        assert len(kids) == 3
        proc.kill()
        proc.wait()
        wait_until(
            "every child to stop",
            lambda: all(start_ticks(pid) is None for pid in kids),
            30,
        )
    finally:
        kill(proc)


# --- supervision ---------------------------------------------------------------------------------


def _worker_pids(supervisor: int) -> list[int]:
    return [
        pid for pid in children(supervisor) if any(b"embedfleet-worker" in a for a in cmdline(pid))
    ]


def _grpc_port(worker: int) -> int:
    argv = cmdline(worker)
    return int(argv[argv.index(b"--port") + 1])


def _ready_workers(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return metric_value(text, "embedfleet_gateway_workers", state="ready")


class Load:
    """A few keep-alive clients posting small requests until stopped (bounded by `seconds`)."""

    def __init__(self, url: str, clients: int = 3, seconds: float = 90) -> None:
        self.url = url
        self.stop = threading.Event()
        self.failures: list[str] = []
        #: (start, seconds) of every finished request
        self.latencies: list[tuple[float, float]] = []
        self.end = time.monotonic() + seconds
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def _client(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self.stop.is_set() and time.monotonic() < self.end:
                start = time.monotonic()
                try:
                    reply = client.post("/v1/embeddings", json={"input": ["a b", "c"]})
                    if reply.status_code != 200:
                        self.failures.append(f"{reply.status_code} {reply.text}")
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                self.latencies.append((start, time.monotonic() - start))

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(70)


def test_serve_restarts_a_killed_worker_and_routes_around_a_stopped_one() -> None:
    (port,) = free_ports(1)
    proc = serve(port)
    try:
        url = url_of(proc)
        lines: list[str] = []
        assert proc.stdout is not None
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
        reader.start()
        victim, other = _worker_pids(proc.pid)
        with Load(url) as load:
            time.sleep(1.0)
            killed = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            wait_until("a restart", lambda: any("restarted" in line for line in lines), 30)
            respawn = time.monotonic() - killed
            (restarted,) = set(_worker_pids(proc.pid)) - {other}
            assert restarted != victim
            # The restarted worker's own start-up, under the load: it shares the 2 cores with
            # the clients, the gateway and the other worker, so it is no start-up measured idle.
            address = f"127.0.0.1:{_grpc_port(restarted)}"
            wait_until(
                "the restarted worker SERVING", lambda: health_status(address) == "SERVING", 60
            )
            serving = time.monotonic()
            wait_until("two ready workers again", lambda: _ready_workers(url) == 2.0, 60)
            readmit = time.monotonic() - serving
            served_before = len(load.latencies)
            time.sleep(1.0)
            # A stopped (not dead) worker: requests must route around it, none may hang.
            stopped = time.monotonic()
            os.kill(other, signal.SIGSTOP)
            time.sleep(8.0)
            os.kill(other, signal.SIGCONT)
            resumed = time.monotonic()
            time.sleep(1.0)
        # Every request that started while the worker was stopped, or was in flight then.
        stalled = [t for s, t in load.latencies if s + t >= stopped and s <= resumed]
        worst = max(stalled)
        print(f"respawned {respawn:.2f}s after the kill, readmitted {readmit:.2f}s after "
              f"SERVING; worst latency while stopped {worst:.2f}s over {len(stalled)} "
              "requests")  # fmt: skip
        assert load.failures == []
        assert len(load.latencies) > served_before
        # No restart backoff the first time: a supervision step (0.1 s poll) after the exit.
        assert respawn < 1.0
        # Then the gateway's channel reconnects (its reconnect backoff is capped at 2 s, +20%
        # jitter) and a probe readmits the worker.
        assert readmit < 2.0 * 1.2 + 0.2 + 0.5
        assert any("worker-" in line and "exited with -9" in line for line in lines), lines
        assert worst < 6.0
        kids = children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert all(start_ticks(pid) is None for pid in kids)
    finally:
        kill(proc)


def _gateway_pid(supervisor: int) -> int:
    (pid,) = [pid for pid in children(supervisor) if cmdline(pid)[0].endswith(BINARY.encode())]
    return pid


def test_a_request_in_flight_at_sigterm_finishes_within_its_deadline() -> None:
    """The gateway pod's grace period covers a request's whole deadline; so must the gateway's
    own shutdown, or SIGTERM cuts requests that were within it (it gave them 10 s)."""
    (port,) = free_ports(1)
    env = {
        "EMBEDFLEET_WORKER_NULL_TOKENS_PER_SECOND": "100",
        "EMBEDFLEET_GATEWAY_UPSTREAM_TIMEOUT_SECONDS": "40",
    }
    proc = serve(port, workers=1, env=env)
    try:
        url = url_of(proc)
        texts = [" ".join(["word"] * 200)] * 6  # 6 x 202 tokens: ~12 s at 100 tokens/s
        replies: list[httpx.Response] = []
        sender = threading.Thread(
            target=lambda: replies.append(
                httpx.post(url + "/v1/embeddings", json={"input": texts}, timeout=60)
            )
        )
        sent = time.monotonic()
        sender.start()
        time.sleep(1.0)
        os.kill(_gateway_pid(proc.pid), signal.SIGTERM)
        sender.join(60)
        (reply,) = replies
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["prompt_tokens"] == 6 * 202
        assert time.monotonic() - sent > 12  # it really was in flight beyond the old 10 s
    finally:
        kill(proc)


def test_backoff_restarts_at_once_then_doubles_per_quick_failure_up_to_its_cap() -> None:
    backoff = Backoff(first_seconds=0.5, max_seconds=4.0)
    assert [backoff.delay(n) for n in range(1, 8)] == [0.0, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_supervise_restarts_an_exited_child_at_once_then_after_its_backoff() -> None:
    fleet = Fleet(backoff=Backoff(first_seconds=1.0, max_seconds=8.0, stable_seconds=60.0))
    child = Child("worker-0", [sys.executable, "-c", "import time; time.sleep(60)"], 0)
    fleet.children.append(child)
    try:
        assert fleet.supervise() == []  # not started: nothing to watch
        fleet._spawn(child)
        assert child.process is not None
        first = child.process
        first.kill()
        first.wait()
        now = child.started_at + 1.0  # a quick failure, the streak's first: no wait
        exited, restarted = fleet.supervise(now)  # both in one step
        assert exited == "worker-0 exited with -9; restarting in 0.0s"
        assert restarted.startswith("worker-0 restarted (pid ")
        assert child.process is not first
        assert child.process.poll() is None
        second = child.process
        second.kill()
        second.wait()
        # The second quick failure waits first_seconds.
        now = child.started_at + 1.0
        assert fleet.supervise(now) == ["worker-0 exited with -9; restarting in 1.0s"]
        assert fleet.supervise(now + 0.9) == []
        assert fleet.supervise(now + 1.0)[0].startswith("worker-0 restarted (pid ")
        assert child.process is not second
        child.process.kill()
        child.process.wait()
        # A third waits twice as long; one after a stable run starts a new streak.
        assert fleet.supervise(child.started_at + 1.0)[0].endswith("restarting in 2.0s")
        child.restart_at = None
        assert fleet.supervise(child.started_at + 61.0)[0].endswith("restarting in 0.0s")
        assert child.process is not None
        assert child.process.poll() is None
    finally:
        fleet.stop()


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_plan_splits_the_usable_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("embedfleet.fleet.supervisor.detect_cores", lambda: 8)
    fleet = Fleet()  # no count: decided from the cores
    fleet.plan()
    assert fleet.workers == 2
    assert [_flag(c.argv, "--threads") for c in fleet.worker_children] == ["4", "4"]
    ports = {c.port for c in fleet.children} | {c.metrics_port for c in fleet.worker_children}
    assert len(ports) == 2 * 2 + 1


def test_plan_keeps_a_given_count_and_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("embedfleet.fleet.supervisor.detect_cores", lambda: 2)
    fleet = Fleet(workers=2)
    fleet.plan()
    assert [_flag(c.argv, "--threads") for c in fleet.worker_children] == ["1", "1"]
    mine = Fleet(workers=1, worker_args=("--threads", "3"))
    mine.plan()
    assert mine.worker_children[0].argv.count("--threads") == 1


@pytest.mark.parametrize("own", ["", "/srv/graphs"])
def test_serve_keeps_the_workers_openvino_graphs_in_the_user_cache(
    own: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """This machine's cache outlives the workers, so their CPU runtime auto converts the model
    to OpenVINO once (docs/engine.md, "CPU runtimes"); a cache the user set is left to them."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv(OPENVINO_CACHE_ENV, own)
    planned: list[Fleet] = []

    def stop_after_plan(self: Fleet, timeout: float) -> Fleet:
        planned.append(self)
        raise FleetError("planned")

    monkeypatch.setattr(Fleet, "start", stop_after_plan)
    with pytest.raises(SystemExit, match="planned"):
        main(["serve", "--workers", "1", "--port", str(free_ports(1)[0])])
    [argv] = [c.argv for c in planned[0].worker_children]
    if own:
        assert "--openvino-cache-dir" not in argv
    else:
        assert _flag(argv, "--openvino-cache-dir") == str(tmp_path / "embedfleet" / "openvino")

"""Slow, stalled and idle HTTP clients against the gateway's real server bounds, in front of FAKE
workers (fakes.py): stalled connections are closed after their bound, a busy kept-alive one after
its age, a connection flood is refused cleanly past the cap, and a normal client is answered
throughout."""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .fakes import FakeWorker
from .helpers import serving, wait_until

HEADER_SECONDS = 1.0
BODY_SECONDS = 1.0
KEEP_ALIVE_SECONDS = 1.0
#: short, so the module's kept-alive clients (the Prober's too) are aged out while they run
MAX_AGE_SECONDS = 2.0
STALLED = 300
CAP = 400
#: each connection's bounds are drawn from their last tenth, so a burst is not closed as one
SPREAD = 0.1


@pytest.fixture(scope="module")
def workers() -> Iterator[list[FakeWorker]]:
    fakes = [FakeWorker(i).start() for i in range(2)]
    yield fakes
    for w in fakes:
        w.stop()


@contextlib.contextmanager
def _serving(workers: list[FakeWorker], cap: int, log: Path) -> Iterator[str]:
    """The gateway's URL, serving with these bounds until the block ends."""
    bounds = {
        "probe_seconds": 0.1,
        "header_timeout_seconds": HEADER_SECONDS,
        "body_timeout_seconds": BODY_SECONDS,
        "keep_alive_seconds": KEEP_ALIVE_SECONDS,
        "max_connection_age_seconds": MAX_AGE_SECONDS,
        "max_connections": cap,
    }
    with serving(bounds, log, workers) as gateway:
        yield gateway.url


@pytest.fixture(scope="module")
def gateway(workers: list[FakeWorker], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("slow_clients") / "gateway.log"
    with _serving(workers, CAP, log) as url:
        yield url


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _connect(url: str, first: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", _port(url)), timeout=10)
    if first:
        sock.sendall(first)
    return sock


def _until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and when it closed (monotonic)."""
    sock.settimeout(timeout)
    got = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            got += chunk
    return got, time.monotonic()


class Prober:
    """A normal keep-alive client posting small requests in a thread; records each latency."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as client:
            deadline = time.monotonic() + 60
            while not self.stop.is_set() and time.monotonic() < deadline:
                start = time.monotonic()
                try:
                    reply = client.post("/v1/embeddings", json={"input": [[5, 6]]})
                    if reply.status_code != 200:
                        self.failures.append(reply.text)
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                self.latencies.append(time.monotonic() - start)
                time.sleep(0.01)

    def __enter__(self) -> Prober:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(20)


def test_stalled_connections_are_closed_after_the_header_bound_while_others_are_served(
    gateway: str,
) -> None:
    with Prober(gateway) as prober:
        time.sleep(0.3)
        opened = time.monotonic()
        # Half send a request line and a Host header and stop; half send nothing at all.
        partial = b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n"
        stalled = [_connect(gateway, partial if i % 2 else b"") for i in range(STALLED)]
        try:
            closed = [_until_closed(s, HEADER_SECONDS + 10) for s in stalled]
        finally:
            for s in stalled:
                s.close()
        time.sleep(0.3)
    assert prober.failures == []
    assert len(prober.latencies) > 10
    last = max(t for _, t in closed) - opened
    assert min(t for _, t in closed) - opened >= HEADER_SECONDS * (1 - SPREAD)
    assert last < HEADER_SECONDS + 3.0, last
    assert all(b"408 Request Timeout" in got for got, _ in closed)
    worst = max(prober.latencies)
    print(
        f"{STALLED} stalled: all closed {last:.2f}s after opening; normal client worst {worst:.3f}s"
    )
    assert worst < 1.0


def test_a_slow_body_gets_408_and_the_connection_closes(gateway: str) -> None:
    head = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        b"content-length: 100\r\n\r\n"
    )
    sock = _connect(gateway, head + b'{"input": ')
    start = time.monotonic()
    got, closed = _until_closed(sock, BODY_SECONDS + 10)
    sock.close()
    assert got.startswith(b"HTTP/1.1 408 "), got
    assert b'"request_timeout"' in got
    assert BODY_SECONDS * 0.9 <= closed - start < BODY_SECONDS + 3.0


def test_an_idle_kept_alive_connection_is_closed(gateway: str) -> None:
    sock = _connect(gateway, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    start = time.monotonic()
    got, closed = _until_closed(sock, KEEP_ALIVE_SECONDS + 10)
    sock.close()
    assert got.startswith(b"HTTP/1.1 200 ")
    assert b"408" not in got  # idle after a response is the keep-alive bound, not a slow request
    assert KEEP_ALIVE_SECONDS * (1 - SPREAD) <= closed - start < KEEP_ALIVE_SECONDS + 3.0


def test_a_busy_connection_past_its_age_is_closed_after_a_response(gateway: str) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", _port(gateway), timeout=10)
    start = time.monotonic()
    said: list[str | None] = []
    try:
        # Busier than the keep-alive bound, so only the age can end it; bounded in count.
        while len(said) < 100:
            conn.request("POST", "/v1/embeddings", body=b'{"input": [[5, 6]]}')
            reply = conn.getresponse()
            reply.read()
            assert reply.status == 200
            said.append(reply.getheader("connection"))
            if reply.will_close:
                break
            time.sleep(0.05)
        aged = time.monotonic() - start
        assert conn.sock is None  # the client let it go: the answer said so
    finally:
        conn.close()
    # Every answer before the last kept the connection; the last closed it, at the drawn age.
    assert said[-1] == "close", said
    assert "close" not in said[:-1]
    assert MAX_AGE_SECONDS * (1 - SPREAD) <= aged < MAX_AGE_SECONDS + 1.0, aged


def test_connections_past_the_cap_are_refused_cleanly(
    workers: list[FakeWorker], tmp_path: Path
) -> None:
    with _serving(workers, 20, tmp_path / "gateway.log") as url:
        held = [_connect(url) for _ in range(20)]
        try:
            extra = _connect(url)
            got, _ = _until_closed(extra, 5)
            extra.close()
            assert got.startswith(b"HTTP/1.1 503 "), got
            assert b'"too_many_connections"' in got
        finally:
            for s in held:
                s.close()
        # Once they are gone, new clients are served again.
        wait_until(
            "served again",
            lambda: httpx.get(url + "/health", timeout=5).status_code == 200,
            timeout=10,
        )

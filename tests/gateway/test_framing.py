"""HTTP framing errors against the gateway binary over raw sockets: each is answered with its
status (400, 408, 413, 431) and an OpenAI-shaped error body, never an empty body and never 499
to a client still connected, with `Connection: close` where its body was left unread; a flood
of header lines on one connection leaves the gateway's memory where it was."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from embedfleet.testing.gateway import GatewayProcess, running_gateway

#: the gateway's bounds here: short, so the slow cases take a second
BOUNDS = ("--header-timeout-seconds", "1", "--body-timeout-seconds", "1")
MAX_HEADER_BYTES = 65536
MAX_HEADERS = 100


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """The binary with short bounds; no worker listens at its address (framing needs none)."""
    log = tmp_path_factory.mktemp("framing") / "gateway.log"
    with running_gateway(["127.0.0.1:9"], *BOUNDS, log=log, wait_ready=False) as gw:
        yield gw


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> dict[str, object]:
        """The OpenAI error object the body holds (every key present)."""
        doc = json.loads(self.body)
        error = doc["error"]
        assert list(error) == ["message", "type", "param", "code"], doc
        assert isinstance(error["message"], str), doc
        assert error["message"], doc
        return dict(error)


def _parse(raw: bytes) -> Reply:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", len(body)))
    return Reply(status, headers, body[:length])


def exchange(
    gw: GatewayProcess, data: bytes, *, half_close: bool = False, wait: float = 5.0
) -> Reply:
    """`data` sent on a new connection (then, with `half_close`, its write side shut); the
    reply read until the gateway closes or `wait` seconds pass."""
    with socket.create_connection(("127.0.0.1", gw.port), timeout=wait) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        received = b""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            received += chunk
    assert received, "the gateway answered nothing"
    return _parse(received)


def post(body_head: str, body: bytes = b"") -> bytes:
    return (
        f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"{body_head}\r\n"
    ).encode() + body


def test_a_bad_request_line_is_a_400_with_an_error_body(gateway: GatewayProcess) -> None:
    reply = exchange(gateway, b"NOT HTTP AT ALL\r\n\r\n")
    assert reply.status == 400
    assert reply.headers["content-type"] == "application/json"
    assert reply.error()["type"] == "invalid_request_error"


def test_headers_over_the_byte_limit_are_a_431(gateway: GatewayProcess) -> None:
    big = "a" * (MAX_HEADER_BYTES + 1024)
    reply = exchange(gateway, f"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n".encode())
    assert reply.status == 431
    error = reply.error()
    assert error["code"] == "request_header_fields_too_large"
    assert str(MAX_HEADER_BYTES) in str(error["message"])


def test_more_header_fields_than_the_limit_are_a_431(gateway: GatewayProcess) -> None:
    fields = "".join(f"X-H{i}: v\r\n" for i in range(MAX_HEADERS + 1))
    reply = exchange(gateway, f"GET /health HTTP/1.1\r\nHost: x\r\n{fields}\r\n".encode())
    assert reply.status == 431
    assert reply.error()["code"] == "request_header_fields_too_large"


def test_headers_within_the_limits_are_served(gateway: GatewayProcess) -> None:
    fields = "".join(f"X-H{i}: v\r\n" for i in range(MAX_HEADERS - 10))
    reply = exchange(
        gateway,
        f"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{fields}\r\n".encode(),
    )
    assert reply.status == 200
    assert json.loads(reply.body) == {"status": "ok"}


def test_a_broken_chunked_body_is_a_400_not_a_499(gateway: GatewayProcess) -> None:
    data = post("Transfer-Encoding: chunked\r\n", b"zz-not-a-size\r\n{}\r\n0\r\n\r\n")
    reply = exchange(gateway, data)
    assert reply.status == 400
    assert "chunked" in str(reply.error()["message"])
    assert reply.headers["connection"] == "close"


def test_a_body_shorter_than_its_length_is_a_400_when_the_client_stops_sending(
    gateway: GatewayProcess,
) -> None:
    data = post("Content-Length: 100\r\n", b'{"input": "a"}')
    reply = exchange(gateway, data, half_close=True)
    assert reply.status == 400
    assert "declared length" in str(reply.error()["message"])


def test_a_body_shorter_than_its_length_is_a_408_when_the_client_waits(
    gateway: GatewayProcess,
) -> None:
    data = post("Content-Length: 100\r\n", b'{"input": "a"}')
    reply = exchange(gateway, data)
    assert reply.status == 408
    assert reply.error()["code"] == "request_timeout"


def test_a_body_over_the_limit_is_a_413(gateway: GatewayProcess) -> None:
    reply = exchange(gateway, post(f"Content-Length: {1 << 40}\r\n"))
    assert reply.status == 413
    assert reply.error()["code"] == "request_too_large"


def test_a_reply_before_the_body_is_read_says_connection_close(gateway: GatewayProcess) -> None:
    """Refused before its body was read (413 by its length, 405, 404), a request's reply says
    `Connection: close`: hyper closes such a connection after the reply, and a client told
    nothing would send its next request on it and lose it. One refused after its body was read
    keeps the connection."""
    cases = {
        413: post(f"Content-Length: {1 << 40}\r\n"),
        405: b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
        404: b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
    }
    for status, data in cases.items():
        reply = exchange(gateway, data)
        assert (reply.status, reply.headers.get("connection")) == (status, "close")
    read = exchange(gateway, post("Content-Length: 2\r\n", b"{}"), wait=1.0)
    assert (read.status, read.headers.get("connection")) == (400, None)


def test_slow_headers_are_a_408(gateway: GatewayProcess) -> None:
    reply = exchange(gateway, b"GET /health HTTP/1.1\r\nHost: x\r\n")
    assert reply.status == 408
    assert reply.error()["code"] == "request_timeout"


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_header_flood_leaves_memory_where_it_was(gateway: GatewayProcess) -> None:
    """Up to 600 MB of header lines on one connection (bounded by count and 60 s): the gateway
    refuses the head at its limit and closes, holding no more than 50 MB more than before."""
    before = _rss_kib(gateway.proc.pid)
    line = b"X-Flood: " + b"a" * 1000 + b"\r\n"
    chunk = line * 64
    sent, limit, deadline = 0, 600 * 1024 * 1024, time.monotonic() + 60
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        try:
            while sent < limit and time.monotonic() < deadline:
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass  # refused and closed: the point
    grown_mib = (_rss_kib(gateway.proc.pid) - before) / 1024
    assert grown_mib < 50, f"RSS grew {grown_mib:.1f} MiB after {sent >> 20} MiB of headers"
    assert sent < limit, "the gateway read 600 MB of header lines without refusing them"
    assert (
        exchange(gateway, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").status
        == 200
    )

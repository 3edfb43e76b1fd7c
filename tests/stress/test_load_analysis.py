"""The load generator's analysis (testing/overload.py), on made-up outcomes: what the stress tests'
assertions rest on must itself be right."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from embedfleet.testing.overload import (
    NO_ANSWER,
    KeepAlive,
    Outcome,
    mixed_bodies,
    summarize,
    words_of,
    work_in_flight,
)


def test_work_in_flight_counts_answered_requests_spanning_the_moment() -> None:
    outcomes = [
        Outcome(0.0, 4.0, 200, tokens=100),
        Outcome(1.0, 2.0, 200, tokens=10),
        Outcome(1.5, 1.6, 429, retry_after=1),
        Outcome(3.0, 9.0, 200, tokens=1000),
    ]
    moments = [0.5, 1.5, 2.5, 3.5, 5.0, 9.5]
    assert work_in_flight(outcomes, moments) == [100, 110, 100, 1100, 1000, 0]


def test_summary_goodput_runs_from_the_first_request_to_the_last_answer() -> None:
    outcomes = [
        Outcome(10.0, 12.0, 200, tokens=3000),
        Outcome(11.0, 11.5, 429, retry_after=2),
        Outcome(11.0, 11.2, 429),  # no Retry-After
        Outcome(12.0, 14.0, 200, tokens=1000),
        Outcome(12.5, 13.0, 504, error="upstream_timeout"),
        Outcome(13.0, 15.0, NO_ANSWER, error="TimeoutError"),
        Outcome(13.0, 13.1, 400, error="x"),
    ]
    s = summarize(outcomes, capacity=500)
    assert s.goodput == pytest.approx(4000 / 4.0)
    assert s.goodput_ratio == pytest.approx(2.0)
    assert (s.requests, s.ok, s.shed, s.no_answer) == (7, 2, 2, 1)
    assert s.server_errors == {"504 upstream_timeout": 1}
    assert s.other == {400: 1}
    assert s.shed_without_retry_after == 1
    assert s.ok_max_seconds == 2.0
    # Both 429s came while the first request (3000 tokens, 6 s at 500 tokens/s) was in flight.
    assert s.least_seconds_ahead_of_a_429 == pytest.approx(6.0)


def test_mixed_bodies_span_the_sizes_asked_for() -> None:
    words = words_of(["the", "##ing", "fox", "a", "jumps", "[CLS]", "über"])
    assert words == ["fox", "jumps", "the"]
    bodies = [orjson.loads(b) for b in mixed_bodies(words, seed=1, count=200)]
    sizes = [len(b["input"]) for b in bodies]
    lengths = [len(t.split()) for b in bodies for t in b["input"]]
    assert min(sizes) >= 1
    assert 90 < max(sizes) <= 100
    assert min(lengths) >= 5
    assert 490 < max(lengths) <= 500
    assert all(b["truncate"] is True for b in bodies)
    assert mixed_bodies(words, seed=1, count=3) == mixed_bodies(words, seed=1, count=3)


async def test_keep_alive_reopens_a_connection_the_server_closed_while_idle() -> None:
    """The gateway closes an idle kept-alive connection after its bound; a client waiting out a
    Retry-After longer than that must not count its next request as unanswered."""
    served = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        served += 1
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        await asyncio.sleep(0.05)  # then close, idle: as a keep-alive bound does
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    conn = KeepAlive("127.0.0.1", port)
    try:
        assert (await conn.post("/", b"{}")).status == 200
        await asyncio.sleep(0.2)
        assert (await conn.post("/", b"{}")).status == 200
    finally:
        conn.close()
        server.close()
    assert served == 2

"""The gateway's connection gate (connection.py) on a recording loop and transport: a stalled
connection never builds uvicorn's protocol, a finished head is handed over with its bytes and its
deadline, and connections opened together are not closed together."""

from __future__ import annotations

from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from embedfleet.gateway.connection import (
    HEAD_BYTES,
    SPREAD,
    BoundedHttpToolsProtocol,
    Gate,
    bounded_protocol,
    spread,
)

HEADER_SECONDS = 10.0


class Timer:
    def __init__(self, callback: Any) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def fire(self) -> None:
        assert not self.cancelled
        self.callback()


class Loop:
    """The part of an event loop the gate uses, with the timers it was asked for."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[tuple[float, Timer]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Any) -> Timer:
        timer = Timer(callback)
        self.timers.append((when, timer))
        return timer


class Transport:
    def __init__(self) -> None:
        self.written = b""
        self.closed = False
        self.protocol: object = None

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def set_protocol(self, protocol: object) -> None:
        self.protocol = protocol


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bytes, float]]:
    """What each handed-over protocol received: (the head's bytes, the header deadline)."""
    got: list[tuple[bytes, float]] = []

    def take_over(self: Any, transport: Any, head: bytes, deadline: float) -> None:
        transport.set_protocol(self)
        got.append((head, deadline))

    monkeypatch.setattr(BoundedHttpToolsProtocol, "take_over", take_over)
    return got


async def _app(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("no request reaches the app here")


def _gates(n: int, cap: int = 100) -> tuple[list[Gate], list[Transport], Loop, ServerState]:
    gate_class = bounded_protocol(HEADER_SECONDS, cap)
    loop, state = Loop(), ServerState()
    config = uvicorn.Config(app=_app, http=gate_class)
    gates = [gate_class(config, state, {}, _loop=loop) for _ in range(n)]  # type: ignore[call-arg]
    transports = [Transport() for _ in range(n)]
    for gate, transport in zip(gates, transports, strict=True):
        gate.connection_made(transport)  # type: ignore[arg-type]
    return gates, transports, loop, state  # type: ignore[return-value]


def test_a_stalled_head_builds_no_protocol_and_gets_408_at_its_deadline(
    made: list[tuple[bytes, float]],
) -> None:
    (gate,), (transport,), loop, state = _gates(1)
    gate.data_received(b"POST /v1/embeddings HTTP/1.1\r\n")
    gate.data_received(b"Host: slowloris\r\n")
    assert made == []
    assert transport.protocol is None
    assert len(state.connections) == 1  # counted for the cap and for shutdown
    ((when, timer),) = loop.timers
    assert loop.now + HEADER_SECONDS * (1 - SPREAD) <= when <= loop.now + HEADER_SECONDS
    timer.fire()
    assert transport.written.startswith(b"HTTP/1.1 408 ")
    assert transport.closed
    gate.connection_lost(None)
    assert len(state.connections) == 0


@pytest.mark.parametrize("ending", [b"\r\n\r\n", b"\n\n", b"\r\n\n", b"\n\r\n"])
def test_a_finished_head_is_handed_over_with_its_bytes_and_deadline(
    made: list[tuple[bytes, float]], ending: bytes
) -> None:
    (gate,), (transport,), loop, state = _gates(1)
    (when, timer), = loop.timers  # fmt: skip
    # The blank line split across reads, as TCP may deliver it.
    head = b"GET /health HTTP/1.1\r\nHost: x" + ending + b"GET /ready"
    for i in range(0, len(head), 3):
        gate.data_received(head[i : i + 3])
    ((got, deadline),) = made
    end = head.index(ending) + len(ending)
    # all the bytes so far, up to the end of the read that finished the head
    assert head.startswith(got)
    assert len(got) >= end
    assert deadline == when
    assert timer.cancelled
    assert isinstance(transport.protocol, BoundedHttpToolsProtocol)
    assert gate not in state.connections


def test_a_head_past_its_byte_bound_goes_to_the_parser_unfinished(
    made: list[tuple[bytes, float]],
) -> None:
    (gate,), _, _, _ = _gates(1)
    gate.data_received(b"GET / HTTP/1.1\r\nX: " + b"a" * (HEAD_BYTES - 40))
    assert made == []
    gate.data_received(b"a" * 30)
    assert len(made) == 1
    assert len(made[0][0]) > HEAD_BYTES


def test_connections_past_the_cap_are_answered_503_without_a_timer(
    made: list[tuple[bytes, float]],
) -> None:
    gates, transports, loop, _ = _gates(3, cap=2)
    assert [t.closed for t in transports] == [False, False, True]
    assert transports[2].written.startswith(b"HTTP/1.1 503 ")
    assert len(loop.timers) == 2
    gates[2].data_received(b"GET / HTTP/1.1\r\n\r\n")
    assert made == []


def test_connections_opened_together_are_closed_apart(made: list[tuple[bytes, float]]) -> None:
    """A burst of connections is not closed as one burst (which slowloris reopens as one)."""
    _, _, loop, _ = _gates(200)
    deadlines = sorted(when - loop.now for when, _ in loop.timers)
    assert deadlines[0] >= HEADER_SECONDS * (1 - SPREAD)
    assert deadlines[-1] <= HEADER_SECONDS
    assert deadlines[-1] - deadlines[0] > HEADER_SECONDS * SPREAD / 2
    # no more than a handful within any one millisecond
    assert max(sum(1 for d in deadlines if t <= d < t + 0.001) for t in deadlines) < 10


def test_spread_stays_within_the_last_tenth_of_the_bound() -> None:
    assert spread(10.0, 0.0) == 10.0
    assert spread(10.0, 0.999999) == pytest.approx(10.0 * (1 - SPREAD))
    assert spread(5.0, 0.5) == pytest.approx(5.0 * (1 - SPREAD / 2))

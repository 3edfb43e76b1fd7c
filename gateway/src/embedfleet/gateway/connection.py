"""uvicorn's httptools connection, bounded against slow and idle clients, behind a cheap gate.

uvicorn times out an idle kept-alive connection (`timeout_keep_alive`), but a connection that never
finishes a request's headers (or sends nothing at all) is kept forever, so enough of them use up the
process's file descriptors and every new client is reset. This protocol adds the two missing
bounds: a request's headers must arrive within `header_seconds` of the connection opening (or of
the next request's first byte), else the client gets 408 and the connection is closed; and beyond
`max_connections` open connections a new one is answered 503 and closed at once, cleanly, instead
of reaching the file-descriptor limit. The body's own deadline is the app's (app.py), because only
the app reads the body.

Each connection's header and keep-alive deadlines are drawn from the last `SPREAD` of their bound.
With one fixed bound, connections opened in one burst are closed in one burst, a client that
reopens what was closed (slowloris does) opens them again together, and every delay on either side
merges neighbouring bursts, so the bursts grow cycle by cycle: measured with 5,000 stalled sockets,
from tens of connections accepted back to back to 146 within three 10 s cycles, each burst a stall
of the event loop that every other client waits out. A spread of a tenth of the bound scatters a
burst of hundreds over a second within one cycle.

Until its first request's headers are in, a connection is only a `Gate`: the bytes so far, a
deadline, the cap. uvicorn's protocol (its parser, scope, flow control, the socket's two
addresses) is built when there is a request to parse. A stalled connection, which never gets
there, then costs the event loop a few attribute writes instead of a protocol: under 5,000
stalled connections, the gateway's user CPU fell by a third.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import orjson
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState


def canned(status: bytes, code: str, message: str, kind: str) -> bytes:
    """A complete HTTP/1.1 response in OpenAI's error shape that closes the connection."""
    body = orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})
    head = (
        b"HTTP/1.1 " + status + b"\r\n"
        b"content-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n"
        b"connection: close\r\n\r\n"
    )
    return head + body


TOO_MANY = canned(
    b"503 Service Unavailable",
    "too_many_connections",
    "The server holds its maximum number of connections; retry later.",
    "server_error",
)
#: a first request's head longer than this goes to the parser unfinished (it has its own rules)
HEAD_BYTES = 65536
#: the blank line ending a head, after a header line's CRLF or bare LF (what follows is CR LF or LF)
HEAD_ENDS = (b"\n\r\n", b"\n\n")

#: the fraction of a bound its deadlines are spread over, below the bound itself
SPREAD = 0.1


def spread(bound: float, draw: float) -> float:
    """One connection's deadline for `bound`, from `draw` uniform in [0, 1): never past the bound,
    never sooner than `1 - SPREAD` of it."""
    return bound * (1.0 - SPREAD * draw)


HEADERS_TOO_SLOW = canned(
    b"408 Request Timeout",
    "request_timeout",
    "The request's headers did not arrive in time.",
    "invalid_request_error",
)


#: the ASGI scope extension under which a request finds its `Peer` (app.py)
PEER = "embedfleet.peer"


class Peer:
    """What the connection knows of one request's client, for the app's hot path (app.py).

    A disconnect signal without a task: the connection calls `callback` when it is lost before
    the response completed; ASGI offers only `receive()` for that, which the app would await in a
    task of its own per request. And whether the body is all in, so that reading it needs no
    deadline armed (docs/benchmarks, "Gateway CPU")."""

    __slots__ = ("_cycle", "callback")

    def __init__(self, cycle: Any) -> None:
        self._cycle = cycle
        #: called once, on the event loop, when the client goes away; set by the app
        self.callback: Callable[[], None] | None = None

    @property
    def gone(self) -> bool:
        """The connection was lost before this request's response completed."""
        return bool(self._cycle.disconnected)

    @property
    def body_in(self) -> bool:
        """The whole body has arrived: `receive()` returns it without waiting."""
        return not self._cycle.more_body

    @property
    def over(self) -> bool:
        return bool(self._cycle.response_complete or self._cycle.disconnected)


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """Set `header_seconds` and `max_connections` on a subclass: see `bounded_protocol`."""

    header_seconds: float = 10.0
    max_connections: int = 4096
    #: 0: no age bound (see GatewaySettings.max_connection_age_seconds)
    max_age_seconds: float = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        #: the requests of this connection not yet answered (more than one only when pipelined)
        self._disconnects: list[Peer] = []
        self._header_seconds = spread(self.header_seconds, random.random())
        # uvicorn annotates it int; it is only ever a delay for call_later
        self.timeout_keep_alive = spread(self.timeout_keep_alive, random.random())  # type: ignore[assignment]
        # Past it, the next response says `Connection: close`; from the first request (the
        # protocol is built then), spread so connections opened together do not close together.
        self._close_after = (
            self.loop.time() + spread(self.max_age_seconds, random.random())
            if self.max_age_seconds > 0
            else None
        )

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            transport.write(TOO_MANY)
            transport.close()
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
        waiting, self._disconnects = self._disconnects, []
        for each in waiting:
            if each.gone and each.callback is not None:
                each.callback()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None:
            if self._close_after is not None and self.loop.time() >= self._close_after:
                # uvicorn then writes `Connection: close` and closes after the response.
                cycle.keep_alive = False
            # The request's task is created but has not run: the scope can still be added to.
            signal = Peer(cycle)
            if self._disconnects:
                self._disconnects = [d for d in self._disconnects if not d.over]
            self._disconnects.append(signal)
            extensions: dict[str, Any] = cycle.scope.setdefault("extensions", {})
            extensions[PEER] = signal

    def take_over(self, transport: asyncio.Transport, head: bytes, deadline: float) -> None:
        """Continue a `Gate`'s connection: its bytes so far, its header deadline (loop time)."""
        transport.set_protocol(self)
        self.connection_made(transport)
        if self._header_timer is not None:
            self._disarm()
            self._arm(deadline)
        self.data_received(head)

    def _arm(self, deadline: float | None = None) -> None:
        if self._header_timer is None:
            when = self.loop.time() + self._header_seconds if deadline is None else deadline
            self._header_timer = self.loop.call_at(when, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined request stalled behind one still being answered: finish that one, then
            # close (a 408 now would land in the middle of its response).
            self.cycle.keep_alive = False
            return
        self.transport.write(HEADERS_TOO_SLOW)
        self.transport.close()


class Gate(asyncio.Protocol):
    """A connection until its first request's head is in; then a `protocol` takes it over.

    uvicorn builds it as it would its protocol (`config`, `server_state`, `app_state`) and counts
    it among the server's connections, for the cap and for shutdown. Set `protocol` on a subclass:
    see `bounded_protocol`.
    """

    protocol: type[BoundedHttpToolsProtocol] = BoundedHttpToolsProtocol

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self._config, self._server_state, self._app_state = config, server_state, app_state
        self._loop = _loop or asyncio.get_event_loop()
        self._connections: set[Any] = server_state.connections
        self._transport: asyncio.Transport | None = None
        self._head = b""
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._transport = transport
        self._connections.add(self)
        if len(self._connections) > self.protocol.max_connections:
            transport.write(TOO_MANY)
            transport.close()
            return
        self._deadline = self._loop.time() + spread(self.protocol.header_seconds, random.random())
        self._timer = self._loop.call_at(self._deadline, self._too_slow)

    def data_received(self, data: bytes) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        seen = max(0, len(self._head) - 2)
        self._head += data
        if len(self._head) >= HEAD_BYTES or any(self._head.find(e, seen) >= 0 for e in HEAD_ENDS):
            self._hand_over()

    def _hand_over(self) -> None:
        assert self._transport is not None
        self._stop()
        protocol = self.protocol(
            config=self._config,
            server_state=self._server_state,
            app_state=self._app_state,
            _loop=self._loop,
        )
        head, self._head = self._head, b""
        protocol.take_over(self._transport, head, self._deadline)

    def _too_slow(self) -> None:
        self._timer = None
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(HEADERS_TOO_SLOW)
            self._transport.close()

    def _stop(self) -> None:
        self._connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop()

    def shutdown(self) -> None:
        """uvicorn's shutdown: nothing is in progress on a gated connection."""
        if self._transport is not None:
            self._transport.close()


def bounded_protocol(
    header_seconds: float, max_connections: int, max_age_seconds: float = 0.0
) -> type[asyncio.Protocol]:
    """The class to pass as uvicorn's `http`: a `Gate` handing over to the bounded protocol."""
    protocol = type(
        "GatewayHttpProtocol",
        (BoundedHttpToolsProtocol,),
        {
            "header_seconds": header_seconds,
            "max_connections": max_connections,
            "max_age_seconds": max_age_seconds,
        },
    )
    return type("GatewayGate", (Gate,), {"protocol": protocol})

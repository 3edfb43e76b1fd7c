"""uvicorn's httptools connection, bounded against slow and idle clients.

uvicorn times out an idle kept-alive connection (`timeout_keep_alive`), but a connection that never
finishes a request's headers (or sends nothing at all) is kept forever, so enough of them use up the
process's file descriptors and every new client is reset. This protocol adds the two missing
bounds: a request's headers must arrive within `header_seconds` of the connection opening (or of
the next request's first byte), else the client gets 408 and the connection is closed; and beyond
`max_connections` open connections a new one is answered 503 and closed at once, cleanly, instead
of reaching the file-descriptor limit. The body's own deadline is the app's (app.py), because only
the app reads the body.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


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
HEADERS_TOO_SLOW = canned(
    b"408 Request Timeout",
    "request_timeout",
    "The request's headers did not arrive in time.",
    "invalid_request_error",
)


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """Set `header_seconds` and `max_connections` on a subclass: see `bounded_protocol`."""

    header_seconds: float = 10.0
    max_connections: int = 4096

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

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

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_seconds, self._headers_too_slow)

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


def bounded_protocol(header_seconds: float, max_connections: int) -> type[HttpToolsProtocol]:
    """The protocol class to pass as uvicorn's `http`, with these bounds."""
    return type(
        "GatewayHttpProtocol",
        (BoundedHttpToolsProtocol,),
        {"header_seconds": header_seconds, "max_connections": max_connections},
    )

"""A failed call to a worker, and what the gateway may do about it (retry elsewhere, eject)."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

# Codes after which the same chunk may succeed elsewhere: the worker never ran it, or died.
_RETRYABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED}
)
# Codes that say the worker (or the connection to it) is broken, not merely busy. Not CANCELLED: a
# worker answers it for a call whose handler was cancelled (its drain, a deadline racing the
# reply), which says nothing about its health; a broken connection shows as UNAVAILABLE or as an
# RST_STREAM (below).
_EJECTING = frozenset({grpc.StatusCode.UNAVAILABLE})


# Not frozen: contextlib (a `with` the error passes through) assigns its __traceback__. eq=False
# keeps an exception's identity equality and hash.
@dataclass(eq=False)
class UpstreamError(Exception):
    code: grpc.StatusCode
    details: str

    @property
    def retryable(self) -> bool:
        return self.code in _RETRYABLE or self._broken_connection

    @property
    def ejects(self) -> bool:
        return self.code in _EJECTING or self._broken_connection

    @property
    def _broken_connection(self) -> bool:
        # A peer that dies mid-stream can surface as INTERNAL/UNKNOWN with a transport message.
        text = self.details.lower()
        return self.code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN) and any(
            s in text for s in ("rst_stream", "socket closed", "connection reset", "goaway")
        )

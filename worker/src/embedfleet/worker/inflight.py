"""The bytes of request messages a worker holds at once, and the largest message it accepts.

A request message is counted from the moment gRPC hands its bytes to the deserializer until its
call ends; one that would take the total past the limit is refused (RESOURCE_EXHAUSTED) before it
is parsed, so concurrent huge messages are dropped as they arrive instead of all being decoded
and queued at once. gRPC itself refuses a message longer than `max_message_bytes` before it is
buffered: none longer can hold a request the worker would accept.
"""

from __future__ import annotations

from dataclasses import dataclass

#: wire bytes per token at most: an int32 id, a uint8 type id, and an int32 length when every
#: sequence is one token long
BYTES_PER_TOKEN = 9
#: protobuf tags, length prefixes and the request's option fields
ENVELOPE_BYTES = 4096


def max_message_bytes(max_request_tokens: int) -> int:
    """The longest message that can carry a request of at most `max_request_tokens` tokens."""
    return BYTES_PER_TOKEN * max_request_tokens + ENVELOPE_BYTES


def mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


@dataclass(eq=False, slots=True)
class Ticket:
    """One admitted message's share of the budget; released once, explicitly or when dropped."""

    budget: ByteBudget
    size: int
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.budget.held -= self.size

    def __del__(self) -> None:
        # A call cancelled between its message's arrival and its handler never reaches the
        # handler's release; its share comes back when gRPC drops the message instead.
        self.release()


@dataclass(slots=True)
class ByteBudget:
    """Used on the event loop only (gRPC asyncio deserializes there): no lock needed. The
    metrics gauge reads `held` at scrape time."""

    limit: int
    held: int = 0

    def take(self, size: int) -> Ticket | None:
        """A ticket for `size` more bytes, or None when they would pass the limit."""
        if self.held + size > self.limit:
            return None
        self.held += size
        return Ticket(self, size)

    def refusal(self, size: int) -> str:
        return (
            f"the worker holds {mib(self.held)} of request messages; this {mib(size)} one "
            f"would pass its limit of {mib(self.limit)} (--max-inflight-bytes): retry later "
            "or elsewhere"
        )

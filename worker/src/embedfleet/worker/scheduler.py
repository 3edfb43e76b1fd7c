"""First-come-first-served batching by token count: which queued requests form the next batch.

Pure decisions, no threads and no I/O: the server's engine thread calls `FcfsQueue.next_batch`
under its own lock. Latency is roughly proportional to tokens, so batches are bounded by a token
budget (and a sequence cap), never by request count. Requests are taken strictly in arrival order:
the batch closes at the first request that does not fit, even if a later, smaller one would, so a
large request can never be starved by a stream of small ones.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar


@dataclass(frozen=True, slots=True)
class Budget:
    #: token budget of one batch; a single request above it runs alone
    max_tokens: int
    #: most sequences in one batch; a single request above it runs alone
    max_sequences: int
    #: a request above this many tokens is refused outright
    hard_max_tokens: int

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.max_sequences < 1:
            raise ValueError("batch budgets must be positive")
        if self.hard_max_tokens < self.max_tokens:
            raise ValueError("the hard request limit must be at least the batch token budget")


#: the least a paced batch budget holds: below it the per-batch costs outweigh what is saved
MIN_PACED_TOKENS = 512


def paced(budget: Budget, capacity: float, seconds: float, floor: int = MIN_PACED_TOKENS) -> Budget:
    """The batch budget once the worker has measured its speed: at most `seconds` of work per
    batch at `capacity` tokens/s, never below `floor` tokens nor above the configured budget.

    A batch is work no other worker can take over. At the end of a burst one worker may still be
    computing a full 16,384-token batch, about 11 s at a shared CPU's 1,500 tokens/s, while the
    others idle, and a request arriving behind it waits the whole batch out. A fast device's
    budget is unchanged (a GPU makes its configured batch in milliseconds). Unknown capacity (0)
    or no time bound (`seconds` 0) leaves the budget as configured."""
    if capacity <= 0 or seconds <= 0:
        return budget
    tokens = max(floor, int(capacity * seconds))
    if tokens >= budget.max_tokens:
        return budget
    return Budget(max(1, tokens), budget.max_sequences, budget.hard_max_tokens)


class Admission(enum.Enum):
    SHARE = "share"  # fits a batch with others
    ALONE = "alone"  # over the batch budget: it will run as a batch of its own
    REJECT = "reject"  # over the hard limit


def admit(tokens: int, sequences: int, budget: Budget) -> Admission:
    if tokens > budget.hard_max_tokens:
        return Admission.REJECT
    if tokens > budget.max_tokens or sequences > budget.max_sequences:
        return Admission.ALONE
    return Admission.SHARE


class DropReason(enum.Enum):
    CANCELLED = "cancelled"
    DEADLINE = "deadline"


class Queued(Protocol):
    """What the planner needs to know of a queued request."""

    @property
    def tokens(self) -> int: ...

    @property
    def sequences(self) -> int: ...

    def drop_reason(self, now: float) -> DropReason | None:
        """Why it must not be computed any more (client gone, deadline passed), or None."""
        ...


Q = TypeVar("Q", bound=Queued)


@dataclass(slots=True)
class Batch(Generic[Q]):
    items: list[Q] = field(default_factory=list)
    tokens: int = 0
    sequences: int = 0
    #: requests removed from the queue's head without compute, with why
    dropped: list[tuple[Q, DropReason]] = field(default_factory=list)


class QueueFullError(Exception):
    """The queue holds its maximum number of requests."""


class FcfsQueue(Generic[Q]):
    """The arrival-ordered queue with its running totals (for the queued-tokens gauge)."""

    def __init__(self, budget: Budget, max_requests: int) -> None:
        self.budget = budget
        self.max_requests = max_requests
        self._items: deque[Q] = deque()
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Q]:
        return iter(self._items)

    @property
    def tokens(self) -> int:
        return self._tokens

    def push(self, item: Q) -> None:
        if len(self._items) >= self.max_requests:
            raise QueueFullError(f"{len(self._items)} requests already queued")
        self._items.append(item)
        self._tokens += item.tokens

    def next_batch(self, now: float) -> Batch[Q]:
        """Pop the longest arrival-order prefix of live requests that fits the budget.

        Dead requests met on the way are popped and reported, costing no budget. The first live
        request is always taken, so one over the budget forms a batch by itself.
        """
        batch: Batch[Q] = Batch()
        budget = self.budget
        while self._items:
            head = self._items[0]
            reason = head.drop_reason(now)
            if reason is not None:
                self._pop()
                batch.dropped.append((head, reason))
                continue
            if batch.items and (
                batch.tokens + head.tokens > budget.max_tokens
                or batch.sequences + head.sequences > budget.max_sequences
            ):
                break
            self._pop()
            batch.items.append(head)
            batch.tokens += head.tokens
            batch.sequences += head.sequences
        return batch

    def _pop(self) -> None:
        item = self._items.popleft()
        self._tokens -= item.tokens

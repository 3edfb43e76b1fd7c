"""CUDA-graph policy: shape buckets and the capture/replay/evict decisions, as pure code.

A graph replays fixed shapes, so every batch is padded up to a bucket: total tokens rounded up (fine
steps while batches are small, coarser above a switch point) and sequence count rounded up to a
power of two. The cache decides per bucket whether to run eager, capture or replay, and which graph
to drop when the bound is hit. No torch here: the runner in `graph_runner.py` executes the
decisions, and tests drive this module without a GPU.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal, get_args

GraphMode = Literal["lazy", "eager", "off"]
GRAPH_MODES: tuple[GraphMode, ...] = get_args(GraphMode)


def graph_mode(name: str) -> GraphMode:
    """The mode named `name` (a --cuda-graphs value), typed; ValueError for any other string."""
    for mode in GRAPH_MODES:
        if mode == name:
            return mode
    raise ValueError(f"unknown CUDA graph mode {name!r}; use one of {list(GRAPH_MODES)}")


@dataclass(frozen=True, slots=True)
class BucketPolicy:
    token_step: int = 64
    token_switch: int = 1024
    token_large_step: int = 256

    def __post_init__(self) -> None:
        if min(self.token_step, self.token_large_step) <= 0 or self.token_switch < 0:
            raise ValueError("bucket steps must be positive")

    def tokens(self, total: int) -> int:
        """Smallest bucket holding `total` tokens."""
        if total <= self.token_switch:
            return max(self.token_step, _round_up(total, self.token_step))
        return _round_up(total, self.token_large_step)

    @staticmethod
    def sequences(count: int) -> int:
        """Slots for `count` sequences plus one for padding tokens, rounded to a power of two."""
        need = count + 1
        return 1 << (need - 1).bit_length()

    def key(self, total_tokens: int, sequences: int) -> GraphKey:
        return GraphKey(self.tokens(total_tokens), self.sequences(sequences))

    def sequence_buckets(self, tokens: int, max_sequences: int) -> list[int]:
        """Every sequence bucket a token bucket can meet (for capturing at start)."""
        top = self.sequences(min(tokens, max_sequences))
        out, slots = [], 2
        while slots <= top:
            out.append(slots)
            slots *= 2
        return out


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


@dataclass(frozen=True, slots=True, order=True)
class GraphKey:
    tokens: int
    sequences: int


class Action(enum.Enum):
    EAGER = "eager"
    CAPTURE = "capture"
    REPLAY = "replay"


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    #: the bucket to pad to (eager mode may replay a larger captured bucket); None when eager
    key: GraphKey | None = None
    #: graphs to free before capturing (least recently used first)
    evict: tuple[GraphKey, ...] = ()


@dataclass
class GraphCache:
    """Which buckets hold a graph, in least-recently-used order, and which were seen once.

    lazy: a bucket's first use runs eager (it may never come back), the second captures, later
    uses replay. eager: a batch replays the smallest bucket captured at start that holds it, else
    runs eager.
    off: always eager. At most `max_graphs` graphs live; capturing past that evicts the least
    recently used one.
    """

    mode: GraphMode = "lazy"
    max_graphs: int = 64
    max_tokens: int = 16384
    _graphs: OrderedDict[GraphKey, None] = field(default_factory=OrderedDict)
    _seen: set[GraphKey] = field(default_factory=set)
    _failed: set[GraphKey] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.max_graphs < 0:
            raise ValueError("max_graphs must not be negative")

    def decide(self, key: GraphKey) -> Decision:
        """What to do for a batch in bucket `key`; records the use."""
        if key in self._graphs:
            self._graphs.move_to_end(key)
            return Decision(Action.REPLAY, key)
        if self.mode == "eager":
            fits = [
                k for k in self._graphs if k.tokens >= key.tokens and k.sequences >= key.sequences
            ]
            if fits:
                best = min(fits)
                self._graphs.move_to_end(best)
                return Decision(Action.REPLAY, best)
        if (
            self.mode != "lazy"
            or self.max_graphs == 0
            or key.tokens > self.max_tokens
            or key in self._failed
        ):
            return Decision(Action.EAGER)
        if key not in self._seen:
            self._seen.add(key)
            return Decision(Action.EAGER)
        return self._admit(key)

    def preload(self, key: GraphKey) -> Decision:
        """Capture `key` at start (eager mode), evicting as the bound requires."""
        if key in self._graphs:
            return Decision(Action.REPLAY, key)
        return self._admit(key)

    def _admit(self, key: GraphKey) -> Decision:
        evict: list[GraphKey] = []
        while len(self._graphs) >= self.max_graphs:
            old, _ = self._graphs.popitem(last=False)
            evict.append(old)
        self._graphs[key] = None
        self._seen.discard(key)
        return Decision(Action.CAPTURE, key, tuple(evict))

    def forget(self, key: GraphKey) -> None:
        """A capture failed: run this bucket eager from now on."""
        self._graphs.pop(key, None)
        self._failed.add(key)

    @property
    def live(self) -> list[GraphKey]:
        """Captured buckets, least recently used first."""
        return list(self._graphs)

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
from collections.abc import Sequence
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


TokenScheme = Literal["geometric", "linear"]
TOKEN_SCHEMES: tuple[TokenScheme, ...] = get_args(TokenScheme)
SequenceScheme = Literal["fixed", "pow2"]
SEQUENCE_SCHEMES: tuple[SequenceScheme, ...] = get_args(SequenceScheme)


@dataclass(frozen=True, slots=True)
class BucketPolicy:
    """How a batch's (total tokens, sequences, longest sequence) maps to a graph's shape.

    Token buckets, `geometric` (the default; docs/cuda-graphs.md has the simulation that chose
    it): `per_octave` buckets per doubling from `token_step` up, so padding stays under
    1/per_octave of a batch and 16k tokens need ~30 buckets. `linear`: multiples of `token_step`
    up to `token_switch`, then of `token_large_step` (~75 buckets to 16k).

    Attention length: a graph's varlen attention is launched for a fixed longest sequence, and
    its grid has a row of blocks per `attention / block` for every sequence slot, filled or not.
    The length is the batch's longest sequence rounded up to `attention_floor` x
    `attention_factor`^k (512, 2048, 8192, 32768), never above the bucket or the model's limit
    (`max_seqlen`): a 512-token model has one length per bucket, as before; a 32k-limit model's
    16k-token bucket of short sequences launches 4 rows of blocks per slot instead of 128.

    Sequence slots, `fixed` (the default): one slot count per token bucket and attention length,
    enough for any batch it can hold, so a token bucket is one graph per attention length; empty
    slots cost a few idle attention blocks. `pow2`: the count rounded up to a power of two (up to
    ten graphs per token bucket). Padding tokens go into extra sequences of at most the
    attention length, so no sequence is longer than the launch.
    """

    token_scheme: TokenScheme = "geometric"
    token_step: int = 64
    token_switch: int = 1024
    token_large_step: int = 256
    per_octave: int = 4
    sequence_scheme: SequenceScheme = "fixed"
    #: the batch's sequence limit (--max-batch-sequences)
    max_sequences: int = 512
    #: the longest sequence a batch may hold (the model's input limit)
    max_seqlen: int = 512
    #: the shortest attention length a bucket above it is launched with, and the step above it
    attention_floor: int = 512
    attention_factor: int = 4

    def __post_init__(self) -> None:
        if min(self.token_step, self.token_large_step, self.per_octave) <= 0:
            raise ValueError("bucket steps must be positive")
        if self.token_switch < 0 or min(self.max_sequences, self.max_seqlen) <= 0:
            raise ValueError("bucket limits must be positive")
        if self.attention_floor <= 0 or self.attention_factor < 2:
            raise ValueError("attention lengths must start positive and grow")
        if self.token_scheme not in TOKEN_SCHEMES:
            raise ValueError(f"token bucket scheme must be one of {list(TOKEN_SCHEMES)}")
        if self.sequence_scheme not in SEQUENCE_SCHEMES:
            raise ValueError(f"sequence bucket scheme must be one of {list(SEQUENCE_SCHEMES)}")

    def tokens(self, total: int) -> int:
        """Smallest bucket holding `total` tokens."""
        if self.token_scheme == "geometric":
            return _geometric(total, self.token_step, self.per_octave)
        if total <= self.token_switch:
            return max(self.token_step, _round_up(total, self.token_step))
        return _round_up(total, self.token_large_step)

    def token_buckets(self, up_to: int) -> list[int]:
        """Every token bucket up to the one that holds `up_to` tokens, smallest first."""
        out = [self.tokens(1)]
        while out[-1] < up_to:
            out.append(self.tokens(out[-1] + 1))
        return out

    def attention(self, tokens: int, longest: int) -> int:
        """The attention launch length of a `tokens` bucket whose longest real sequence has
        `longest` tokens."""
        cap = min(tokens, self.max_seqlen)
        length = self.attention_floor
        while length < longest and length < cap:
            length *= self.attention_factor
        return min(length, cap)

    def attentions(self, tokens: int) -> list[int]:
        """Every attention length a `tokens` bucket can be launched with, shortest first."""
        out = [self.attention(tokens, 1)]
        while out[-1] < min(tokens, self.max_seqlen):
            out.append(self.attention(tokens, out[-1] + 1))
        return out

    def pad_slots(self, pad: int, attention: int) -> int:
        """Sequences `pad` padding tokens take (each at most `attention` long)."""
        return -(-pad // attention)

    def sequences(self, count: int, tokens: int, total: int, attention: int) -> int:
        """Slots for `count` real sequences in a `tokens` bucket holding `total` real tokens."""
        need = count + self.pad_slots(max(0, tokens - total), attention)
        if self.sequence_scheme == "fixed":
            return max(need, self.fixed_slots(tokens, attention))
        return max(2, 1 << (need - 1).bit_length())

    def fixed_slots(self, tokens: int, attention: int) -> int:
        """`fixed`: enough for the most sequences a bucket can hold plus its padding."""
        return min(tokens, self.max_sequences) + self.pad_slots(tokens, attention)

    def key(self, total_tokens: int, sequences: int, longest: int) -> GraphKey:
        """The bucket of a batch of `sequences` sequences, `total_tokens` tokens in all, the
        longest `longest` tokens."""
        tokens = self.tokens(total_tokens)
        attention = self.attention(tokens, longest)
        return GraphKey(
            tokens, self.sequences(sequences, tokens, total_tokens, attention), attention
        )

    def keys_for(self, tokens: int) -> list[GraphKey]:
        """Every bucket of `tokens` tokens a batch can meet, shortest attention first (for
        capturing at start)."""
        out = []
        for attention in self.attentions(tokens):
            if self.sequence_scheme == "fixed":
                out.append(GraphKey(tokens, self.fixed_slots(tokens, attention), attention))
                continue
            top = self.sequences(min(tokens, self.max_sequences), tokens, 1, attention)
            slots = 2
            while slots <= top:
                out.append(GraphKey(tokens, slots, attention))
                slots *= 2
        return out

    def capacity(self, max_tokens: int) -> GraphKey:
        """The largest bucket a batch of up to `max_tokens` tokens can need: the static buffers.
        The shortest attention pads into the most slots."""
        tokens = self.tokens(max_tokens)
        attention = self.attention(tokens, 1)
        return GraphKey(tokens, self.sequences(self.max_sequences, tokens, 0, attention), attention)


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def _geometric(total: int, smallest: int, per_octave: int) -> int:
    if total <= smallest:
        return smallest
    octave = smallest
    while octave * 2 < total:
        octave *= 2
    # Buckets in (octave, 2 * octave]: octave * (1 + i / per_octave), rounded up to 16 tokens.
    step = octave / per_octave
    i = -(-(total - octave) // step)
    return min(2 * octave, _round_up(int(octave + i * step), 16))


@dataclass(frozen=True, slots=True, order=True)
class GraphKey:
    tokens: int
    sequences: int
    #: the attention's launch length (BucketPolicy.attention)
    attention: int


#: a batch's real (tokens, sequences, longest sequence)
Real = tuple[int, int, int]


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
    recently used one. A bucket beyond the runner's static buffers (`max_tokens`,
    `max_sequences`) is never captured, so no capture decision can fail for size after its
    evictions were decided.
    """

    mode: GraphMode = "lazy"
    max_graphs: int = 64
    max_tokens: int = 16384
    max_sequences: int = 1 << 30
    _graphs: OrderedDict[GraphKey, None] = field(default_factory=OrderedDict)
    _seen: set[GraphKey] = field(default_factory=set)
    _failed: set[GraphKey] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.max_graphs < 0:
            raise ValueError("max_graphs must not be negative")

    def fits(self, key: GraphKey) -> bool:
        """Whether the runner's static buffers hold `key`."""
        return key.tokens <= self.max_tokens and key.sequences <= self.max_sequences

    def holds(self, bucket: GraphKey, key: GraphKey, real: Real | None = None) -> bool:
        """Whether a batch bucketed as `key`, of `real` (tokens, sequences, longest) when known,
        can be padded into the larger `bucket`: its longest sequence within the bucket's
        attention length, its sequences and the padding (cut at that length) within its slots."""
        tokens, count, longest = real or (key.tokens, key.sequences, key.attention)
        if bucket.tokens < key.tokens or bucket.attention < longest:
            return False
        return bucket.sequences >= count + -(-(bucket.tokens - tokens) // bucket.attention)

    def decide(self, key: GraphKey, real: Real | None = None) -> Decision:
        """What to do for a batch in bucket `key` holding `real` (tokens, sequences, longest);
        records the use."""
        if key in self._graphs:
            self._graphs.move_to_end(key)
            return Decision(Action.REPLAY, key)
        if self.mode == "eager":
            fits = [k for k in self._graphs if self.holds(k, key, real)]
            if fits:
                best = min(fits)
                self._graphs.move_to_end(best)
                return Decision(Action.REPLAY, best)
        if self.mode != "lazy" or self.max_graphs == 0 or not self.fits(key) or key in self._failed:
            return Decision(Action.EAGER)
        if key not in self._seen:
            self._seen.add(key)
            return Decision(Action.EAGER)
        return self._admit(key)

    def preload(self, key: GraphKey) -> Decision:
        """Capture `key` at start (eager mode, or lazy pre-capture), evicting as the bound
        requires; EAGER when it does not fit or failed before."""
        if key in self._graphs:
            return Decision(Action.REPLAY, key)
        if self.max_graphs == 0 or not self.fits(key) or key in self._failed:
            return Decision(Action.EAGER)
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
        """A capture failed or its replay disagreed with eager: run this bucket eager from now
        on."""
        self._graphs.pop(key, None)
        self._failed.add(key)

    @property
    def live(self) -> list[GraphKey]:
        """Captured buckets, least recently used first."""
        return list(self._graphs)

    def __len__(self) -> int:
        """Captured buckets (one atomic read: the metrics thread asks while the engine's
        thread decides)."""
        return len(self._graphs)

    @property
    def failed(self) -> list[GraphKey]:
        """Buckets that will never be captured again."""
        return sorted(self._failed)


def lone_keys(policy: BucketPolicy, max_input_tokens: int) -> list[GraphKey]:
    """Pure: the bucket of every lone request (one sequence of 1 to `max_input_tokens` tokens),
    shortest first: the graphs a batch-1 client meets, one per token bucket and attention length
    (13 for a 512-token BERT, ~40 for a 32k-limit model)."""
    keys = {policy.key(n, 1, n) for n in range(1, max(1, max_input_tokens) + 1)}
    return sorted(keys)


def warmup_plan(
    policy: BucketPolicy,
    token_buckets: Sequence[int],
    max_graphs: int,
    lone: Sequence[GraphKey] = (),
) -> list[GraphKey]:
    """The graphs to capture before a worker serves, in capture order, at most `max_graphs`.

    First every token bucket of `token_buckets` at its shortest attention length (the launch of
    the short sequences every fleet's traffic holds), then the longer attention lengths; each
    round largest first. Largest first because the first capture sizes the one memory pool all
    graphs share and the smaller ones then fit in it, and because a start-up budget that runs out
    leaves uncaptured the small buckets, whose lazy first uses cost the least.

    `lone` (`lone_keys`) go right after the first, pool-sizing graph: a lone request is where a
    capture is paid by one client alone (a lazy bucket's second use captures on the request's
    path), so they are never the ones a budget or `max_graphs` leaves out.
    """
    rounds: list[list[GraphKey]] = [[], []]
    for tokens in sorted(set(token_buckets), reverse=True):
        keys = policy.keys_for(tokens)
        shortest = keys[0].attention
        rounds[0] += sorted((k for k in keys if k.attention == shortest), reverse=True)
        rounds[1] += sorted((k for k in keys if k.attention != shortest), reverse=True)
    ordered = rounds[0][:1] + list(lone) + rounds[0][1:] + rounds[1]
    return list(dict.fromkeys(ordered))[: max(0, max_graphs)]


@dataclass(frozen=True, slots=True)
class GraphsPlan:
    enabled: bool
    #: why graphs are off ("" when on, or when they do not apply: CPU, mode off)
    reason: str = ""
    #: the operator asked for graphs the device cannot run: refuse to start
    refuse: bool = False
    #: worth an error log line (lazy mode on CUDA silently losing its graphs)
    warn: bool = False


def graphs_plan(
    device_type: str, mode: GraphMode, backend: str, graph_safe: bool, needs: str = ""
) -> GraphsPlan:
    """Whether this engine captures graphs, and what to say when it cannot.

    `eager` mode was asked for explicitly, so an attention backend that cannot be captured
    (grouped SDPA: no flash-attn and a torch without varlen attention, or float32; or a model
    whose attention `needs` what no graph-safe backend offers, MPNet's position bias) refuses to
    start instead of quietly running every batch eager; `lazy` runs eager but says so at error
    level and in the engine info metric.
    """
    if device_type != "cuda" or mode == "off":
        return GraphsPlan(False)
    if graph_safe:
        return GraphsPlan(True)
    why = (
        f"no graph-safe backend offers this model's attention {needs}"
        if needs
        else "varlen attention needs flash-attn or torch's varlen_attn, and float16/bfloat16"
    )
    reason = f"attention backend {backend} cannot be captured in a CUDA graph ({why})"
    return GraphsPlan(False, reason, refuse=mode == "eager", warn=mode == "lazy")

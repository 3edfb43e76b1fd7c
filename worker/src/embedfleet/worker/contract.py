"""The engine contract the worker server is written against.

The server's scheduler forms a batch of work items (one per RPC, in arrival order) and hands it to
`Engine.step`, which packs every sequence of every item into one ragged batch, launches it and
returns at once with a `Pending` handle. The server may prepare and launch the next batch before
calling `Pending.wait()` on this one. Implementations: the PyTorch engine and a null engine (for
measuring the harness alone).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from embedfleet.common.arrays import FloatArray
from embedfleet.common.codec import Tokens
from embedfleet.common.modeldir import Activation, ModelDir, Pooling, Task


class UnservableError(ValueError):
    """Settings this machine cannot serve the model with (a device it lacks, a runtime not
    installed, an attention backend that cannot run it). The worker says so in one line and
    exits, without a traceback: restarting it changes nothing."""


class InvalidInputError(ValueError):
    """A request the model cannot take (empty, too long, id outside the vocabulary).

    The server maps it to gRPC INVALID_ARGUMENT; the engine stays usable afterwards.
    """


#: a hybrid model's outputs, as HybridEmbed's flags name them
HybridOutput = Literal["dense", "sparse", "multi_vector"]
HYBRID_OUTPUTS: tuple[HybridOutput, ...] = ("dense", "sparse", "multi_vector")
#: what an Embed call asks a hybrid model for
DENSE: frozenset[HybridOutput] = frozenset({"dense"})


@dataclass(frozen=True, slots=True)
class Options:
    """Per-request output options; `None` means the model's default."""

    pooling: Pooling | None = None
    normalize: bool | None = None
    #: Matryoshka truncation, applied before normalizing; 0 keeps the full dimension
    dimensions: int = 0
    #: score and classify: apply the head's activation (sigmoid for one logit, else
    #: `EngineInfo.activation`) to the raw logits
    activate: bool = False
    #: hybrid: the outputs computed and returned (`hybrid_parts`); an Embed call's is DENSE,
    #: its rows as an embedder's, with the options above
    outputs: frozenset[HybridOutput] = DENSE


@dataclass(frozen=True, slots=True)
class WorkItem:
    tokens: Tokens
    options: Options = Options()

    @property
    def total_tokens(self) -> int:
        return self.tokens.total


@dataclass(frozen=True, slots=True)
class EngineInfo:
    model_name: str
    task: Task
    #: embed and hybrid: the (dense) vector size; score: 1; classify: the label count; sparse: the
    #: vocabulary size; multivector: each token vector's size
    dimensions: int
    max_input_tokens: int
    vocab_size: int
    dtype: str
    device: str
    default_pooling: Pooling
    default_normalize: bool
    #: classify: how `Options.activate` turns logits into scores
    activation: Activation = "sigmoid"
    #: multivector and hybrid: the leading tokens of each sequence that get no vector (bge-m3: 1,
    #: its CLS)
    skip_tokens: int = 0
    #: hybrid: each per-token vector's size
    token_dimensions: int = 0


def check_tokens(tokens: Tokens, max_tokens: int, vocab_size: int, type_vocab_size: int) -> None:
    """The input checks every engine makes, one reduction each: not empty, no empty sequence,
    none past the length limit, ids inside the vocabulary and segment ids inside the model's."""
    if tokens.count == 0:
        raise InvalidInputError("no sequences to run")
    lengths = tokens.lengths
    if int(lengths.min()) <= 0:
        raise InvalidInputError(f"sequence {int(np.argmin(lengths))} is empty")
    longest = int(lengths.max())
    if longest > max_tokens:
        raise InvalidInputError(
            f"sequence of {longest} tokens exceeds the limit of {max_tokens} tokens"
        )
    ids = tokens.ids
    # Read unsigned, a negative id is past any vocabulary: one reduction instead of two.
    if ids.size and int(ids.view(np.uint32).max()) >= vocab_size:
        raise InvalidInputError(f"token id outside the vocabulary [0, {vocab_size})")
    types = tokens.type_ids
    if types is not None and types.size and int(types.max()) >= type_vocab_size:
        raise InvalidInputError(f"token type id outside [0, {type_vocab_size}) for this model")


def output_dimensions(model: ModelDir) -> int:
    """Columns of a result row for the model's task (see `EngineInfo.dimensions`)."""
    if model.task in ("embed", "hybrid"):
        return model.embedding_size
    if model.task == "classify":
        return len(model.labels)
    if model.task == "sparse":
        return model.vocab_size
    if model.multivector is not None:
        return model.multivector.layer.out_features
    return 1


def hybrid_parts(
    flat: FloatArray, count: int, model: EngineInfo, outputs: frozenset[HybridOutput]
) -> dict[HybridOutput, FloatArray]:
    """A hybrid model's result for one item of `count` sequences that asked for `outputs` (one
    flat row, the engine's `outputs.hybrid_rows`) back as each output asked for: dense
    [n, D] (the model's full width: HybridEmbed asks no truncation), lexical [n, vocab], per-token
    vectors [k, D'], laid out in that order."""
    widths: dict[HybridOutput, int] = {
        "dense": count * model.dimensions,
        "sparse": count * model.vocab_size,
        "multi_vector": flat.size,  # the rest
    }
    columns = {"dense": model.dimensions, "sparse": model.vocab_size}
    parts: dict[HybridOutput, FloatArray] = {}
    at = 0
    for name in HYBRID_OUTPUTS:
        if name in outputs:
            part = flat[at : at + widths[name]]
            parts[name] = part.reshape(-1, columns.get(name, model.token_dimensions))
            at += part.size
    return parts


@dataclass(frozen=True, slots=True)
class GraphCounters:
    captures: int = 0
    replays: int = 0
    eager_runs: int = 0
    capture_seconds: float = 0.0
    #: device memory held by the graphs' shared memory pool
    graph_pool_bytes: int = 0
    #: new graphs whose check replay disagreed with eager: never served, the bucket runs eager
    rejects: int = 0
    live_graphs: int = 0
    #: whether this engine captures CUDA graphs at all
    graphs_enabled: bool = False
    #: the attention backend in use ("" for engines without one)
    attention: str = ""
    #: how the encoder runs: eager, inductor or openvino ("" for engines without one)
    runtime: str = ""
    #: why CUDA graphs are off on a device that could run them ("" when on, or not applicable)
    graphs_off_reason: str = ""


@dataclass(frozen=True, slots=True)
class GraphWarmup:
    """What an engine's pre-capture at start did. An engine that captures graphs offers
    `warm_graphs(budget_seconds) -> GraphWarmup`; the worker calls it, when present, before it
    serves (an engine without graphs has no such method)."""

    planned: int = 0
    captured: int = 0
    live: int = 0
    seconds: float = 0.0
    #: every capture's time so far (the metric's value)
    capture_seconds: float = 0.0
    #: device memory held by the graphs' shared memory pool
    pool_bytes: int = 0


class Pending(Protocol):
    def ready(self) -> bool:
        """True once results can be read without blocking."""
        ...

    def wait(self) -> list[FloatArray]:
        """One array per work item, in order: [count] for score, [vectors, dimensions] for
        multivector (every sequence's token vectors, in order), else [count, dimensions]."""
        ...


#: an engine's own stages of one batch, as (name, nanoseconds) pairs: e.g. ("pack", ...),
#: ("forward", ...), ("pool", ...). A `Pending` may carry them as `stages`; the batch runner
#: exports each as embedfleet_worker_stage_seconds{stage=name} (an engine reporting none has none).
StageTimes = tuple[tuple[str, int], ...]


class Done:
    """A `Pending` computed synchronously (the CPU path, the null engine): complete on return."""

    __slots__ = ("_results", "stages")

    def __init__(self, results: list[FloatArray], stages: StageTimes = ()) -> None:
        self._results = results
        self.stages = stages

    def ready(self) -> bool:
        return True

    def wait(self) -> list[FloatArray]:
        return self._results


class Engine(Protocol):
    @property
    def info(self) -> EngineInfo: ...

    def validate(self, item: WorkItem) -> None:
        """Raise InvalidInputError if `item` can't run; cheap, called at admission."""
        ...

    def step(self, items: Sequence[WorkItem]) -> Pending:
        """Pack, launch and return at once; items were validated. Called from one thread only."""
        ...

    def counters(self) -> GraphCounters: ...

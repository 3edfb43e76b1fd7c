"""An engine that computes nothing: for measuring the server harness alone (`--engine null`).

It validates exactly like a real engine (same limits, same vocabulary) and answers with cheap
vectors derived from the token ids, so a reply can still be matched to its request in tests. With a
pace (`--null-tokens-per-second`) each batch takes as long as a real engine of that speed would,
asleep: stress tests get a worker whose capacity is known and unaffected by a busy machine.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from embedfleet.common.arrays import FloatArray
from embedfleet.common.codec import Tokens
from embedfleet.common.modeldir import ModelDir
from embedfleet.worker.contract import (
    Done,
    EngineInfo,
    GraphCounters,
    InvalidInputError,
    Pending,
    UnservableError,
    WorkItem,
    check_tokens,
    output_dimensions,
)


class NullEngine:
    """Row i of an embed result is [length, sum of ids, first id, 0, ...] (scores: the length;
    multivector: a row a token with a vector, [its id, its position, 0, ...])."""

    def __init__(self, info: EngineInfo, tokens_per_second: float = 0.0) -> None:
        if info.task == "hybrid":
            # Its results are three outputs in one flat row (contract.hybrid_parts): the harness
            # measures the single-output tasks.
            raise UnservableError("the null engine does not serve task hybrid")
        self._info = info
        self._runs = 0
        self._tokens_per_second = tokens_per_second

    @classmethod
    def from_model_dir(
        cls, model: ModelDir, max_input_tokens: int | None = None, tokens_per_second: float = 0.0
    ) -> NullEngine:
        return cls(
            EngineInfo(
                model_name=model.name,
                task=model.task,
                dimensions=output_dimensions(model),
                max_input_tokens=model.max_input_tokens(max_input_tokens),
                vocab_size=model.vocab_size,
                dtype="none",
                device="null",
                default_pooling=model.pooling,
                default_normalize=model.normalize,
                activation=model.activation,
                skip_tokens=model.multivector.skip if model.multivector else 0,
            ),
            tokens_per_second,
        )

    @property
    def info(self) -> EngineInfo:
        return self._info

    def validate(self, item: WorkItem) -> None:
        # Segment ids 0 and 1: the BERT-style type vocabulary every packaged model has.
        check_tokens(item.tokens, self._info.max_input_tokens, self._info.vocab_size, 2)
        dims = item.options.dimensions
        if dims > self._info.dimensions:
            raise InvalidInputError(
                f"dimensions {dims} exceeds the model's {self._info.dimensions}"
            )

    def step(self, items: Sequence[WorkItem]) -> Pending:
        self._runs += 1
        if self._tokens_per_second > 0:
            # The engine thread's time, as a real forward's would be; the GIL is free meanwhile.
            time.sleep(sum(item.total_tokens for item in items) / self._tokens_per_second)
        return Done([self._result(item) for item in items])

    def _result(self, item: WorkItem) -> FloatArray:
        tokens = item.tokens
        if self._info.task == "score":
            return tokens.lengths.astype(np.float32)
        if self._info.task == "multivector":
            return _token_rows(tokens, self._info)
        dims = item.options.dimensions or self._info.dimensions
        out = np.zeros((tokens.count, dims), dtype=np.float32)
        starts = np.concatenate(([0], np.cumsum(tokens.lengths)[:-1]))
        out[:, 0] = tokens.lengths
        if dims > 1:
            out[:, 1] = np.add.reduceat(tokens.ids.astype(np.float64), starts)
        if dims > 2:
            out[:, 2] = tokens.ids[starts]
        return out

    def counters(self) -> GraphCounters:
        return GraphCounters(eager_runs=self._runs)


def _token_rows(tokens: Tokens, info: EngineInfo) -> FloatArray:
    """[id, position in its sequence, 0, ...] of each token past the first `skip_tokens`."""
    lengths = tokens.lengths.astype(np.int64)
    place = np.arange(tokens.total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    kept = place >= info.skip_tokens
    out = np.zeros((int(kept.sum()), info.dimensions), dtype=np.float32)
    out[:, 0] = tokens.ids[kept]
    if info.dimensions > 1:
        out[:, 1] = place[kept]
    return out

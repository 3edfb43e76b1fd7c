"""Cutting a request into token-budget chunks, and putting the answers back in input order.

Pure functions: the dispatcher decides nothing about chunk boundaries itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from embedfleet.common.arrays import FloatArray


@dataclass(frozen=True, slots=True)
class Chunk:
    """Inputs [start, stop) of the request, holding `tokens` tokens."""

    start: int
    stop: int
    tokens: int


def chunk_budget(total_tokens: int, workers: int, max_tokens: int, min_tokens: int) -> int:
    """Tokens per chunk: spread the request over every worker, within [min_tokens, max_tokens].

    Below `min_tokens` the per-call overhead outweighs the parallelism: small requests stay whole.
    """
    spread = math.ceil(total_tokens / max(1, workers))
    return max(1, min(max_tokens, max(min_tokens, spread)))


def paced_chunk_tokens(
    max_tokens: int, worker_tokens_per_second: float, seconds: float, min_tokens: int
) -> int:
    """The most tokens one chunk carries: `max_tokens`, or `seconds` of one worker's work at its
    measured speed when that is less (never below `min_tokens`). A chunk is work that no other
    worker can take over: at the end of a burst on a slow CPU fleet, one worker still computing an
    8,192-token chunk (7.6 s at the 1,074 tokens/s a shared CPU gave it) idled the others for
    most of that. Unknown speed (0) or no bound (`seconds` 0) keeps `max_tokens`."""
    if worker_tokens_per_second <= 0 or seconds <= 0:
        return max_tokens
    return max(1, min(max_tokens, max(min_tokens, int(worker_tokens_per_second * seconds))))


def plan(lengths: Sequence[int], budget: int, max_sequences: int) -> list[Chunk]:
    """Contiguous chunks of at most `budget` tokens and `max_sequences` inputs, in order.

    An input longer than the budget travels alone (the caller has already capped input length).
    """
    chunks: list[Chunk] = []
    start = 0
    tokens = 0
    for i, n in enumerate(lengths):
        if i > start and (tokens + n > budget or i - start >= max_sequences):
            chunks.append(Chunk(start, i, tokens))
            start, tokens = i, 0
        tokens += n
    if len(lengths) > start:
        chunks.append(Chunk(start, len(lengths), tokens))
    return chunks


def join(parts: Sequence[FloatArray]) -> FloatArray:
    """Chunk results (in chunk order) as one array in input order."""
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts, axis=0)

"""Fixed probe inputs and the agreement measures the dtype choice compares two runs with."""

from __future__ import annotations

import numpy as np

from embedfleet.common.arrays import FloatArray
from embedfleet.common.codec import Tokens
from embedfleet.common.modeldir import ModelDir
from embedfleet.common.similarity import min_cosine
from embedfleet.worker.contract import WorkItem

PROBE_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings map text to vectors so that similar meanings land close together.",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France, on the Seine.",
)


#: the longest probe sequence: a decoder's window (32k tokens for e5-mistral) probed in full
#: took a CPU start-up minutes of attention, for a dtype check that 512 tokens already makes
PROBE_MAX_TOKENS = 512


def probe_token_ids(model_dir: ModelDir, max_tokens: int) -> list[list[int]]:
    """Probe sequences from short to `max_tokens` (at most PROBE_MAX_TOKENS) long; seeded random
    ids without a tokenizer."""
    max_tokens = min(max_tokens, PROBE_MAX_TOKENS)
    vocab = int(model_dir.config["vocab_size"])
    if (model_dir.path / "tokenizer.json").is_file():
        tok = model_dir.tokenizer()
        seqs = [list(tok.encode(t).ids) for t in PROBE_TEXTS]
        long = tok.encode(" ".join(PROBE_TEXTS * (max_tokens // 8 + 1))).ids
        seqs.append(list(long[:max_tokens]))
        seqs.append(list(long[: max(1, max_tokens // 3)]))
        return [s[:max_tokens] for s in seqs if s]
    rng = np.random.default_rng(0)
    lengths = sorted({1, 7, min(33, max_tokens), min(128, max_tokens), max_tokens})
    return [rng.integers(0, vocab, n).tolist() for n in lengths]


def probe_items(model_dir: ModelDir, max_tokens: int) -> list[WorkItem]:
    """One work item per probe sequence, so each runs alone (no batching effects)."""
    items = []
    for ids in probe_token_ids(model_dir, max_tokens):
        tokens = Tokens(np.asarray(ids, np.int32), np.array([len(ids)], np.int32))
        items.append(WorkItem(tokens))
    return items


def agreement(fast: list[FloatArray], slow: list[FloatArray], task: str) -> tuple[float, float]:
    """(min cosine over rows, max absolute difference) between two runs of the same inputs."""
    a = np.concatenate([np.atleast_1d(x).astype(np.float64) for x in fast])
    b = np.concatenate([np.atleast_1d(x).astype(np.float64) for x in slow])
    diff = float(np.abs(a - b).max()) if a.size else 0.0
    if task in ("score", "classify") or a.ndim == 1:
        return 1.0, diff
    return min_cosine(a, b), 0.0

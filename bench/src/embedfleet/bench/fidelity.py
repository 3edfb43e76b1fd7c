"""Every system's outputs against the `transformers` reference on the same inputs.

The reference is plain `transformers` in float32: BertModel, mean pooling over the attention mask,
L2 normalization (the model's sentence-transformers modules), one text at a time so no padding is
involved. A system drifts when any cosine falls below 1 - 0.1%.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from embedfleet.bench.targets import Target, cosine_scores
from embedfleet.common.arrays import FloatArray
from embedfleet.common.similarity import min_cosine

DRIFT_LIMIT = 0.001


@dataclass(frozen=True)
class Reference:
    texts: list[str]
    vectors: FloatArray
    query: str
    documents: list[str]
    scores: FloatArray


@dataclass(frozen=True)
class Fidelity:
    min_cosine: float
    max_score_error: float
    inputs: int

    @property
    def drift(self) -> float:
        return 1.0 - self.min_cosine

    @property
    def flagged(self) -> bool:
        return not self.drift <= DRIFT_LIMIT  # NaN (no result) is flagged too


def reference(
    model_dir: Path, texts: Sequence[str], query: str, documents: Sequence[str]
) -> Reference:
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModel.from_pretrained(str(model_dir), torch_dtype=torch.float32).eval()

    def embed(items: Sequence[str]) -> FloatArray:
        rows = []
        with torch.inference_mode():
            for text in items:
                enc = tok(text, return_tensors="pt", truncation=False)
                hidden = model(**enc).last_hidden_state[0]
                mask = enc["attention_mask"][0].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(0) / mask.sum()
                rows.append(torch.nn.functional.normalize(pooled, dim=0).numpy())
        return np.stack(rows).astype(np.float32)

    vectors = embed(texts)
    scores = cosine_scores(embed([query, *documents]))
    return Reference(list(texts), vectors, query, list(documents), scores)


def compare(reference: FloatArray, got: FloatArray) -> float:
    """Pure: the smallest row-wise cosine between two [N, H] arrays; NaN when shapes differ."""
    if got.shape != reference.shape:
        return float("nan")
    return min_cosine(reference, got)


async def check(target: Target, ref: Reference) -> Fidelity:
    """One batch of every text (mixed lengths), then the first two one at a time, then scores."""
    batch = await target.embed_values(ref.texts)
    singles = [await target.embed_values([t]) for t in ref.texts[:2]]
    cosines = [compare(ref.vectors, batch)]
    cosines += [compare(ref.vectors[i : i + 1], v) for i, v in enumerate(singles)]
    min_cos = float(np.min(cosines))  # NaN (a wrong shape) wins, and is flagged
    scores = await target.score_values(ref.query, ref.documents)
    err = float("nan")
    if scores.shape == ref.scores.shape:
        err = float(np.max(np.abs(scores - ref.scores)))
    return Fidelity(min_cosine=min_cos, max_score_error=err, inputs=len(ref.texts) + 2)

"""Every system's outputs against the `transformers` reference on the same inputs.

The reference is plain `transformers` in float32: the model's `AutoModel`, the pooling its
sentence-transformers Pooling module names (cls, mean over the attention mask, last token or max;
mean without one), L2 normalization, one text at a time so no padding is involved. A system
drifts when any cosine falls below 1 - 0.1%.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_max_tokens": "max",
}


def pooling_mode(model_dir: Path) -> str:
    """The sentence-transformers Pooling module's mode (its `pooling_mode`, or the older flags);
    "mean" for a directory without one."""
    modules = model_dir / "modules.json"
    entries = json.loads(modules.read_text()) if modules.is_file() else []
    for entry in entries:
        if str(entry.get("type", "")).endswith("Pooling"):
            config = json.loads((model_dir / entry["path"] / "config.json").read_text())
            if "pooling_mode" in config:
                return str(config["pooling_mode"])
            flags = [mode for key, mode in POOLING_FLAGS.items() if config.get(key)]
            if len(flags) != 1:
                raise ValueError(f"{model_dir}: pooling {flags} has no reference here")
            return flags[0]
    return "mean"


def pool(hidden: Any, mask: Any, mode: str) -> Any:
    """[H] of one sequence's [T, H] states, `mask` [T] its attention mask."""
    real = hidden[mask.bool()]
    if mode == "cls":
        return real[0]
    if mode == "lasttoken":
        return real[-1]
    if mode == "max":
        return real.max(dim=0).values
    if mode == "mean":
        return real.mean(dim=0)
    raise ValueError(f"pooling mode {mode!r} has no reference here")


def reference(
    model_dir: Path, texts: Sequence[str], query: str, documents: Sequence[str]
) -> Reference:
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModel.from_pretrained(str(model_dir), torch_dtype=torch.float32).eval()

    mode = pooling_mode(model_dir)

    def embed(items: Sequence[str]) -> FloatArray:
        rows = []
        with torch.inference_mode():
            for text in items:
                enc = tok(text, return_tensors="pt", truncation=False)
                hidden = model(**enc).last_hidden_state[0]
                pooled = pool(hidden, enc["attention_mask"][0], mode)
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

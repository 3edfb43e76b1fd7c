"""From one batch's forward outputs to each work item's rows, with its own options applied.

Pooling other than the default (then the model's Dense layers), Matryoshka truncation,
normalization (embedders, and a hybrid model's dense vectors) or the activation (scorers and
classifiers; sparse rows pass as they are), the hybrid heads an item asks for, and the slice of
the batch output each item reads back (a multivector item: its tokens' rows). Pure: the
forward's tensors are read, never written, so a graph's static outputs can be passed straight in.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from embedfleet.common.modeldir import Activation, Pooling
from embedfleet.worker.contract import EngineInfo, Options, WorkItem
from embedfleet.worker.engine.batch import DeviceBatch
from embedfleet.worker.engine.models.hybrid import Hybrid
from embedfleet.worker.engine.pending import Slice
from embedfleet.worker.engine.pooling import Pooler, finish


def apply_options(
    items: Sequence[WorkItem],
    hidden: torch.Tensor,
    head: torch.Tensor,
    batch: DeviceBatch,
    real_sequences: int,
    model: EngineInfo,
    pooler: Pooler,
    default: torch.Tensor | None = None,
    hybrid: Hybrid | None = None,
) -> tuple[torch.Tensor, list[Slice]]:
    """One [N, D] (or [N] scores) float32 tensor for all items' N real sequences, and each item's
    slice of it. `head` is the default head's output for every slot, `hidden` the [T, H] states
    other poolings read (through `pooler`'s Dense layers); `model` supplies the defaults that
    unset options fall back to. `default`: `default_rows(head)` when already computed (inside a
    CUDA graph), returned as it is when every item keeps the model's defaults. `hybrid`: a hybrid
    model's heads (`hybrid_rows`)."""
    if model.task == "score":
        return _scores(items, head[:real_sequences], "sigmoid")
    if model.task == "classify":
        return _scores(items, head[:real_sequences], model.activation)
    if model.task == "sparse":
        out = head[:real_sequences]
        return out, _slices(items, out.shape[1])
    if model.task == "multivector":
        return token_rows(items, head, model.skip_tokens)
    if model.task == "hybrid":
        assert hybrid is not None, "a hybrid model's rows need its heads"
        dense = None
        if any("dense" in it.options.outputs for it in items):
            dense = _embeddings(items, hidden, head, batch, real_sequences, model, pooler, default)
        return hybrid_rows(items, hidden, batch, dense, hybrid, model.skip_tokens)
    return _embeddings(items, hidden, head, batch, real_sequences, model, pooler, default)


def _embeddings(
    items: Sequence[WorkItem],
    hidden: torch.Tensor,
    head: torch.Tensor,
    batch: DeviceBatch,
    real_sequences: int,
    model: EngineInfo,
    pooler: Pooler,
    default: torch.Tensor | None,
) -> tuple[torch.Tensor, list[Slice]]:
    """`apply_options` for an embedder: each item's pooling, dimensions and normalization."""
    choices = [resolve(it.options, model) for it in items]
    if default is not None and set(choices) == {defaults(model)}:
        out = default[:real_sequences]
        return out, _slices(items, out.shape[1])
    pooled: dict[Pooling, torch.Tensor] = {model.default_pooling: head[:real_sequences]}

    def vectors(mode: Pooling) -> torch.Tensor:
        if mode not in pooled:
            pooled[mode] = pooler(hidden, batch, mode)[:real_sequences]
        return pooled[mode]

    if len(set(choices)) == 1:
        mode, dims, norm = choices[0]
        out = finish(vectors(mode), dims, norm).contiguous()
        return out, _slices(items, out.shape[1])
    out = torch.zeros((real_sequences, model.dimensions), dtype=torch.float32, device=head.device)
    slices: list[Slice] = []
    row = 0
    for it, (mode, dims, norm) in zip(items, choices, strict=True):
        span = slice(row, row + it.tokens.count)
        rows = finish(vectors(mode)[span], dims, norm)
        out[span, : rows.shape[1]] = rows
        slices.append(Slice(span.start, span.stop, rows.shape[1]))
        row = span.stop
    return out, slices


def defaults(model: EngineInfo) -> tuple[Pooling, int, bool]:
    """What `resolve` gives a request that sets no option."""
    return model.default_pooling, 0, model.default_normalize


def default_rows(head: torch.Tensor, model: EngineInfo) -> torch.Tensor:
    """Every slot's result under the model's default options, from the default head: the
    normalized vectors of an embedder (and a hybrid model's dense ones); a scorer's or
    classifier's raw logits and sparse rows as they are (their activation is a per-request
    option, off unless asked)."""
    if model.task not in ("embed", "hybrid"):
        return head
    return finish(head, 0, model.default_normalize)


def resolve(options: Options, model: EngineInfo) -> tuple[Pooling, int, bool]:
    """(pooling, dimensions to keep or 0 for all, normalize) with the model's defaults filled in."""
    dims = options.dimensions if 0 < options.dimensions < model.dimensions else 0
    return (
        options.pooling or model.default_pooling,
        dims,
        model.default_normalize if options.normalize is None else options.normalize,
    )


def activate(logits: torch.Tensor, activation: Activation) -> torch.Tensor:
    """Scores from logits ([N] or [N, labels]): softmax over the labels, sigmoid each, or none."""
    if activation == "softmax":
        return torch.softmax(logits, dim=-1)
    if activation == "sigmoid":
        return torch.sigmoid(logits)
    return logits


def _scores(
    items: Sequence[WorkItem], scores: torch.Tensor, activation: Activation
) -> tuple[torch.Tensor, list[Slice]]:
    if any(it.options.activate for it in items):
        scores = scores.clone()
        row = 0
        for it in items:
            if it.options.activate:
                span = slice(row, row + it.tokens.count)
                scores[span] = activate(scores[span], activation)
            row += it.tokens.count
    columns = scores.shape[1] if scores.dim() == 2 else 0
    return scores.contiguous(), _slices(items, columns)


def token_rows(
    items: Sequence[WorkItem], head: torch.Tensor, skip: int
) -> tuple[torch.Tensor, list[Slice]]:
    """The items' real tokens' rows of a per-token `head` [T, D], less the first `skip` tokens
    of each sequence, and each item's slice of them. The rows kept are known on the host from the
    lengths, so selecting them costs one index copy and no device sync."""
    lengths = np.concatenate([it.tokens.lengths for it in items]).astype(np.int64)
    real = int(lengths.sum())
    if skip == 0:
        out = head[:real]
    else:
        starts = np.cumsum(lengths) - lengths
        place = np.arange(real) - np.repeat(starts, lengths)
        keep = torch.from_numpy(np.flatnonzero(place >= skip))
        out = head.index_select(0, keep.to(head.device, non_blocking=True))
    slices: list[Slice] = []
    row = 0
    for it in items:
        kept = int(np.maximum(it.tokens.lengths.astype(np.int64) - skip, 0).sum())
        slices.append(Slice(row, row + kept, out.shape[1]))
        row += kept
    return out.contiguous(), slices


def hybrid_rows(
    items: Sequence[WorkItem],
    hidden: torch.Tensor,
    batch: DeviceBatch,
    dense: tuple[torch.Tensor, list[Slice]] | None,
    hybrid: Hybrid,
    skip: int,
) -> tuple[torch.Tensor, list[Slice]]:
    """A hybrid model's outputs cut per item: each item's slice is the outputs it asks for
    (`Options.outputs`), flattened in the order dense [n, d] (`dense`: the embedder's rows, with
    the item's options), lexical [n, vocab], its kept tokens' vectors [k, D'] (`token_rows`);
    `contract.hybrid_parts` undoes it. A head no item asks for is not run, and no output an item
    did not ask for is copied back."""
    asks = [it.options.outputs for it in items]
    lexical = None
    if any("sparse" in a for a in asks):
        lexical = hybrid.lexical.head(hidden, batch)
    vectors: torch.Tensor | None = None
    kept: list[Slice] = []
    if any("multi_vector" in a for a in asks):
        vectors, kept = token_rows(items, hybrid.colbert.head(hidden, batch), skip)
    parts: list[torch.Tensor] = []
    slices: list[Slice] = []
    row = at = 0
    for i, (it, wants) in enumerate(zip(items, asks, strict=True)):
        span = slice(row, row + it.tokens.count)
        mine: list[torch.Tensor] = []
        if dense is not None and "dense" in wants:
            rows, own = dense[0], dense[1][i]
            mine.append(rows[own.start : own.stop, : own.columns])
        if lexical is not None and "sparse" in wants:
            mine.append(lexical[span])
        if vectors is not None and "multi_vector" in wants:
            mine.append(vectors[kept[i].start : kept[i].stop])
        parts.extend(p.reshape(-1) for p in mine)
        size = sum(p.numel() for p in mine)
        slices.append(Slice(at, at + size, 0))
        row, at = span.stop, at + size
    if not parts:
        return hidden.new_zeros((0,), dtype=torch.float32), slices
    return torch.cat(parts), slices


def _slices(items: Sequence[WorkItem], columns: int) -> list[Slice]:
    out: list[Slice] = []
    row = 0
    for it in items:
        out.append(Slice(row, row + it.tokens.count, columns))
        row += it.tokens.count
    return out

"""Inputs longer than the model's limit, split into overlapping windows and averaged back.

Pure functions. A text's special tokens (e.g. BERT's [CLS] ... [SEP]) are kept at both ends of
every window, so each window is an input the model was trained on; token-id inputs carry none.
Windows start every `limit - specials - overlap` content tokens; the last one ends at the input's
end. Each window is embedded unnormalized and the input's vector is the mean of its windows
weighted by their tokens, normalized afterwards when the model normalizes (for a mean-pooling
model this is, overlap aside, the mean over all the input's tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from embedfleet.common.arrays import FloatArray


@dataclass(frozen=True, slots=True)
class Windows:
    """The windows of a request's inputs, in input order; `owner[i]` is window i's input."""

    ids: list[list[int]]
    owner: list[int]

    @property
    def weights(self) -> list[int]:
        return [len(w) for w in self.ids]


def special_ends(mask: Sequence[int]) -> tuple[int, int]:
    """How many special tokens (mask 1) lead and trail an encoding."""
    lead = 0
    while lead < len(mask) and mask[lead]:
        lead += 1
    trail = 0
    while trail < len(mask) - lead and mask[len(mask) - 1 - trail]:
        trail += 1
    return lead, trail


def windows_of(
    ids: Sequence[int], lead: int, trail: int, limit: int, overlap: int
) -> list[list[int]]:
    """One input's windows of at most `limit` tokens, each with the `lead` and `trail` special
    tokens of `ids` at its ends; an input within the limit is its own one window."""
    if len(ids) <= limit:
        return [list(ids)]
    head, tail = list(ids[:lead]), list(ids[len(ids) - trail :])
    content = ids[lead : len(ids) - trail]
    room = limit - lead - trail
    if room < 1:
        raise ValueError(f"a window of {limit} tokens cannot hold {lead + trail} special tokens")
    # At least half of each window is new content, whatever the overlap setting says.
    step = room - min(overlap, room // 2)
    out: list[list[int]] = []
    start = 0
    while True:
        stop = min(start + room, len(content))
        out.append(head + list(content[start:stop]) + tail)
        if stop == len(content):
            return out
        start += step


def split(
    ids: Sequence[Sequence[int]],
    ends: Sequence[tuple[int, int]],
    limit: int,
    overlap: int,
) -> Windows:
    """Every input's windows, flattened in input order."""
    flat: list[list[int]] = []
    owner: list[int] = []
    for i, (seq, (lead, trail)) in enumerate(zip(ids, ends, strict=True)):
        for w in windows_of(seq, lead, trail, limit, overlap):
            flat.append(w)
            owner.append(i)
    return Windows(flat, owner)


def merge(rows: FloatArray, windows: Windows, normalize: bool) -> FloatArray:
    """One row per input: the token-weighted mean of its windows' rows (then L2-normalized)."""
    owner = np.asarray(windows.owner)
    weights = np.asarray(windows.weights, dtype=np.float64)
    count = int(owner[-1]) + 1 if len(owner) else 0
    sums = np.zeros((count, rows.shape[1]), dtype=np.float64)
    np.add.at(sums, owner, rows.astype(np.float64) * weights[:, None])
    totals = np.bincount(owner, weights=weights, minlength=count)
    out = sums / totals[:, None]
    if normalize:
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    result: FloatArray = out.astype(np.float32)
    return result

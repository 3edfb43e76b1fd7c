"""One forward over a packed batch plus the model's default head, and its eager CPU-side use.

Shared by the engine (eager and graph-captured runs) and by the dtype choice, which runs the probe
through candidate models before any engine exists.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

from embedfleet.common.arrays import FloatArray
from embedfleet.common.codec import Tokens
from embedfleet.worker.engine.attention import AttentionBackend
from embedfleet.worker.engine.batch import DeviceBatch, pack, to_device
from embedfleet.worker.engine.models import Model
from embedfleet.worker.engine.models.hybrid import Hybrid
from embedfleet.worker.engine.pooling import Pooler


class Runtime(Protocol):
    """A compiled CPU encoder (runtime.py makes them); this module only needs its hidden states."""

    @property
    def name(self) -> str: ...

    def hidden(
        self,
        batch: DeviceBatch,
        lengths: npt.NDArray[np.int64],
        keys: npt.NDArray[np.int64] | None = None,
    ) -> torch.Tensor:
        """Packed hidden states [T, H] of the batch's tokens (`lengths`: the host's sequence
        lengths, zero for spare slots; `keys`: their key lengths, None when all are keys)."""
        ...


def forward(
    model: Model,
    backend: AttentionBackend,
    pooler: Pooler,
    batch: DeviceBatch,
    max_seqlen: int,
    lengths: npt.NDArray[np.int64],
    runtime: Runtime | None = None,
    keys: npt.NDArray[np.int64] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden [T, H], pooled [N, H] float32 or the model's head output) for every slot of `batch`:
    `encode`, then `default_head`."""
    hidden = encode(model, backend, batch, max_seqlen, lengths, runtime, keys)
    return hidden, default_head(model, pooler, hidden, batch)


def encode(
    model: Model,
    backend: AttentionBackend,
    batch: DeviceBatch,
    max_seqlen: int,
    lengths: npt.NDArray[np.int64],
    runtime: Runtime | None = None,
    keys: npt.NDArray[np.int64] | None = None,
) -> torch.Tensor:
    """The encoder's hidden states [T, H] for every token of `batch`.

    `lengths` are the host-side sequence lengths the attention plans with; graph captures pass
    none, as their plan may only read device tensors. With a compiled CPU `runtime` the encoder
    runs there (`backend` unused). `keys`: the slots' key lengths (HostBatch.keys), for a backend
    offering the `keys` feature or a runtime; None (every token a key) costs nothing.
    """
    if runtime is not None:
        return runtime.hidden(batch, lengths, keys)
    plan = backend.plan(batch.cu_seqlens, lengths, max_seqlen, model.shape.causal, keys)
    return model.forward(batch, plan)


def default_head(
    model: Model, pooler: Pooler, hidden: torch.Tensor, batch: DeviceBatch
) -> torch.Tensor:
    """The model's head over `hidden` (scores, logits, sparse rows) or, for an embedder, its
    default pooling and Dense layers [N, D] float32; always eager."""
    out = model.head(hidden, batch)
    return out if out is not None else pooler(hidden, batch)


def default_outputs(
    model: Model,
    backend: AttentionBackend,
    pooler: Pooler,
    tokens: Tokens,
    device: torch.device,
    runtime: Runtime | None = None,
) -> FloatArray:
    """The default head's float32 rows for `tokens` (a row a sequence, or a token for a
    multivector head), synchronous (the encoder eager, or in `runtime`)."""
    with torch.inference_mode():
        host = pack([tokens], model.shape.position_offset)
        batch = to_device(host, device)
        hidden, head = forward(
            model, backend, pooler, batch, int(host.lengths.max()), host.lengths, runtime
        )
        if isinstance(model, Hybrid):
            # Its per-token vectors: every token's state through a head, the closest check.
            head = model.colbert.head(hidden, batch)
        # A multivector head has a row a token (the batch is unpadded: every token is real),
        # so the dtype probe compares every token's vector, not only the first few.
        per_token = head.shape[0] == host.total_tokens
        real = host.real_tokens if per_token else host.real_sequences
        rows: FloatArray = head[:real].float().cpu().numpy()
        return rows

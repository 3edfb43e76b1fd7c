"""Capturing and replaying the whole forward as one CUDA graph per shape bucket.

Inputs live in one static byte buffer sized for the largest bucket; a bucket's graph reads the
packed views of its leading bytes (`staging.packed_views`), so loading a batch is one contiguous
host-to-device copy from a reused pinned staging buffer into a fixed address. Outputs too: every
graph ends by copying its outputs (hidden states, the default head, the rows a request with the
model's default options gets) into shared static buffers, so a live graph keeps no [T, H] tensor
of its own (64 of those were GBs), only its share of the one memory pool all graphs use. The
outputs of a replay are valid until the next replay, which is stream-ordered after every read of
them. Which bucket to capture, replay or evict is `graph_policy.GraphCache`'s decision.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from embedfleet.worker.engine.batch import DeviceBatch, HostBatch, from_tensors
from embedfleet.worker.engine.graph_policy import GraphKey
from embedfleet.worker.engine.staging import Staging, packed_bytes, packed_views

#: the captured body: (batch views, the attention's launch length) -> (hidden [T, ...], then
#: per-slot outputs [N, ...]: the default head, the default rows)
Body = Callable[[DeviceBatch, int], tuple[torch.Tensor, ...]]

#: a captured replay must agree with its eager run at least this well (the issue's 0.1% cosine)
MIN_AGREEMENT = 0.999


def agreement(replay: torch.Tensor, eager: torch.Tensor) -> float:
    """How well a replay's head matches the eager run of the same batch: the smallest row
    cosine for vectors, 1 - the largest error relative to the scores' scale for scores."""
    a, b = replay.detach().double().cpu(), eager.detach().double().cpu()
    if a.shape != b.shape:
        return 0.0
    if not bool(torch.isfinite(a).all()):
        return 0.0
    if a.ndim == 1:
        scale = max(1.0, float(b.abs().max()) if b.numel() else 1.0)
        return 1.0 - float((a - b).abs().max()) / scale if a.numel() else 1.0
    if a.shape[0] == 0:
        return 1.0
    cos = torch.nn.functional.cosine_similarity(a, b, dim=1, eps=1e-12)
    # Two zero rows agree.
    both_zero = (a.norm(dim=1) == 0) & (b.norm(dim=1) == 0)
    cos = torch.where(both_zero, torch.ones_like(cos), cos)
    return float(cos.min())


class GraphRunner:
    def __init__(
        self, body: Body, device: torch.device, max_tokens: int, max_sequences: int
    ) -> None:
        self._body = body
        self._device = device
        self._max_tokens, self._max_sequences = max_tokens, max_sequences
        self._inputs = torch.zeros(
            packed_bytes(max_tokens, max_sequences), dtype=torch.uint8, device=device
        )
        self._staging = Staging(max_tokens, max_sequences, pin=True)
        self._pool = torch.cuda.graph_pool_handle()
        self._graphs: dict[GraphKey, torch.cuda.CUDAGraph] = {}
        self._outputs: list[torch.Tensor] = []
        self.capture_seconds = 0.0
        #: device memory the graphs' shared pool holds (read after each capture and eviction)
        self.pool_bytes = 0

    def fits(self, key: GraphKey) -> bool:
        return key.tokens <= self._max_tokens and key.sequences <= self._max_sequences

    def load(self, host: HostBatch) -> DeviceBatch:
        """Copy a bucket-padded batch into the static inputs; returns the views a graph reads."""
        t, n = host.total_tokens, host.sequences
        staged = self._staging.stage(host)
        self._inputs[: staged.shape[0]].copy_(staged, non_blocking=True)
        self._staging.copied()
        return from_tensors(*packed_views(self._inputs, t, n))

    def _outputs_for(self, outputs: tuple[torch.Tensor, ...]) -> None:
        """The shared output buffers, allocated (outside the graph pool) on the first capture:
        the first output per token, the others per sequence slot."""
        if not self._outputs:
            rows = (self._max_tokens, *[self._max_sequences] * (len(outputs) - 1))
            self._outputs = [
                o.new_empty((r, *o.shape[1:])) for r, o in zip(rows, outputs, strict=True)
            ]

    def capture(
        self, key: GraphKey, views: DeviceBatch, attention_len: int
    ) -> tuple[torch.Tensor, ...]:
        """Warm up on a side stream, capture, then replay once for this batch's results."""
        start = time.perf_counter()
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._outputs_for(self._body(views, attention_len))
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = self._body(views, attention_len)
            for static, out in zip(self._outputs, outputs, strict=True):
                static[: out.shape[0]].copy_(out)
            del outputs  # freed into the pool: later captures reuse the memory
        self._graphs[key] = graph
        torch.cuda.synchronize()
        self.capture_seconds += time.perf_counter() - start
        self.pool_bytes = self._pool_bytes()
        return self.replay(key)

    def replay(self, key: GraphKey) -> tuple[torch.Tensor, ...]:
        self._graphs[key].replay()
        hidden, *per_slot = self._outputs
        return (hidden[: key.tokens], *(o[: key.sequences] for o in per_slot))

    def evict(self, key: GraphKey) -> None:
        """Drop `key`'s graph. Its memory stays in the shared pool, reused by later captures,
        while any graph is live; once none is, the pool's memory goes back to the device."""
        if self._graphs.pop(key, None) is not None and not self._graphs:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        self.pool_bytes = self._pool_bytes()

    def _pool_bytes(self) -> int:
        """Bytes of the device segments the shared pool holds (the allocator's own count)."""
        pool = tuple(self._pool)
        segments: list[dict[str, Any]] = torch.cuda.memory_snapshot()  # type: ignore[no-untyped-call]
        return sum(
            int(s["total_size"]) for s in segments if tuple(s.get("segment_pool_id", ())) == pool
        )

    @property
    def live(self) -> list[GraphKey]:
        return sorted(self._graphs)

    def __len__(self) -> int:
        return len(self._graphs)

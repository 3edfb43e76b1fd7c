"""Capturing and replaying the whole forward as one CUDA graph per shape bucket.

Inputs live in static buffers sized for the largest bucket; a bucket's graph reads views of their
leading rows, so loading a batch is three host-to-device copies from reused pinned staging buffers
into fixed addresses. Outputs too: every graph ends by copying its hidden states and head into two
shared static buffers, so a live graph keeps no [T, H] tensor of its own (64 of those were GBs),
only its share of the one memory pool all graphs use. The outputs of a replay are valid until the
next replay, which is stream-ordered after every read of them. Which bucket to capture, replay or
evict is `graph_policy.GraphCache`'s decision.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from embedfleet.worker.engine.batch import DeviceBatch, HostBatch, from_tensors
from embedfleet.worker.engine.graph_policy import GraphKey
from embedfleet.worker.engine.staging import Staging

#: the captured body: (batch views, the attention's launch length) -> (hidden, head)
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
        self._tokens = torch.zeros((4, max_tokens), dtype=torch.int64, device=device)
        self._seqs = torch.ones((3, max_sequences), dtype=torch.int64, device=device)
        self._cu = torch.zeros(max_sequences + 1, dtype=torch.int32, device=device)
        self._staging = Staging(max_tokens, max_sequences, pin=True)
        self._pool = torch.cuda.graph_pool_handle()
        self._graphs: dict[GraphKey, torch.cuda.CUDAGraph] = {}
        self._hidden: torch.Tensor | None = None
        self._head: torch.Tensor | None = None
        self.capture_seconds = 0.0

    def fits(self, key: GraphKey) -> bool:
        return key.tokens <= self._tokens.shape[1] and key.sequences <= self._seqs.shape[1]

    def load(self, host: HostBatch) -> DeviceBatch:
        """Copy a bucket-padded batch into the static buffers; returns the views a graph reads."""
        t, n = host.total_tokens, host.sequences
        tokens, seqs, cu = self._staging.stage(host)
        self._tokens[:, :t].copy_(tokens, non_blocking=True)
        self._seqs[:, :n].copy_(seqs, non_blocking=True)
        self._cu[: n + 1].copy_(cu, non_blocking=True)
        self._staging.copied()
        return from_tensors(self._tokens[:, :t], self._seqs[:, :n], self._cu[: n + 1])

    def _outputs_for(self, hidden: torch.Tensor, head: torch.Tensor) -> None:
        """The shared output buffers, allocated (outside the graph pool) on the first capture."""
        if self._hidden is None:
            rows = self._tokens.shape[1]
            self._hidden = hidden.new_empty((rows, *hidden.shape[1:]))
        if self._head is None:
            self._head = head.new_empty((self._seqs.shape[1], *head.shape[1:]))

    def capture(
        self, key: GraphKey, views: DeviceBatch, attention_len: int
    ) -> tuple[torch.Tensor, ...]:
        """Warm up on a side stream, capture, then replay once for this batch's results."""
        start = time.perf_counter()
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            hidden, head = self._body(views, attention_len)
            self._outputs_for(hidden, head)
            del hidden, head
        torch.cuda.current_stream().wait_stream(side)
        assert self._hidden is not None
        assert self._head is not None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            hidden, head = self._body(views, attention_len)
            self._hidden[: key.tokens].copy_(hidden)
            self._head[: key.sequences].copy_(head)
            del hidden, head  # freed into the pool: later captures reuse the memory
        self._graphs[key] = graph
        torch.cuda.synchronize()
        self.capture_seconds += time.perf_counter() - start
        return self.replay(key)

    def replay(self, key: GraphKey) -> tuple[torch.Tensor, ...]:
        self._graphs[key].replay()
        assert self._hidden is not None
        assert self._head is not None
        return self._hidden[: key.tokens], self._head[: key.sequences]

    def evict(self, key: GraphKey) -> None:
        # Dropping the graph returns its memory to the shared pool for later captures.
        self._graphs.pop(key, None)

    @property
    def live(self) -> list[GraphKey]:
        return sorted(self._graphs)

    def __len__(self) -> int:
        return len(self._graphs)

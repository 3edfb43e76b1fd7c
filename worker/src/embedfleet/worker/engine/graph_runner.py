"""Capturing and replaying the whole forward as one CUDA graph per shape bucket.

Inputs live in static buffers sized for the largest bucket; a bucket's graph reads views of their
leading rows, so loading a batch is three host-to-device copies into fixed addresses. All graphs
share one memory pool. Which bucket to capture, replay or evict is `graph_policy.GraphCache`'s
decision.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from embedfleet.worker.engine.batch import DeviceBatch, HostBatch, from_tensors
from embedfleet.worker.engine.graph_policy import GraphKey

#: the captured body: (batch views, bucket tokens as the attention's max length) -> outputs
Body = Callable[[DeviceBatch, int], tuple[torch.Tensor, ...]]


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    outputs: tuple[torch.Tensor, ...]


class GraphRunner:
    def __init__(
        self, body: Body, device: torch.device, max_tokens: int, max_sequences: int
    ) -> None:
        self._body = body
        self._tokens = torch.zeros((4, max_tokens), dtype=torch.int64, device=device)
        self._seqs = torch.ones((3, max_sequences), dtype=torch.int64, device=device)
        self._cu = torch.zeros(max_sequences + 1, dtype=torch.int32, device=device)
        self._pool = torch.cuda.graph_pool_handle()
        self._graphs: dict[GraphKey, _Captured] = {}
        self.capture_seconds = 0.0

    def fits(self, key: GraphKey) -> bool:
        return key.tokens <= self._tokens.shape[1] and key.sequences <= self._seqs.shape[1]

    def load(self, host: HostBatch) -> DeviceBatch:
        """Copy a bucket-padded batch into the static buffers; returns the views a graph reads."""
        t, n = host.total_tokens, host.sequences
        self._tokens[:, :t].copy_(torch.from_numpy(host.tokens).pin_memory(), non_blocking=True)
        self._seqs[:, :n].copy_(torch.from_numpy(host.seqs).pin_memory(), non_blocking=True)
        self._cu[: n + 1].copy_(torch.from_numpy(host.cu_seqlens).pin_memory(), non_blocking=True)
        return from_tensors(self._tokens[:, :t], self._seqs[:, :n], self._cu[: n + 1])

    def capture(self, key: GraphKey, views: DeviceBatch) -> tuple[torch.Tensor, ...]:
        """Warm up on a side stream, capture, then replay once for this batch's results."""
        start = time.perf_counter()
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._body(views, key.tokens)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = self._body(views, key.tokens)
        self._graphs[key] = _Captured(graph, outputs)
        torch.cuda.synchronize()
        self.capture_seconds += time.perf_counter() - start
        return self.replay(key)

    def replay(self, key: GraphKey) -> tuple[torch.Tensor, ...]:
        captured = self._graphs[key]
        captured.graph.replay()
        return captured.outputs

    def evict(self, key: GraphKey) -> None:
        # Dropping the graph returns its memory to the shared pool for later captures.
        self._graphs.pop(key, None)

    def __len__(self) -> int:
        return len(self._graphs)

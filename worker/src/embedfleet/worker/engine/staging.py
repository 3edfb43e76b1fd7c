"""Host buffers reused across batches: the staging side of host->device and device->host copies.

Allocating pinned memory per batch costs a host allocation and a page-locking copy every time;
these buffers are allocated once and reused. Reuse is safe only once the copy that last read (or
wrote) a buffer is done, so each set carries the event recorded after its copy. Without CUDA
(`pin=False`) the same bookkeeping runs on plain host tensors, which is how it is tested.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from embedfleet.worker.engine.batch import HostBatch


class Staging:
    """`depth` sets of (tokens [4, T], seqs [3, N], cu_seqlens [N + 1]) host buffers, used in
    turn: a set is rewritten only after the copy that last read it has finished."""

    def __init__(self, max_tokens: int, max_sequences: int, pin: bool, depth: int = 2) -> None:
        self.max_tokens, self.max_sequences = max_tokens, max_sequences
        self._pin = pin
        self._sets = [
            (
                torch.empty(4 * max_tokens, dtype=torch.int64, pin_memory=pin),
                torch.empty(3 * max_sequences, dtype=torch.int64, pin_memory=pin),
                torch.empty(max_sequences + 1, dtype=torch.int32, pin_memory=pin),
            )
            for _ in range(depth)
        ]
        self._events: list[Any] = [None] * depth
        self._turn = 0

    def fits(self, host: HostBatch) -> bool:
        return host.total_tokens <= self.max_tokens and host.sequences <= self.max_sequences

    def stage(self, host: HostBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The batch written into the next free set: contiguous [4, t], [3, n], [n + 1] views.

        Call `copied()` once the device copies that read them are queued.
        """
        slot = self._turn
        event = self._events[slot]
        if event is not None:
            event.synchronize()  # the copy from two batches ago; normally long finished
            self._events[slot] = None
        t, n = host.total_tokens, host.sequences
        tokens, seqs, cu = self._sets[slot]
        views = (tokens[: 4 * t].view(4, t), seqs[: 3 * n].view(3, n), cu[: n + 1])
        views[0].numpy()[...] = host.tokens
        views[1].numpy()[...] = host.seqs
        views[2].numpy()[...] = host.cu_seqlens
        return views

    def copied(self) -> None:
        """Mark the set just staged as read by copies queued on the current stream."""
        if self._pin:
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record()
            self._events[self._turn] = event
        self._turn = (self._turn + 1) % len(self._sets)

    def buffers(self, slot: int) -> tuple[torch.Tensor, ...]:
        """The set `slot`'s buffers (for tests that check reuse)."""
        return self._sets[slot]


class HostOutputs:
    """Float32 host buffers for results coming back from the device, handed out and returned.

    A buffer goes back to the free list once its results were copied out to the caller, so a
    steady stream of batches reuses a handful of buffers instead of pinning one per batch.
    """

    #: free buffers kept; more are dropped (a burst of in-flight batches does not pin forever)
    KEEP = 8

    def __init__(self, pin: bool) -> None:
        self._pin = pin
        self._free: list[torch.Tensor] = []
        self._lock = threading.Lock()  # taken on the engine thread, given back where results
        self.allocated = 0

    def take(self, shape: torch.Size | tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """(a view of `shape`, the buffer to give back)."""
        need = 1
        for d in shape:
            need *= int(d)
        with self._lock:
            for i, buf in enumerate(self._free):
                if buf.numel() >= need:
                    del self._free[i]
                    return buf[:need].view(tuple(shape)), buf
        # Round up so batches of similar size share buffers.
        size = max(1024, 1 << max(0, need - 1).bit_length())
        buf = torch.empty(size, dtype=torch.float32, pin_memory=self._pin)
        self.allocated += 1
        return buf[:need].view(tuple(shape)), buf

    def give_back(self, buf: torch.Tensor) -> None:
        with self._lock:
            if len(self._free) < self.KEEP:
                self._free.append(buf)

    @property
    def free(self) -> int:
        return len(self._free)

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


def packed_bytes(tokens: int, sequences: int) -> int:
    """Bytes of one packed batch of `tokens` tokens in `sequences` slots (`packed_views`)."""
    return 32 * tokens + 24 * sequences + 4 * (sequences + 1)


def packed_views(
    buffer: torch.Tensor, tokens: int, sequences: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The contiguous (tokens [4, t] int64, seqs [3, n] int64, cu_seqlens [n + 1] int32) of a
    packed batch laid out back to back at the start of the byte `buffer`.

    One layout for the host staging buffer and the device's static inputs: a batch crosses to
    the device in one contiguous copy of `packed_bytes(t, n)` bytes, not three, and never as a
    strided copy into the leading columns of [4, max_tokens] rows (a copy kernel after the
    transfer). Offsets stay multiples of 8 bytes, as the int64 views need.
    """
    seqs_at = 32 * tokens
    cu_at = seqs_at + 24 * sequences
    end = packed_bytes(tokens, sequences)
    return (
        buffer[:seqs_at].view(torch.int64).view(4, tokens),
        buffer[seqs_at:cu_at].view(torch.int64).view(3, sequences),
        buffer[cu_at:end].view(torch.int32),
    )


class Staging:
    """`depth` packed host buffers (`packed_views`), used in turn: a buffer is rewritten only
    after the copy that last read it has finished."""

    def __init__(self, max_tokens: int, max_sequences: int, pin: bool, depth: int = 2) -> None:
        self.max_tokens, self.max_sequences = max_tokens, max_sequences
        self._pin = pin
        size = packed_bytes(max_tokens, max_sequences)
        self._sets = [torch.empty(size, dtype=torch.uint8, pin_memory=pin) for _ in range(depth)]
        self._events: list[Any] = [None] * depth
        self._turn = 0

    def fits(self, host: HostBatch) -> bool:
        return host.total_tokens <= self.max_tokens and host.sequences <= self.max_sequences

    def stage(self, host: HostBatch) -> torch.Tensor:
        """The batch packed into the next free buffer: its leading `packed_bytes` bytes.

        Call `copied()` once the device copy that reads them is queued.
        """
        slot = self._turn
        event = self._events[slot]
        if event is not None:
            event.synchronize()  # the copy from two batches ago; normally long finished
            self._events[slot] = None
        t, n = host.total_tokens, host.sequences
        buffer = self._sets[slot]
        tokens, seqs, cu = packed_views(buffer, t, n)
        tokens.numpy()[...] = host.tokens
        seqs.numpy()[...] = host.seqs
        cu.numpy()[...] = host.cu_seqlens
        return buffer[: packed_bytes(t, n)]

    def copied(self) -> None:
        """Mark the buffer just staged as read by a copy queued on the current stream."""
        if self._pin:
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record()
            self._events[self._turn] = event
        self._turn = (self._turn + 1) % len(self._sets)

    def buffer(self, slot: int) -> torch.Tensor:
        """The buffer of set `slot` (for tests that check reuse)."""
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

"""The CUDA result handle: results are read later, so the next batch can launch first."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from embedfleet.common.arrays import FloatArray
from embedfleet.worker.engine.staging import HostOutputs


@dataclass(frozen=True, slots=True)
class Slice:
    """One work item's rows of the batch output and the columns it keeps."""

    start: int
    stop: int
    columns: int  # 0 for scores (a 1-D output)


def split(host: FloatArray, slices: list[Slice]) -> list[FloatArray]:
    out: list[FloatArray] = []
    for s in slices:
        if s.columns == 0 or s.columns == host.shape[1]:
            out.append(host[s.start : s.stop])
        else:
            out.append(np.ascontiguousarray(host[s.start : s.stop, : s.columns]))
    return out


class InFlight:
    """A device->pinned-host copy queued behind the batch's kernels, and the event that ends it."""

    def __init__(
        self, device_out: torch.Tensor, slices: list[Slice], outputs: HostOutputs | None = None
    ) -> None:
        if outputs is None:
            self._host = torch.empty(device_out.shape, dtype=torch.float32, pin_memory=True)
            self._buffer = None
        else:
            self._host, self._buffer = outputs.take(device_out.shape)
        self._outputs = outputs
        self._host.copy_(device_out, non_blocking=True)
        self._event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        self._event.record()
        self._slices = slices
        self._results: list[FloatArray] | None = None

    def ready(self) -> bool:
        return self._results is not None or bool(self._event.query())  # type: ignore[no-untyped-call]

    def wait(self) -> list[FloatArray]:
        if self._results is None:
            self._event.synchronize()
            results = split(self._host.numpy(), self._slices)
            if self._outputs is not None and self._buffer is not None:
                # The buffer goes back for the next batch: the caller gets its own copies.
                results = [np.array(r) for r in results]
                self._outputs.give_back(self._buffer)
                self._buffer = None
            self._results = results
        return self._results

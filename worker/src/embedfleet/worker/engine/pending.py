"""Handles for launched batches: results are read later, so the next batch can launch first."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

Arrays = list[npt.NDArray[np.float32]]


@dataclass(frozen=True, slots=True)
class Slice:
    """One work item's rows of the batch output and the columns it keeps."""

    start: int
    stop: int
    columns: int  # 0 for scores (a 1-D output)


def split(host: npt.NDArray[np.float32], slices: list[Slice]) -> Arrays:
    out: Arrays = []
    for s in slices:
        if s.columns == 0 or s.columns == host.shape[1]:
            out.append(host[s.start : s.stop])
        else:
            out.append(np.ascontiguousarray(host[s.start : s.stop, : s.columns]))
    return out


class Done:
    """Results computed synchronously (the CPU path): complete on return."""

    def __init__(self, results: Arrays) -> None:
        self._results = results

    def ready(self) -> bool:
        return True

    def wait(self) -> Arrays:
        return self._results


class InFlight:
    """A device->pinned-host copy queued behind the batch's kernels, and the event that ends it."""

    def __init__(self, device_out: torch.Tensor, slices: list[Slice]) -> None:
        self._host = torch.empty(device_out.shape, dtype=torch.float32, pin_memory=True)
        self._host.copy_(device_out, non_blocking=True)
        self._event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        self._event.record()
        self._slices = slices
        self._results: Arrays | None = None

    def ready(self) -> bool:
        return self._results is not None or bool(self._event.query())  # type: ignore[no-untyped-call]

    def wait(self) -> Arrays:
        if self._results is None:
            self._event.synchronize()
            self._results = split(self._host.numpy(), self._slices)
        return self._results

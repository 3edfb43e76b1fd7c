"""Reading a model directory's tensors straight from safetensors (or a legacy pytorch_model.bin)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from embedfleet.common.modeldir import ModelDirError, weight_files

Tensors = dict[str, torch.Tensor]


def load_tensors(path: Path) -> Tensors:
    """Every tensor of the directory, on the CPU, in its stored dtype."""
    files = weight_files(path)
    if files and files[0].suffix == ".safetensors":
        from safetensors.torch import load_file

        out: Tensors = {}
        for shard in files:
            out.update(load_file(str(shard), device="cpu"))
        return out
    bins = files
    if not bins:
        raise ModelDirError(f"{path} has no *.safetensors or pytorch_model.bin")
    out = {}
    for file in bins:
        loaded = torch.load(str(file), map_location="cpu", weights_only=True)
        if not isinstance(loaded, dict):
            raise ModelDirError(f"{file} does not hold a state dict")
        out.update(loaded)
    return out


def strip_prefix(tensors: Tensors, prefixes: Iterable[str]) -> Tensors:
    """Drop the wrapper prefix ("bert.", "model.") whichever head class saved the weights."""
    for prefix in prefixes:
        if any(name.startswith(prefix) for name in tensors):
            return {
                (name[len(prefix) :] if name.startswith(prefix) else name): t
                for name, t in tensors.items()
            }
    return tensors


def renamed(tensors: Tensors, replacements: Iterable[tuple[str, str]]) -> Tensors:
    """Tensor names with each (old, new) substring replaced in order: a family whose checkpoint
    names another family's parts differently (DistilBERT's q_lin is BERT's query) loads through
    that family's code."""
    pairs = list(replacements)
    out: Tensors = {}
    for name, tensor in tensors.items():
        new_name = name
        for old, new in pairs:
            new_name = new_name.replace(old, new)
        out[new_name] = tensor
    return out


class WeightReader:
    """Takes tensors by name, cast and moved once; reports names the model did not use."""

    def __init__(self, tensors: Tensors, dtype: torch.dtype, device: torch.device) -> None:
        self._tensors = tensors
        self._dtype = dtype
        self._device = device
        self._used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self._tensors

    def raw(self, name: str) -> torch.Tensor:
        try:
            tensor = self._tensors[name]
        except KeyError:
            raise ModelDirError(f"weight {name!r} is missing from the checkpoint") from None
        self._used.add(name)
        return tensor

    def get(self, name: str) -> torch.Tensor:
        return self.raw(name).to(device=self._device, dtype=self._dtype).contiguous()

    def optional(self, name: str) -> torch.Tensor | None:
        return self.get(name) if name in self._tensors else None

    def cat(self, names: Iterable[str]) -> torch.Tensor:
        """Fuse along the output dimension (q, k, v into one matrix) so one GEMM does all three."""
        parts = [self.raw(n) for n in names]
        return torch.cat(parts, 0).to(device=self._device, dtype=self._dtype).contiguous()

    def unused(self) -> list[str]:
        return sorted(set(self._tensors) - self._used)

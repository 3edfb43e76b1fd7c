"""Helpers shared by the engine tests (imported by name; pytest puts this folder on sys.path)."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from embedfleet.common.codec import Tokens
from embedfleet.testing.families import DECODERS
from embedfleet.worker.contract import Options, WorkItem
from embedfleet.worker.engine import precision
from embedfleet.worker.engine import runtime as runtimes
from embedfleet.worker.engine.config import EngineConfig
from embedfleet.worker.engine.kernels.types import Kernels
from embedfleet.worker.engine.torch_engine import TorchEngine

#: the CPU runtimes (--cpu-runtime) held to every family's parity tests; inductor (5-7 minutes
#: of compiling per model and dtype here, several GB each) to MiniLM's float32 parity alone
RUNTIMES = ("eager", "openvino")

#: the decoder families' published configs (testing.families.DECODERS), and the windows the tests
#: give those that slide (4096 and 512 published), so that short sequences cross them
DECODER_FAMILIES = sorted(DECODERS)
WINDOWED = {"e5-mistral-7b-instruct": 16, "embeddinggemma-300m": 16}

#: mixed lengths from 1 to 512 tokens, around the 128/256 boundaries the packaged files hint at
PARITY_LENGTHS = (1, 2, 3, 5, 9, 16, 31, 64, 100, 127, 128, 129, 200, 255, 256, 257, 384, 511, 512)


@functools.lru_cache(maxsize=6)
def cached_engine(config: EngineConfig) -> TorchEngine:
    """The last few engines by config: a compiled runtime's start-up is paid once per run of
    tests that share it, and the session does not keep every engine (GBs) alive."""
    return TorchEngine(config)


def engine_for(
    path: Path, dtype: str, monkeypatch: pytest.MonkeyPatch, runtime: str
) -> TorchEngine:
    """`auto` here always tries bf16 (on CPUs with native bf16): whichever dtype the parity probe
    then keeps must meet the bar."""
    monkeypatch.setattr(precision, "reduced_precision_pays", lambda dtype, hidden: True)
    monkeypatch.setattr(runtimes, "reduced_pays", lambda reduced, float32: True)
    config = EngineConfig(model=str(path), device="cpu", dtype=dtype, cpu_runtime=runtime)
    return TorchEngine(config)


def minilm(dtype: str, runtime: str) -> TorchEngine:
    """The real MiniLM allowing 512 tokens, on the CPU at `dtype` in `runtime` (cached)."""
    return cached_engine(
        EngineConfig(max_input_tokens=512, device="cpu", dtype=dtype, cpu_runtime=runtime)
    )


def item(seqs: list[list[int]], options: Options | None = None, types: bool = False) -> WorkItem:
    ids = np.concatenate([np.asarray(s, np.int32) for s in seqs])
    lengths = np.array([len(s) for s in seqs], np.int32)
    type_ids = np.zeros(ids.shape, np.uint8) if types else None
    return WorkItem(Tokens(ids, lengths, type_ids), options or Options())


def save_model(model: torch.nn.Module, path: Path, legacy_bin: bool = False) -> Path:
    """save_pretrained, or a plain pytorch_model.bin state dict (the legacy format)."""
    model.save_pretrained(str(path))  # type: ignore[operator]
    if legacy_bin:
        for f in path.glob("*.safetensors"):
            f.unlink()
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        torch.save(state, path / "pytorch_model.bin")
    return path


def write_pooling(path: Path, mode: str, normalize: bool) -> None:
    """sentence-transformers module files, as embedding checkpoints ship them."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if normalize:
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir(exist_ok=True)
    flags = {f"pooling_mode_{m}": m == mode for m in ("mean_tokens", "cls_token", "lasttoken")}
    (path / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 0, **flags})
    )


def qwen3_config(**extra: object) -> object:
    from transformers import Qwen3Config

    shape: dict[str, object] = {
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 256,
    }
    return Qwen3Config(**(shape | extra))


def random_sequences(vocab: int, lengths: tuple[int, ...], seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n).tolist() for n in lengths]


# ---- Triton kernels in the interpreter ---------------------------------------------------------

#: the modules holding @triton.jit kernels (engine/kernels/), each self-contained
TRITON_MODULES = ("norm", "rope", "glu")


def interpreted_modules() -> dict[str, ModuleType]:
    """Fresh private copies of the Triton kernel modules whose kernels run in Triton's interpreter.

    Triton reads TRITON_INTERPRET when it decorates a kernel, its own library functions (tl.sum,
    tl.sigmoid) included, which it decorates at its first import: a process that imported Triton
    without the variable (torch's compiler does) cannot interpret. So the copies are executed
    against a second import of Triton's Python modules made with the variable set (its compiled
    extension, which cannot load twice, is shared), and the session's own Triton is put back:
    the package's kernel modules, which a CUDA test uses, are never touched. Launches need the
    variable too: `fused_kernels` sets it for each test."""
    own = {n: m for n, m in sys.modules.items() if n == "triton" or n.startswith("triton.")}
    for name in own:
        if not name.startswith("triton._C"):
            del sys.modules[name]
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    out = {}
    try:
        for name in TRITON_MODULES:
            spec = importlib.util.find_spec(f"embedfleet.worker.engine.kernels.{name}")
            assert spec is not None
            assert spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            out[name] = module
    finally:
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved
        for name in [n for n in sys.modules if n == "triton" or n.startswith("triton.")]:
            if not name.startswith("triton._C"):
                del sys.modules[name]
        sys.modules.update(own)
    return out


def interpreted_kernels(modules: dict[str, ModuleType]) -> Kernels:
    """The fused `Kernels` made of the interpreted copies (as `kernels.fused()` makes them)."""
    norm, rope, glu = (modules[n] for n in TRITON_MODULES)
    return Kernels("triton", rope.rotary, norm.add_rms_norm, rope.qk_norm_rope, glu.glu)


#: ops that launch nothing on a device: allocation (views are told by `OpOverload.is_view`)
_NO_LAUNCH = frozenset({"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"})


class LaunchCounter(TorchDispatchMode):
    """Counts what a forward would launch on a device: every PyTorch op that computes (views and
    allocations excluded) and every Triton kernel launch (through `count_triton`), by name.

    A measurement at the dispatcher, so composite ops count once (`linear`, `rms_norm`,
    `scaled_dot_product_attention`: one kernel each on CUDA, where `addmm`'s copy of its input
    and SDPA-through-varlen's rng fill would be extra, uncounted here)."""

    def __init__(self) -> None:
        super().__init__()
        self.launches: Counter[str] = Counter()
        self._inside = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if not self._inside and not func.is_view and name not in _NO_LAUNCH:
            self.launches[name] += 1
        return func(*args, **(kwargs or {}))

    def total(self) -> int:
        return sum(self.launches.values())

    def count_triton(self, modules: dict[str, ModuleType]) -> None:
        """Wraps each interpreted kernel of `modules` so a launch counts once (the interpreter's
        own tensor work inside it does not count)."""
        for module in modules.values():
            for attr, value in vars(module).items():
                if isinstance(value, _CountedKernel):
                    value.counter = self
                elif type(value).__name__ == "InterpretedFunction":
                    setattr(module, attr, _CountedKernel(value, attr, self))


@dataclass
class _CountedKernel:
    kernel: Any
    name: str
    counter: LaunchCounter

    def __getitem__(self, grid: Any) -> Any:
        launch = self.kernel[grid]

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.counter.launches[f"triton{self.name}"] += 1
            self.counter._inside += 1
            try:
                return launch(*args, **kwargs)
            finally:
                self.counter._inside -= 1

        return counted

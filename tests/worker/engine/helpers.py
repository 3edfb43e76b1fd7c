"""Helpers shared by the engine tests (imported by name; pytest puts this folder on sys.path)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import torch

from embedfleet.common.codec import Tokens
from embedfleet.worker.contract import Options, WorkItem
from embedfleet.worker.engine.config import EngineConfig
from embedfleet.worker.engine.torch_engine import TorchEngine

#: the CPU runtimes (--cpu-runtime) held to every family's parity tests; inductor (5-7 minutes
#: of compiling per model and dtype here, several GB each) to MiniLM's float32 parity alone
RUNTIMES = ("eager", "openvino")

#: mixed lengths from 1 to 512 tokens, around the 128/256 boundaries the packaged files hint at
PARITY_LENGTHS = (1, 2, 3, 5, 9, 16, 31, 64, 100, 127, 128, 129, 200, 255, 256, 257, 384, 511, 512)


@functools.lru_cache(maxsize=6)
def cached_engine(config: EngineConfig) -> TorchEngine:
    """The last few engines by config: a compiled runtime's start-up is paid once per run of
    tests that share it, and the session does not keep every engine (GBs) alive."""
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

    return Qwen3Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        **extra,
    )


def random_sequences(vocab: int, lengths: tuple[int, ...], seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n).tolist() for n in lengths]

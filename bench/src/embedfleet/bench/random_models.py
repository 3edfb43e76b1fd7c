"""Model directories with random weights of a given shape, built locally (no hub access).

For timing, only the shape matters: the device machine has no network, and a 600M-parameter
download would not fit its budget anyway. Weights are drawn on the GPU when there is one (600M
CPU random numbers take minutes on a small box).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class BertShape:
    hidden: int = 384
    intermediate: int = 1536
    layers: int = 6
    heads: int = 12
    vocab: int = 30522
    positions: int = 512


@dataclass(frozen=True)
class Qwen3Shape:
    hidden: int = 1024
    intermediate: int = 3072
    layers: int = 28
    heads: int = 16
    kv_heads: int = 8
    head_dim: int = 128
    vocab: int = 151669
    positions: int = 32768


MINILM = BertShape()
BERT_BASE = BertShape(hidden=768, intermediate=3072, layers=12, heads=12)  # arctic-embed-m's size
QWEN3_06B = Qwen3Shape()
TINY_BERT = BertShape(hidden=64, intermediate=128, layers=2, heads=4, vocab=1024, positions=512)
TINY_QWEN3 = Qwen3Shape(64, 128, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=1024)


def _drawer(seed: int, dtype_name: str) -> Callable[..., torch.Tensor]:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device).manual_seed(seed)
    dtype = getattr(torch, dtype_name)

    def w(*shape: int) -> torch.Tensor:
        drawn = torch.randn(*shape, generator=gen, device=device, dtype=dtype)
        return (drawn * 0.02).cpu()

    return w


def bert_dir(root: Path, shape: BertShape = MINILM, seed: int = 0) -> Path:
    """A BertModel directory (mean pooling by default, like MiniLM)."""
    import torch
    from safetensors.torch import save_file

    h, i = shape.hidden, shape.intermediate
    config = {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": shape.vocab,
        "hidden_size": h,
        "intermediate_size": i,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "max_position_embeddings": shape.positions,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "hidden_act": "gelu",
    }
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    w = _drawer(seed, "float32")
    e = "embeddings."
    tensors = {
        e + "word_embeddings.weight": w(shape.vocab, h),
        e + "position_embeddings.weight": w(shape.positions, h),
        e + "token_type_embeddings.weight": w(2, h),
        e + "LayerNorm.weight": torch.ones(h),
        e + "LayerNorm.bias": torch.zeros(h),
    }
    for n in range(shape.layers):
        p = f"encoder.layer.{n}."
        for name in ("query", "key", "value"):
            tensors[p + f"attention.self.{name}.weight"] = w(h, h)
            tensors[p + f"attention.self.{name}.bias"] = torch.zeros(h)
        tensors |= {
            p + "attention.output.dense.weight": w(h, h),
            p + "attention.output.dense.bias": torch.zeros(h),
            p + "attention.output.LayerNorm.weight": torch.ones(h),
            p + "attention.output.LayerNorm.bias": torch.zeros(h),
            p + "intermediate.dense.weight": w(i, h),
            p + "intermediate.dense.bias": torch.zeros(i),
            p + "output.dense.weight": w(h, i),
            p + "output.dense.bias": torch.zeros(h),
            p + "output.LayerNorm.weight": torch.ones(h),
            p + "output.LayerNorm.bias": torch.zeros(h),
        }
    save_file(tensors, str(root / "model.safetensors"))
    return root


def qwen3_dir(root: Path, shape: Qwen3Shape = QWEN3_06B, seed: int = 0) -> Path:
    """A Qwen3Model directory with bf16 weights (last-token pooling, causal)."""
    import torch
    from safetensors.torch import save_file

    h, i, d = shape.hidden, shape.intermediate, shape.head_dim
    config = {
        "architectures": ["Qwen3Model"],
        "model_type": "qwen3",
        "vocab_size": shape.vocab,
        "hidden_size": h,
        "intermediate_size": i,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": d,
        "max_position_embeddings": shape.positions,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
    }
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    w = _drawer(seed, "bfloat16")

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    tensors = {"embed_tokens.weight": w(shape.vocab, h), "norm.weight": ones(h)}
    for n in range(shape.layers):
        p = f"layers.{n}."
        tensors |= {
            p + "input_layernorm.weight": ones(h),
            p + "post_attention_layernorm.weight": ones(h),
            p + "self_attn.q_proj.weight": w(shape.heads * d, h),
            p + "self_attn.k_proj.weight": w(shape.kv_heads * d, h),
            p + "self_attn.v_proj.weight": w(shape.kv_heads * d, h),
            p + "self_attn.o_proj.weight": w(h, shape.heads * d),
            p + "self_attn.q_norm.weight": ones(d),
            p + "self_attn.k_norm.weight": ones(d),
            p + "mlp.gate_proj.weight": w(i, h),
            p + "mlp.up_proj.weight": w(i, h),
            p + "mlp.down_proj.weight": w(h, i),
        }
    save_file(tensors, str(root / "model.safetensors"))
    return root


def matmul_params(shape: Qwen3Shape | BertShape) -> int:
    """Parameters a token multiplies through (2 x this = FLOPs per token, attention aside)."""
    if isinstance(shape, Qwen3Shape):
        h, d = shape.hidden, shape.head_dim
        attn = h * shape.heads * d * 2 + h * shape.kv_heads * d * 2
        return shape.layers * (attn + 3 * h * shape.intermediate)
    h = shape.hidden
    return shape.layers * (4 * h * h + 2 * h * shape.intermediate)

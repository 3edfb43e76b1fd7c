"""Decoders in the Llama checkpoint layout as embedders: Qwen3 (Qwen3-Embedding, pplx-embed),
Qwen2 (gte-Qwen2) and Mistral (e5-mistral, SFR-Embedding-Mistral).

One layout, three variations: Qwen3 normalizes q and k per head, Qwen2 has QKV biases, Mistral has
neither and slides a causal window over every layer (`sliding_window` in config.json: each token
sees the W tokens up to itself, applied on every attention path). Attention is causal within each
sequence (pooled at the last token) unless config.json says `is_causal: false` (or
`use_bidirectional_attention`) or the engine's `bidirectional` setting asks for it, as
pplx-embed-style checkpoints use with mean pooling.
"""

from __future__ import annotations

from typing import Any

import torch

from embedfleet.common.modeldir import ModelDirError
from embedfleet.worker.engine.kernels import for_device
from embedfleet.worker.engine.kernels.types import Kernels, Norm, QkvLayout
from embedfleet.worker.engine.models.decoder import (
    Decoder,
    Layer,
    decoder_shape,
    rope_tables,
    rope_theta,
    windows,
)
from embedfleet.worker.engine.weights import WeightReader

LLAMA_TYPES = ("qwen3", "qwen2", "mistral")


def _layer(reader: WeightReader, i: int, layout: QkvLayout, eps: float, window: int) -> Layer:
    p = f"layers.{i}."
    a = p + "self_attn."
    qk_norm = None
    if reader.has(a + "q_norm.weight"):  # Qwen3
        q_norm, k_norm = reader.get(a + "q_norm.weight"), reader.get(a + "k_norm.weight")
        per_head = [q_norm.expand(layout.heads, -1), k_norm.expand(layout.kv_heads, -1)]
        qk_norm = Norm(torch.cat(per_head).contiguous(), eps)
    has_bias = reader.has(a + "q_proj.bias")  # Qwen2
    return Layer(
        in_norm=Norm(reader.get(p + "input_layernorm.weight"), eps),
        qkv_w=reader.cat(a + n + "_proj.weight" for n in "qkv"),
        qkv_b=reader.cat(a + n + "_proj.bias" for n in "qkv") if has_bias else None,
        qk_norm=qk_norm,
        out_w=reader.get(a + "o_proj.weight"),
        mlp_norm=Norm(reader.get(p + "post_attention_layernorm.weight"), eps),
        gate_up_w=reader.cat(p + f"mlp.{n}_proj.weight" for n in ("gate", "up")),
        down_w=reader.get(p + "mlp.down_proj.weight"),
        rope=0,
        window=window,
    )


def llama_decoder(
    config: dict[str, Any],
    reader: WeightReader,
    bidirectional: bool,
    kernels: Kernels | None = None,
) -> Decoder:
    if config.get("hidden_act", "silu") != "silu":
        raise ModelDirError(f"unsupported hidden_act {config.get('hidden_act')!r} (silu)")
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    layout = QkvLayout(
        heads=heads,
        kv_heads=int(config.get("num_key_value_heads") or heads),
        dim=int(config.get("head_dim") or hidden // heads),
    )
    eps = float(config.get("rms_norm_eps", 1e-6))
    slides = windows(config, bidirectional)
    embed = reader.get("embed_tokens.weight")
    positions = int(config.get("max_position_embeddings", 32768))
    return Decoder(
        shape=decoder_shape(config, bidirectional, slides),
        embed=embed,
        layers=[_layer(reader, i, layout, eps, w) for i, w in enumerate(slides)],
        norm=Norm(reader.get("norm.weight"), eps),
        ropes=[rope_tables(rope_theta(config), layout.dim, positions, embed.dtype, embed.device)],
        layout=layout,
        activation="silu",
        kernels=kernels or for_device(embed.device),
    )

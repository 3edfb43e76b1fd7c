"""Gemma3 text encoders as EmbeddingGemma uses them (`Gemma3TextModel`, model_type gemma3_text).

The decoder forward with Gemma3's parts: embeddings scaled by sqrt(hidden) (folded into the table
at load, rounded to the compute dtype as the reference rounds the scale), RMSNorms that scale by
(1 + w) in float32, norms on the attention's and the MLP's outputs before each residual add,
per-head q/k norms, GeGLU with tanh GELU, and two rotary bases: local (sliding-window layers) and
global (full-attention layers). EmbeddingGemma is bidirectional (`use_bidirectional_attention`):
its sliding layers see W/2 tokens either side, as `transformers` runs them.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from embedfleet.common.modeldir import ModelDirError
from embedfleet.worker.engine.kernels import for_device
from embedfleet.worker.engine.kernels.types import Kernels, Norm, QkvLayout
from embedfleet.worker.engine.models.decoder import (
    Decoder,
    Layer,
    decoder_shape,
    layer_types,
    rope_tables,
    rope_theta,
    windows,
)
from embedfleet.worker.engine.weights import WeightReader

GEMMA3_TYPES = ("gemma3_text",)

#: the order of the decoder's rotary tables
_ROPES = ("full_attention", "sliding_attention")


def _norm(reader: WeightReader, name: str, eps: float) -> Norm:
    """Gemma's (1 + w) in float32, w as stored in the compute dtype: the reference adds its
    (cast) weight to 1 in float32, scales in float32 and rounds once."""
    return Norm(1.0 + reader.get(name).float(), eps, round_first=False)


def _layer(
    reader: WeightReader, i: int, layout: QkvLayout, eps: float, kind: str, window: int
) -> Layer:
    p = f"layers.{i}."
    a = p + "self_attn."
    q_norm, k_norm = (
        _norm(reader, a + "q_norm.weight", eps),
        _norm(reader, a + "k_norm.weight", eps),
    )
    per_head = [q_norm.weight.expand(layout.heads, -1), k_norm.weight.expand(layout.kv_heads, -1)]
    return Layer(
        in_norm=_norm(reader, p + "input_layernorm.weight", eps),
        qkv_w=reader.cat(a + n + "_proj.weight" for n in "qkv"),
        qkv_b=None,
        qk_norm=Norm(torch.cat(per_head).contiguous(), eps, round_first=False),
        out_w=reader.get(a + "o_proj.weight"),
        attn_out_norm=_norm(reader, p + "post_attention_layernorm.weight", eps),
        mlp_norm=_norm(reader, p + "pre_feedforward_layernorm.weight", eps),
        gate_up_w=reader.cat(p + f"mlp.{n}_proj.weight" for n in ("gate", "up")),
        down_w=reader.get(p + "mlp.down_proj.weight"),
        mlp_out_norm=_norm(reader, p + "post_feedforward_layernorm.weight", eps),
        rope=_ROPES.index(kind),
        window=window,
    )


def _check(config: dict[str, Any]) -> None:
    if config.get("attn_logit_softcapping") is not None:
        raise ModelDirError("Gemma3 attention logit soft-capping is not supported")
    act = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
    if act != "gelu_pytorch_tanh":
        raise ModelDirError(f"unsupported Gemma3 hidden_activation {act!r} (gelu_pytorch_tanh)")


def gemma3_decoder(
    config: dict[str, Any],
    reader: WeightReader,
    bidirectional: bool,
    kernels: Kernels | None = None,
) -> Decoder:
    _check(config)
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    dim = int(config.get("head_dim") or hidden // heads)
    # The attention scales scores by query_pre_attn_scalar ** -0.5, not head_dim ** -0.5.
    scalar = float(config.get("query_pre_attn_scalar") or dim)
    layout = QkvLayout(
        heads, int(config.get("num_key_value_heads") or heads), dim, math.sqrt(dim / scalar)
    )
    eps = float(config.get("rms_norm_eps", 1e-6))
    kinds, slides = layer_types(config), windows(config, bidirectional)
    table = reader.get("embed_tokens.weight")
    # The reference multiplies by the scale cast to the weights' dtype (sqrt(768) -> 27.75 in bf16).
    embed = table * torch.tensor(hidden**0.5, dtype=table.dtype, device=table.device)
    positions = int(config.get("max_position_embeddings", 2048))
    return Decoder(
        shape=decoder_shape(config, bidirectional, slides),
        embed=embed,
        layers=[
            _layer(reader, i, layout, eps, kind, w)
            for i, (kind, w) in enumerate(zip(kinds, slides, strict=True))
        ],
        norm=_norm(reader, "norm.weight", eps),
        ropes=[
            rope_tables(rope_theta(config, kind), dim, positions, table.dtype, table.device)
            for kind in _ROPES
        ],
        layout=layout,
        activation="gelu_tanh",
        kernels=kernels or for_device(table.device),
    )

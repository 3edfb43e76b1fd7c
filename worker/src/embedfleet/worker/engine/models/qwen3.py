"""Qwen3 as an embedder (Qwen3-Embedding style) over a ragged batch.

Pre-norm decoder layers: RMSNorm, fused QKV (grouped-query heads), per-head RMSNorm on q and k,
rotary positions, attention, SwiGLU MLP. Attention is causal within each sequence by default
(pooled at the last token); `bidirectional` makes it full attention within each sequence, as
pplx-embed-style models use with mean pooling. No KV cache: every forward is a whole prefill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the universal alias

from embedfleet.worker.engine.attention import AttentionPlan
from embedfleet.worker.engine.batch import DeviceBatch
from embedfleet.worker.engine.models import Shape
from embedfleet.worker.engine.weights import Tensors, WeightReader, strip_prefix


def is_bidirectional(config: dict[str, Any]) -> bool:
    """Checkpoints that train Qwen3 without the causal mask say so in config.json."""
    return config.get("is_causal") is False or bool(config.get("use_bidirectional_attention"))


def _rope_theta(config: dict[str, Any]) -> float:
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if params.get("rope_type", "default") not in ("default", None):
        raise ValueError(f"unsupported rope scaling {params!r}")
    return float(params.get("rope_theta", config.get("rope_theta", 1_000_000.0)))


@dataclass(frozen=True, slots=True)
class _Layer:
    in_norm: torch.Tensor
    qkv_w: torch.Tensor  # [(Hq + 2 Hkv) * d, H]
    qkv_b: torch.Tensor | None
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    out_w: torch.Tensor
    post_norm: torch.Tensor
    gate_up_w: torch.Tensor  # [2 * I, H]: gate and up fused at load
    down_w: torch.Tensor


class Qwen3Encoder:
    def __init__(self, config: dict[str, Any], reader: WeightReader, bidirectional: bool) -> None:
        hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.kv_heads = int(config.get("num_key_value_heads") or self.heads)
        self.head_dim = int(config.get("head_dim") or hidden // self.heads)
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        self.shape = Shape(
            hidden_size=hidden,
            vocab_size=int(config["vocab_size"]),
            type_vocab_size=1,
            causal=not bidirectional,
        )
        self.embed = reader.get("embed_tokens.weight")
        self.layers = [self._layer(reader, i) for i in range(int(config["num_hidden_layers"]))]
        self.norm = reader.get("norm.weight")
        positions = int(config.get("max_position_embeddings", 32768))
        half = torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim
        inv_freq = 1.0 / (_rope_theta(config) ** half)
        freqs = torch.outer(torch.arange(positions, dtype=torch.float32), inv_freq)
        angles = torch.cat([freqs, freqs], dim=-1)  # [P, d]
        dtype, device = self.embed.dtype, self.embed.device
        self.cos = angles.cos().to(device=device, dtype=dtype)
        self.sin = angles.sin().to(device=device, dtype=dtype)

    @staticmethod
    def _layer(reader: WeightReader, i: int) -> _Layer:
        p = f"layers.{i}."
        a = p + "self_attn."
        has_bias = reader.has(a + "q_proj.bias")
        return _Layer(
            in_norm=reader.get(p + "input_layernorm.weight"),
            qkv_w=reader.cat(a + n + "_proj.weight" for n in "qkv"),
            qkv_b=reader.cat(a + n + "_proj.bias" for n in "qkv") if has_bias else None,
            q_norm=reader.get(a + "q_norm.weight"),
            k_norm=reader.get(a + "k_norm.weight"),
            out_w=reader.get(a + "o_proj.weight"),
            post_norm=reader.get(p + "post_attention_layernorm.weight"),
            gate_up_w=reader.cat(p + f"mlp.{n}_proj.weight" for n in ("gate", "up")),
            down_w=reader.get(p + "mlp.down_proj.weight"),
        )

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # Normalize in float32 then scale in the compute dtype, as the reference does.
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype) * weight

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        first, second = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-second, first], dim=-1) * sin

    def forward(self, batch: DeviceBatch, plan: AttentionPlan) -> torch.Tensor:
        x = self.embed.index_select(0, batch.input_ids)  # [T, H]
        cos = self.cos.index_select(0, batch.positions).unsqueeze(1)  # [T, 1, d]
        sin = self.sin.index_select(0, batch.positions).unsqueeze(1)
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        for layer in self.layers:
            h = self._rms(x, layer.in_norm)
            qkv = F.linear(h, layer.qkv_w, layer.qkv_b)
            q = qkv[:, :q_size].view(-1, self.heads, self.head_dim)
            k = qkv[:, q_size : q_size + kv_size].view(-1, self.kv_heads, self.head_dim)
            v = qkv[:, q_size + kv_size :].view(-1, self.kv_heads, self.head_dim)
            q, k = self._rms(q, layer.q_norm), self._rms(k, layer.k_norm)
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            x = x + F.linear(plan.attend(q, k, v).flatten(1), layer.out_w)
            h = self._rms(x, layer.post_norm)
            gate, up = F.linear(h, layer.gate_up_w).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.down_w)
        return self._rms(x, self.norm)

    def head(self, hidden: torch.Tensor, batch: DeviceBatch) -> torch.Tensor | None:
        return None


def load_qwen3(
    config: dict[str, Any],
    tensors: Tensors,
    dtype: torch.dtype,
    device: torch.device,
    bidirectional: bool | None = None,
) -> Qwen3Encoder:
    if bidirectional is None:
        bidirectional = is_bidirectional(config)
    reader = WeightReader(strip_prefix(tensors, ("model.",)), dtype, device)
    return Qwen3Encoder(config, reader, bidirectional)

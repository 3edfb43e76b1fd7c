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
    qk_norm: torch.Tensor  # [Hq + Hkv, d]: q_norm for each query head, then k_norm for each kv head
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
        # rotate_half(x) * sin == roll(x, d/2) * [-sin | sin]: the sign lives in the table
        sin = angles.sin()
        signed = torch.cat([-sin[:, : self.head_dim // 2], sin[:, self.head_dim // 2 :]], dim=-1)
        self.sin = signed.to(device=device, dtype=dtype)

    def _layer(self, reader: WeightReader, i: int) -> _Layer:
        p = f"layers.{i}."
        a = p + "self_attn."
        has_bias = reader.has(a + "q_proj.bias")
        q_norm, k_norm = reader.get(a + "q_norm.weight"), reader.get(a + "k_norm.weight")
        return _Layer(
            in_norm=reader.get(p + "input_layernorm.weight"),
            qkv_w=reader.cat(a + n + "_proj.weight" for n in "qkv"),
            qkv_b=reader.cat(a + n + "_proj.bias" for n in "qkv") if has_bias else None,
            qk_norm=torch.cat(
                [q_norm.expand(self.heads, -1), k_norm.expand(self.kv_heads, -1)]
            ).contiguous(),
            out_w=reader.get(a + "o_proj.weight"),
            post_norm=reader.get(p + "post_attention_layernorm.weight"),
            gate_up_w=reader.cat(p + f"mlp.{n}_proj.weight" for n in ("gate", "up")),
            down_w=reader.get(p + "mlp.down_proj.weight"),
        )

    # Every op here is a kernel launch: at batch 1 on a GPU the forward's time was its launch
    # count (~40 a layer at ~2.3 us each: 3.3 ms of a 0.6B model's 128 tokens, measured on an
    # H200), so norms take their weight in the one call, q and k are normalized and rotated
    # together, and the residual adds ride in the GEMMs (addmm's beta).

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # rms_norm computes in float32 for a bf16 input and rounds once, after the weight.
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)

    def forward(self, batch: DeviceBatch, plan: AttentionPlan) -> torch.Tensor:
        x = self.embed.index_select(0, batch.input_ids)  # [T, H]
        cos = self.cos.index_select(0, batch.positions).unsqueeze(1)  # [T, 1, d]
        sin = self.sin.index_select(0, batch.positions).unsqueeze(1)
        heads, qk_heads, d = self.heads, self.heads + self.kv_heads, self.head_dim
        qk_size = qk_heads * d
        for layer in self.layers:
            qkv = F.linear(self._rms(x, layer.in_norm), layer.qkv_w, layer.qkv_b)
            qk = qkv[:, :qk_size].view(-1, qk_heads, d)
            v = qkv[:, qk_size:].view(-1, self.kv_heads, d)
            # The reference normalizes in float32, rounds, then scales by q_norm / k_norm.
            qk = F.rms_norm(qk, (d,), eps=self.eps) * layer.qk_norm
            qk = torch.addcmul(qk * cos, qk.roll(d // 2, dims=-1), sin)
            attended = plan.attend(qk[:, :heads], qk[:, heads:], v).flatten(1)
            x = torch.addmm(x, attended, layer.out_w.t())
            gate, up = F.linear(self._rms(x, layer.post_norm), layer.gate_up_w).chunk(2, dim=-1)
            x = torch.addmm(x, F.silu(gate) * up, layer.down_w.t())
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

"""ModernBERT encoders (ModernBERT, gte-modernbert, modernbert-embed) over a ragged batch.

Pre-norm layers: LayerNorm (none before the first layer's attention: the embeddings' norm is it),
fused QKV, rotary positions, attention, output projection + residual; LayerNorm, GeGLU MLP +
residual; a final LayerNorm. Every `global_attn_every_n_layers`-th layer attends to the whole
sequence, with its own rotary base; the others to a window of `local_attention` / 2 tokens either
side (`plan.windowed`: the varlen kernels take it in the kernel). Biases and norm biases are off
in the published checkpoints and read where present. Served unpadded, as TEI serves it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the universal alias

from embedfleet.common.modeldir import ModelDirError
from embedfleet.worker.engine.attention import AttentionPlan
from embedfleet.worker.engine.batch import DeviceBatch
from embedfleet.worker.engine.models import Shape
from embedfleet.worker.engine.models.bert import LayerNorm, activation
from embedfleet.worker.engine.weights import Tensors, WeightReader, strip_prefix

GLOBAL, LOCAL = "full_attention", "sliding_attention"


def layer_types(config: dict[str, Any]) -> list[str]:
    """Each layer's attention: config.layer_types (transformers >= 5), else every n-th global."""
    count = int(config["num_hidden_layers"])
    if types := config.get("layer_types"):
        return [str(t) for t in types]
    every = int(config.get("global_attn_every_n_layers", 3))
    return [GLOBAL if i % every == 0 else LOCAL for i in range(count)]


def rope_thetas(config: dict[str, Any]) -> dict[str, float]:
    """The rotary base of global and of local layers, in either config layout (transformers 5's
    rope_parameters per layer type, or the original global_/local_rope_theta)."""
    params = config.get("rope_parameters") or {}
    legacy = {
        GLOBAL: config.get("global_rope_theta") or 160_000.0,
        LOCAL: config.get("local_rope_theta") or 10_000.0,
    }
    thetas = {}
    for kind in (GLOBAL, LOCAL):
        per_kind = params.get(kind) or {}
        if per_kind.get("rope_type", "default") != "default":
            raise ModelDirError(f"unsupported ModernBERT rope scaling {per_kind!r}")
        thetas[kind] = float(per_kind.get("rope_theta", legacy[kind]))
    return thetas


def _rope_tables(
    theta: float, head_dim: int, positions: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, signed sin) [P, d] float32: rotate_half(x) * sin == roll(x, d/2) * [-sin | sin].
    Kept in float32, as the reference rotates: in bf16 the tables alone cost the embeddings of
    a few-hundred-token input 0.999 cosine."""
    half = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
    freqs = torch.outer(torch.arange(positions, dtype=torch.float32), 1.0 / theta**half)
    angles = torch.cat([freqs, freqs], dim=-1)
    sin = angles.sin()
    signed = torch.cat([-sin[:, : head_dim // 2], sin[:, head_dim // 2 :]], dim=-1)
    return angles.cos().to(device), signed.to(device)


@dataclass(frozen=True, slots=True)
class _Layer:
    attn_norm: LayerNorm | None  # None in the first layer
    qkv_w: torch.Tensor  # [3 * H, H]: q, k, v as the checkpoint fuses them (Wqkv)
    qkv_b: torch.Tensor | None
    out_w: torch.Tensor
    out_b: torch.Tensor | None
    mlp_norm: LayerNorm
    in_w: torch.Tensor  # [2 * I, H]: the GeGLU's input and gate halves (Wi)
    in_b: torch.Tensor | None
    down_w: torch.Tensor  # [H, I]
    down_b: torch.Tensor | None
    sliding: bool


class ModernBertEncoder:
    def __init__(self, config: dict[str, Any], reader: WeightReader) -> None:
        hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.head_dim = hidden // self.heads
        self.eps = float(config.get("norm_eps", 1e-5))
        self.act = activation(str(config.get("hidden_activation", "gelu")))
        kinds = layer_types(config)
        #: the local layers' half window: a query sees keys at most this many positions away
        self.window = int(config.get("local_attention", 128)) // 2
        self.shape = Shape(
            hidden_size=hidden,
            vocab_size=int(config["vocab_size"]),
            type_vocab_size=1,
            causal=False,
            attention_features=frozenset(["window"]) if LOCAL in kinds else frozenset(),
        )
        self.embed = reader.get("embeddings.tok_embeddings.weight")
        self.emb_norm = self._norm(reader, "embeddings.norm")
        self.layers = [self._layer(reader, i, kind == LOCAL) for i, kind in enumerate(kinds)]
        self.final_norm = self._norm(reader, "final_norm")
        positions = int(config.get("max_position_embeddings", 8192))
        thetas = rope_thetas(config)
        self.rope = {
            kind: _rope_tables(thetas[kind], self.head_dim, positions, self.embed.device)
            for kind in (GLOBAL, LOCAL)
        }

    def _norm(self, reader: WeightReader, name: str) -> LayerNorm:
        return LayerNorm(reader.get(name + ".weight"), reader.optional(name + ".bias"), self.eps)

    def _layer(self, reader: WeightReader, i: int, sliding: bool) -> _Layer:
        p = f"layers.{i}."
        return _Layer(
            attn_norm=self._norm(reader, p + "attn_norm") if i > 0 else None,
            qkv_w=reader.get(p + "attn.Wqkv.weight"),
            qkv_b=reader.optional(p + "attn.Wqkv.bias"),
            out_w=reader.get(p + "attn.Wo.weight"),
            out_b=reader.optional(p + "attn.Wo.bias"),
            mlp_norm=self._norm(reader, p + "mlp_norm"),
            in_w=reader.get(p + "mlp.Wi.weight"),
            in_b=reader.optional(p + "mlp.Wi.bias"),
            down_w=reader.get(p + "mlp.Wo.weight"),
            down_b=reader.optional(p + "mlp.Wo.bias"),
            sliding=sliding,
        )

    def forward(self, batch: DeviceBatch, plan: AttentionPlan) -> torch.Tensor:
        x = self.emb_norm(self.embed.index_select(0, batch.input_ids))  # [T, H]
        rope = {  # [T, 1, d] each
            kind: (
                c.index_select(0, batch.positions)[:, None],
                s.index_select(0, batch.positions)[:, None],
            )
            for kind, (c, s) in self.rope.items()
        }
        local = plan.windowed(self.window) if any(layer.sliding for layer in self.layers) else plan
        heads, d = self.heads, self.head_dim
        for layer in self.layers:
            h = x if layer.attn_norm is None else layer.attn_norm(x)
            qkv = F.linear(h, layer.qkv_w, layer.qkv_b).view(-1, 3 * heads, d)
            cos, sin = rope[LOCAL if layer.sliding else GLOBAL]
            qk = qkv[:, : 2 * heads].float()  # [T, 2 heads, d]: q and k rotated together
            qk = torch.addcmul(qk * cos, qk.roll(d // 2, dims=-1), sin).to(qkv.dtype)
            attended = (local if layer.sliding else plan).attend(
                qk[:, :heads], qk[:, heads:], qkv[:, 2 * heads :]
            )
            x = x + F.linear(attended.flatten(1), layer.out_w, layer.out_b)
            up, gate = F.linear(layer.mlp_norm(x), layer.in_w, layer.in_b).chunk(2, dim=-1)
            x = x + F.linear(self.act(up) * gate, layer.down_w, layer.down_b)
        return self.final_norm(x)

    def head(self, hidden: torch.Tensor, batch: DeviceBatch) -> torch.Tensor | None:
        return None


def load_modernbert(
    config: dict[str, Any], tensors: Tensors, dtype: torch.dtype, device: torch.device
) -> ModernBertEncoder:
    reader = WeightReader(strip_prefix(tensors, ("model.",)), dtype, device)
    return ModernBertEncoder(config, reader)

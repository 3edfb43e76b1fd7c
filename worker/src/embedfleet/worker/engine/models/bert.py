"""BERT-style encoders (BERT, MiniLM, BGE, E5, RoBERTa/XLM-R) over a ragged batch.

Post-norm transformer: embeddings (word + position + segment) -> LayerNorm, then per layer a fused
QKV projection, bidirectional attention within each sequence, output projection + residual +
LayerNorm, GELU MLP + residual + LayerNorm. DistilBERT and MPNet are this encoder under other
weight names (`distilbert.py`, `mpnet.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the universal alias

from embedfleet.common.modeldir import ModelDirError, position_offset
from embedfleet.worker.engine.attention import AttentionPlan
from embedfleet.worker.engine.batch import DeviceBatch
from embedfleet.worker.engine.models import Shape
from embedfleet.worker.engine.weights import Tensors, WeightReader, strip_prefix

ROBERTA_TYPES = ("roberta", "xlm-roberta", "camembert")

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ModelDirError(f"unsupported hidden_act {name!r}") from None


@dataclass(frozen=True, slots=True)
class LayerNorm:
    weight: torch.Tensor
    bias: torch.Tensor | None  # None: a norm without a bias (ModernBERT)
    eps: float

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


@dataclass(frozen=True, slots=True)
class _Layer:
    qkv_w: torch.Tensor  # [3 * H, H]: q, k, v fused at load
    qkv_b: torch.Tensor
    out_w: torch.Tensor
    out_b: torch.Tensor
    attn_norm: LayerNorm
    up_w: torch.Tensor
    up_b: torch.Tensor
    down_w: torch.Tensor
    down_b: torch.Tensor
    mlp_norm: LayerNorm


class BertEncoder:
    def __init__(self, config: dict[str, Any], reader: WeightReader) -> None:
        self.heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        self.head_dim = hidden // self.heads
        eps = float(config.get("layer_norm_eps", 1e-12))
        self.act = activation(str(config.get("hidden_act", "gelu")))
        types = int(config.get("type_vocab_size", 0) or 0)
        self.shape = Shape(
            hidden_size=hidden,
            vocab_size=int(config["vocab_size"]),
            type_vocab_size=max(types, 1),
            causal=False,
            position_offset=position_offset(config),
        )
        e = "embeddings."
        self.word = reader.get(e + "word_embeddings.weight")
        self.position = reader.get(e + "position_embeddings.weight")
        self.segment = reader.optional(e + "token_type_embeddings.weight")
        self.emb_norm = LayerNorm(
            reader.get(e + "LayerNorm.weight"), reader.get(e + "LayerNorm.bias"), eps
        )
        self.layers = [self._layer(reader, i, eps) for i in range(int(config["num_hidden_layers"]))]

    @staticmethod
    def _layer(reader: WeightReader, i: int, eps: float) -> _Layer:
        p = f"encoder.layer.{i}."
        a = p + "attention.self."
        names = ("query", "key", "value")
        return _Layer(
            qkv_w=reader.cat(a + n + ".weight" for n in names),
            qkv_b=reader.cat(a + n + ".bias" for n in names),
            out_w=reader.get(p + "attention.output.dense.weight"),
            out_b=reader.get(p + "attention.output.dense.bias"),
            attn_norm=LayerNorm(
                reader.get(p + "attention.output.LayerNorm.weight"),
                reader.get(p + "attention.output.LayerNorm.bias"),
                eps,
            ),
            up_w=reader.get(p + "intermediate.dense.weight"),
            up_b=reader.get(p + "intermediate.dense.bias"),
            down_w=reader.get(p + "output.dense.weight"),
            down_b=reader.get(p + "output.dense.bias"),
            mlp_norm=LayerNorm(
                reader.get(p + "output.LayerNorm.weight"),
                reader.get(p + "output.LayerNorm.bias"),
                eps,
            ),
        )

    def forward(self, batch: DeviceBatch, plan: AttentionPlan) -> torch.Tensor:
        x = self.word.index_select(0, batch.input_ids)  # [T, H]
        x = x + self.position.index_select(0, batch.positions)
        if self.segment is not None:
            x = x + self.segment.index_select(0, batch.type_ids)
        x = self.emb_norm(x)
        for layer in self.layers:
            qkv = F.linear(x, layer.qkv_w, layer.qkv_b)  # [T, 3H]
            q, k, v = qkv.view(-1, 3, self.heads, self.head_dim).unbind(1)  # [T, heads, d]
            attn = plan.attend(q, k, v).flatten(1)  # [T, H]
            x = layer.attn_norm(x + F.linear(attn, layer.out_w, layer.out_b))
            mlp = F.linear(
                self.act(F.linear(x, layer.up_w, layer.up_b)), layer.down_w, layer.down_b
            )
            x = layer.mlp_norm(x + mlp)
        return x

    def head(self, hidden: torch.Tensor, batch: DeviceBatch) -> torch.Tensor | None:
        return None


def bert_tensors(tensors: Tensors) -> Tensors:
    return strip_prefix(tensors, ("bert.", "roberta.", "model."))


def load_bert(
    config: dict[str, Any], tensors: Tensors, dtype: torch.dtype, device: torch.device
) -> BertEncoder:
    return BertEncoder(config, WeightReader(bert_tensors(tensors), dtype, device))

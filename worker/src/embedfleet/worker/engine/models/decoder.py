"""The pre-norm decoder forward every decoder family shares, over a ragged batch.

Per layer: RMSNorm, fused QKV GEMM (grouped-query heads), optional per-head q/k RMSNorm, rotary
positions, attention (causal or bidirectional within each sequence, optionally in a sliding
window), output GEMM, RMSNorm, fused gate_up GEMM, gated activation, down GEMM, with the residual
stream added between them. The families differ only in what their loaders put in `Layer`:
Llama-layout checkpoints (`llama.py`: Qwen3, Qwen2, Mistral) and Gemma3 (`gemma3.py`: norms on
the attention and MLP outputs too, (1 + w) norm weights, GeGLU, two rotary tables).

The elementwise steps go through `kernels.Kernels`: fused Triton kernels on CUDA, PyTorch ops on
a CPU. No KV cache: every forward is a whole prefill.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the universal alias

from embedfleet.common.modeldir import ModelDirError
from embedfleet.worker.engine.attention import AttentionPlan
from embedfleet.worker.engine.batch import DeviceBatch
from embedfleet.worker.engine.kernels.types import Activation, Kernels, Norm, QkvLayout
from embedfleet.worker.engine.models import Shape
from embedfleet.worker.engine.weights import Tensors, WeightReader, strip_prefix


def is_bidirectional(config: dict[str, Any]) -> bool:
    """Checkpoints that train a decoder without the causal mask say so in config.json."""
    return config.get("is_causal") is False or bool(config.get("use_bidirectional_attention"))


def rope_theta(config: dict[str, Any], layer_type: str = "full_attention") -> float:
    """The rotary base of a layer type: `rope_parameters` (per layer type where the family has
    several, as Gemma3 does), else the older top-level keys."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if layer_type in params:
        params = params[layer_type] or {}
    if params.get("rope_type", "default") not in ("default", None):
        raise ModelDirError(f"unsupported rope scaling {params!r}")
    if "rope_theta" in params:
        return float(params["rope_theta"])
    if layer_type == "sliding_attention" and "rope_local_base_freq" in config:
        return float(config["rope_local_base_freq"])
    return float(config.get("rope_theta", 1_000_000.0))


def layer_types(config: dict[str, Any]) -> list[str]:
    """Each layer's attention, "full_attention" or "sliding_attention", as config.json lists it
    or, for configs older than the list, as the family's config class derives it."""
    layers = int(config["num_hidden_layers"])
    listed = config.get("layer_types")
    if listed:
        return [str(t) for t in listed][:layers]
    kind = config.get("model_type")
    if kind in ("qwen2", "qwen3"):
        first = (
            int(config.get("max_window_layers", layers))
            if config.get("use_sliding_window")
            else layers
        )
        return ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
    if kind == "mistral":
        sliding = config.get("sliding_window") is not None
        return ["sliding_attention" if sliding else "full_attention"] * layers
    if kind == "gemma3_text":
        pattern = int(config.get("sliding_window_pattern", 6))
        return [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(layers)
        ]
    return ["full_attention"] * layers


def windows(config: dict[str, Any], bidirectional: bool) -> list[int]:
    """Each layer's window as `AttentionPlan.windowed` takes it (the farthest key a query sees;
    -1: no window). A causal window of W keys (Mistral, Qwen2) is W - 1 back. Bidirectional
    Gemma3 halves its window around the query, as `transformers` does (W // 2 each way)."""
    size = config.get("sliding_window")
    out = []
    for kind in layer_types(config):
        if kind != "sliding_attention" or not size:
            out.append(-1)
        elif bidirectional and config.get("model_type") == "gemma3_text":
            out.append(int(size) // 2)
        else:
            out.append(int(size) - 1)
    return out


def rope_tables(
    theta: float, head_dim: int, positions: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [positions, head_dim / 2], computed in float32 and rounded to `dtype`, as the
    reference computes them."""
    half = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (theta**half)
    angles = torch.outer(torch.arange(positions, dtype=torch.float32), inv_freq)
    return angles.cos().to(device, dtype), angles.sin().to(device, dtype)


@dataclass(frozen=True, slots=True)
class Layer:
    in_norm: Norm
    qkv_w: torch.Tensor  # [(Hq + 2 Hkv) d, H]: q, k, v fused at load
    qkv_b: torch.Tensor | None
    qk_norm: Norm | None  # [Hq + Hkv, d]: q_norm for each query head, then k_norm for each kv head
    out_w: torch.Tensor  # [H, Hq d]
    mlp_norm: Norm
    gate_up_w: torch.Tensor  # [2 I, H]: gate and up fused at load
    down_w: torch.Tensor  # [H, I]
    rope: int  # which of the decoder's rotary tables
    window: int  # -1, or the farthest key a query sees
    #: Gemma3's norms of the attention's and the MLP's outputs, before the residual add
    attn_out_norm: Norm | None = None
    mlp_out_norm: Norm | None = None


class Decoder:
    def __init__(
        self,
        shape: Shape,
        embed: torch.Tensor,
        layers: Sequence[Layer],
        norm: Norm,
        ropes: Sequence[tuple[torch.Tensor, torch.Tensor]],
        layout: QkvLayout,
        activation: Activation,
        kernels: Kernels,
    ) -> None:
        if not layers:
            raise ModelDirError("a decoder needs at least one layer")
        self.shape = shape
        self.embed = embed  # [vocab, H], any embedding scale folded in at load
        self.layers = list(layers)
        self.norm = norm
        self.ropes = list(ropes)
        self.layout = layout
        self.activation = activation
        self.kernels = kernels

    def forward(self, batch: DeviceBatch, plan: AttentionPlan) -> torch.Tensor:
        ops = self.kernels
        x = self.embed.index_select(0, batch.input_ids)  # [T, H], the residual stream
        rotary = [ops.rotary(cos, sin, batch.positions) for cos, sin in self.ropes]
        plans = {w: plan.windowed(w) if w >= 0 else plan for w in {la.window for la in self.layers}}
        h = ops.add_rms_norm(x, None, self.layers[0].in_norm, None)
        for i, layer in enumerate(self.layers):
            qkv = F.linear(h, layer.qkv_w, layer.qkv_b)  # [T, (Hq + 2 Hkv) d]
            q, k, v = ops.qk_norm_rope(qkv, rotary[layer.rope], self.layout, layer.qk_norm)
            attended = plans[layer.window].attend(q, k, v).flatten(1)  # [T, Hq d]
            h = ops.add_rms_norm(
                x, F.linear(attended, layer.out_w), layer.mlp_norm, layer.attn_out_norm
            )
            act = ops.glu(F.linear(h, layer.gate_up_w), self.activation)  # [T, I]
            following = self.layers[i + 1].in_norm if i + 1 < len(self.layers) else self.norm
            # The down GEMM's residual add rides in the next norm (the final one after the last).
            h = ops.add_rms_norm(x, F.linear(act, layer.down_w), following, layer.mlp_out_norm)
        return h

    def head(self, hidden: torch.Tensor, batch: DeviceBatch) -> torch.Tensor | None:
        return None


def decoder_shape(config: dict[str, Any], bidirectional: bool, slides: Sequence[int]) -> Shape:
    return Shape(
        hidden_size=int(config["hidden_size"]),
        vocab_size=int(config["vocab_size"]),
        type_vocab_size=1,
        causal=not bidirectional,
        attention_features=frozenset(["window"] if max(slides) >= 0 else []),
    )


#: a family's decoder from its config and weights (attention bidirectional or not; kernels
#: None: the device's)
Builder = Callable[[dict[str, Any], WeightReader, bool, Kernels | None], Decoder]


def load_decoder(
    build: Builder,
    config: dict[str, Any],
    tensors: Tensors,
    dtype: torch.dtype,
    device: torch.device,
    bidirectional: bool | None = None,
    kernels: Kernels | None = None,
) -> Decoder:
    """`build`'s decoder over a checkpoint (any "model." prefix stripped); causal unless
    `bidirectional` or config.json says otherwise."""
    if bidirectional is None:
        bidirectional = is_bidirectional(config)
    reader = WeightReader(strip_prefix(tensors, ("model.",)), dtype, device)
    return build(config, reader, bidirectional, kernels)

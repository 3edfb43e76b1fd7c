"""The decoder families on CUDA: the fused Triton path with CUDA graphs against the CPU, and the
kernels a fused layer launches, counted by the profiler (marked gpu: skipped without CUDA)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from embedfleet.common.modeldir import load_model_dir
from embedfleet.common.similarity import min_cosine
from embedfleet.worker.engine.attention import select_backend
from embedfleet.worker.engine.batch import pack, to_device
from embedfleet.worker.engine.config import EngineConfig
from embedfleet.worker.engine.kernels import fused
from embedfleet.worker.engine.models.decoder import load_decoder
from embedfleet.worker.engine.models.llama import llama_decoder
from embedfleet.worker.engine.torch_engine import TorchEngine
from embedfleet.worker.engine.weights import load_tensors

from .helpers import DECODER_FAMILIES, item, qwen3_config, random_sequences, save_model

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("family", DECODER_FAMILIES)
def test_decoder_graphs_on_gpu_match_cpu(decoder_dirs: dict[str, Path], family: str) -> None:
    path = decoder_dirs[family]
    seqs = random_sequences(400, (1, 5, 17, 64, 200), seed=5)
    cpu = TorchEngine(EngineConfig(model=str(path), device="cpu", dtype="float32"))
    gpu = TorchEngine(EngineConfig(model=str(path), device="cuda", cuda_graphs="lazy"))
    assert gpu.model.kernels.name == "triton"  # type: ignore[attr-defined]
    [ref] = cpu.run([item(seqs)])
    for _ in range(3):  # eager, capture, replay
        [got] = gpu.run([item(seqs)])
        assert min_cosine(got, ref) >= 0.999
    assert gpu.counters().replays == 1
    assert gpu.counters().rejects == 0


def _kernels(layers: int, tmp: Path) -> int:
    """Device kernels (and copies, fills) of one fused forward over 128 tokens, by the profiler."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import Qwen3Model

    torch.manual_seed(0)
    config = qwen3_config(num_hidden_layers=layers, hidden_size=1024, num_attention_heads=16,
                          num_key_value_heads=8, head_dim=128, intermediate_size=3072)  # fmt: skip
    path = save_model(Qwen3Model(config).eval(), tmp / str(layers))
    cfg = load_model_dir(path).config
    cuda = torch.device("cuda")
    model = load_decoder(
        llama_decoder, cfg, load_tensors(path), torch.bfloat16, cuda, None, fused()
    )
    host = pack([item([list(range(128))]).tokens])
    batch = to_device(host, cuda)
    backend = select_backend("auto", cuda, torch.bfloat16, graphs=True)
    plan = backend.plan(batch.cu_seqlens, host.lengths, 128, causal=True)
    with torch.inference_mode():
        model.forward(batch, plan)  # compile the kernels first
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            model.forward(batch, plan)
            torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")


def test_a_fused_layer_launches_nine_kernels_on_gpu(tmp_path: Path) -> None:
    per_layer = (_kernels(3, tmp_path) - _kernels(1, tmp_path)) / 2
    print(f"device kernels per layer: {per_layer}")
    assert per_layer <= 9

"""Decoder embedders (Qwen2, Mistral, Gemma3, bidirectional Qwen3) built by
`embedfleet.testing.families` from their published configs, against `transformers` with the same
weights; the fused Triton path (in the interpreter) against it too; and the launches a fused
layer makes.

Mistral and EmbeddingGemma run with a 16-token window here (4096 and 512 published), so that the
test sequences cross it on every path.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from embedfleet.common.codec import Tokens
from embedfleet.common.modeldir import load_model_dir
from embedfleet.common.similarity import min_cosine
from embedfleet.testing.families import decoder_vectors
from embedfleet.worker.engine.attention import GroupedBackend
from embedfleet.worker.engine.batch import pack, to_device
from embedfleet.worker.engine.forward import default_outputs
from embedfleet.worker.engine.kernels import torch_ops
from embedfleet.worker.engine.kernels.types import Kernels
from embedfleet.worker.engine.models.decoder import load_decoder
from embedfleet.worker.engine.models.family import GEMMA3_TYPES
from embedfleet.worker.engine.models.gemma3 import gemma3_decoder
from embedfleet.worker.engine.models.llama import llama_decoder
from embedfleet.worker.engine.pooling import Pooler
from embedfleet.worker.engine.weights import load_tensors

from .helpers import (
    DECODER_FAMILIES,
    RUNTIMES,
    WINDOWED,
    LaunchCounter,
    engine_for,
    interpreted_kernels,
    interpreted_modules,
    item,
    qwen3_config,
    random_sequences,
    save_model,
)

LENGTHS = (1, 2, 7, 16, 17, 33, 64, 100)


@pytest.fixture(scope="module")
def references(decoder_dirs: dict[str, Path]) -> dict[str, tuple[list[list[int]], np.ndarray]]:
    """Per family: the test sequences and `transformers`' pooled rows for them (float32)."""
    out = {}
    for name, path in decoder_dirs.items():
        model_dir = load_model_dir(path)
        seqs = random_sequences(int(model_dir.config["vocab_size"]), LENGTHS, seed=3)
        out[name] = (seqs, decoder_vectors(path, seqs, mean=model_dir.pooling == "mean"))
    return out


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("dtype", ["float32", "auto"])
@pytest.mark.parametrize("family", DECODER_FAMILIES)
def test_decoder_parity(
    decoder_dirs: dict[str, Path],
    references: dict[str, tuple[list[list[int]], np.ndarray]],
    family: str,
    dtype: str,
    runtime: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One mixed batch, then single inputs, at float32 and at the dtype auto keeps."""
    engine = engine_for(decoder_dirs[family], dtype, monkeypatch, runtime)
    seqs, ref = references[family]
    bidirectional = "pplx" in family or "gemma" in family
    assert engine.shape.causal is not bidirectional
    assert engine.info.default_pooling == ("mean" if bidirectional else "last_token")
    assert ("window" in engine.shape.attention_features) is (family in WINDOWED)
    [got] = engine.run([item(seqs)])
    assert min_cosine(got, ref) >= 0.999
    alone = engine.run([item([s]) for s in (seqs[0], seqs[-1])])
    assert min_cosine(np.concatenate(alone), ref[[0, -1]]) >= 0.999
    if dtype == "float32":
        np.testing.assert_allclose(got, ref, atol=2e-3)


def test_the_window_is_applied(decoder_dirs: dict[str, Path]) -> None:
    """The same Mistral weights without their window give other vectors past 16 tokens."""
    path = decoder_dirs["e5-mistral-7b-instruct"]
    model_dir = load_model_dir(path)
    config = {**model_dir.config, "sliding_window": None}
    tensors = load_tensors(path)
    seqs = random_sequences(int(config["vocab_size"]), (8, 40), seed=4)
    tokens = item(seqs).tokens
    cpu = torch.device("cpu")
    pooler = Pooler.of(model_dir, cpu)
    windowed = load_decoder(llama_decoder, model_dir.config, tensors, torch.float32, cpu)
    full = load_decoder(llama_decoder, config, tensors, torch.float32, cpu)
    a = default_outputs(windowed, GroupedBackend(), pooler, tokens, cpu)
    b = default_outputs(full, GroupedBackend(), pooler, tokens, cpu)
    assert min_cosine(a[:1], b[:1]) > 0.99999  # within the window: the same
    assert min_cosine(a[1:], b[1:]) < 0.999


# ---- the fused (Triton) path, in the interpreter -------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", DECODER_FAMILIES)
def test_fused_path_parity(
    decoder_dirs: dict[str, Path],
    references: dict[str, tuple[list[list[int]], np.ndarray]],
    fused_kernels: Kernels,
    family: str,
    dtype: torch.dtype,
) -> None:
    """The model on the Triton kernels (as CUDA runs it, but in the interpreter on the CPU),
    against `transformers` float32: a mixed batch of the shorter test sequences."""
    path = decoder_dirs[family]
    model_dir = load_model_dir(path)
    build = gemma3_decoder if model_dir.model_type in GEMMA3_TYPES else llama_decoder
    cpu = torch.device("cpu")
    model = load_decoder(
        build, model_dir.config, load_tensors(path), dtype, cpu, None, fused_kernels
    )
    seqs, ref = references[family]
    count = 6  # up to 33 tokens: the interpreter runs each program in numpy
    tokens = item(seqs[:count]).tokens
    got = default_outputs(model, GroupedBackend(), Pooler.of(model_dir, cpu), tokens, cpu)
    got = got / np.linalg.norm(got, axis=-1, keepdims=True)
    assert min_cosine(got, ref[:count]) >= 0.999


# ---- launches per layer --------------------------------------------------------------------------


def launches(
    kernels: Kernels, layers: int, modules: dict[str, ModuleType] | None, tmp: Path
) -> int:
    """What one forward of a Qwen3 of `layers` layers launches over one 12-token sequence."""
    from transformers import Qwen3Model

    torch.manual_seed(0)
    path = save_model(Qwen3Model(qwen3_config(num_hidden_layers=layers)).eval(), tmp / str(layers))
    model_dir = load_model_dir(path)
    cpu = torch.device("cpu")
    model = load_decoder(
        llama_decoder, model_dir.config, load_tensors(path), torch.float32, cpu, None, kernels
    )
    host = pack([Tokens(np.arange(12, dtype=np.int32), np.array([12], np.int32))])
    batch = to_device(host, cpu)
    plan = GroupedBackend().plan(batch.cu_seqlens, host.lengths, 12, causal=True)
    counter = LaunchCounter()
    if modules is not None:
        counter.count_triton(modules)
    with torch.inference_mode(), counter:
        model.forward(batch, plan)
    return counter.total()


def test_a_fused_layer_launches_nine_kernels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Measured, per layer (three layers' launches less one layer's, halved): the fused path's
    add+RMSNorm, QKV GEMM, q/k-norm+RoPE, attention, o-proj GEMM, add+RMSNorm, gate_up GEMM,
    GLU, down GEMM; the PyTorch path's ops, more of them."""
    pytest.importorskip("triton")
    modules = interpreted_modules()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    fused = interpreted_kernels(modules)
    per_layer = {}
    for name, kernels, counted in (("fused", fused, modules), ("torch", torch_ops.KERNELS, None)):
        one, three = (launches(kernels, n, counted, tmp_path / name) for n in (1, 3))
        per_layer[name] = (three - one) / 2
    print(f"launches per layer: {per_layer}")
    assert per_layer["fused"] <= 9
    assert per_layer["torch"] > per_layer["fused"]

"""Engine test fixtures: the real MiniLM, and random-weight models saved by `transformers`."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from embedfleet.common.modeldir import default_model_path
from embedfleet.testing.families import decoder_embedder
from embedfleet.worker.engine.kernels.types import Kernels
from embedfleet.worker.engine.torch_engine import TorchEngine

from .helpers import (
    DECODER_FAMILIES,
    PARITY_LENGTHS,
    WINDOWED,
    interpreted_kernels,
    interpreted_modules,
    minilm,
    qwen3_config,
    save_model,
    write_pooling,
)


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    return default_model_path()


@pytest.fixture(scope="session")
def minilm_sequences(minilm_path: Path) -> list[list[int]]:
    """Real text cut to each parity length: [CLS] words... [SEP]."""
    from embedfleet.common.modeldir import load_model_dir

    tok = load_model_dir(minilm_path).tokenizer()
    text = (
        "Embedding models turn sentences into vectors; the engine packs many of them into one "
        "ragged batch and must give the same answer as the reference implementation. "
    ) * 40
    body = tok.encode(text, add_special_tokens=False).ids
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    out = []
    for n in PARITY_LENGTHS:
        seq = [cls, *body[: max(0, n - 2)], sep][:n]
        out.append(seq)
    return out


@pytest.fixture(scope="session")
def minilm_reference(minilm_path: Path, minilm_sequences: list[list[int]]) -> np.ndarray:
    """sentence-transformers' modules (BERT, mean pooling, normalize) on padded batches, fp32."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(minilm_path), device="cpu")
    out = []
    with torch.inference_mode():
        for start in range(0, len(minilm_sequences), 8):
            chunk = minilm_sequences[start : start + 8]
            width = max(len(s) for s in chunk)
            ids = torch.zeros((len(chunk), width), dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for i, s in enumerate(chunk):
                ids[i, : len(s)] = torch.tensor(s)
                mask[i, : len(s)] = 1
            features = {"input_ids": ids, "attention_mask": mask, "token_type_ids": 0 * ids}
            out.append(st(features)["sentence_embedding"].numpy())
    return np.concatenate(out)


@pytest.fixture(scope="session")
def minilm_fp32() -> TorchEngine:
    return minilm("float32", "eager")


@pytest.fixture(scope="session")
def minilm_bf16() -> TorchEngine:
    return minilm("bfloat16", "eager")


# ---- random-weight models ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def qwen3_causal_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(qwen3_config()).eval()  # saved with the "model." prefix
    return save_model(model, tmp_path_factory.mktemp("qwen3-causal"))


@pytest.fixture(scope="session")
def qwen3_bidir_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import Qwen3Model

    torch.manual_seed(1)
    model = Qwen3Model(qwen3_config()).eval()
    path = save_model(model, tmp_path_factory.mktemp("qwen3-bidir"), legacy_bin=True)
    config = json.loads((path / "config.json").read_text())
    config["is_causal"] = False
    (path / "config.json").write_text(json.dumps(config))
    write_pooling(path, "mean_tokens", normalize=True)
    return path


@pytest.fixture(scope="session")
def decoder_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every decoder family's random-weight directory (testing.families.decoder_embedder)."""
    root = tmp_path_factory.mktemp("decoders")
    return {
        name: decoder_embedder(
            root, name, **({"sliding_window": WINDOWED[name]} if name in WINDOWED else {})
        )
        for name in DECODER_FAMILIES
    }


# ---- Triton kernels in the interpreter ---------------------------------------------------------


@pytest.fixture(scope="session")
def triton_modules() -> dict[str, ModuleType]:
    pytest.importorskip("triton")  # the CUDA build of torch ships it; a CPU-only torch may not
    return interpreted_modules()


@pytest.fixture
def fused_kernels(
    triton_modules: dict[str, ModuleType], monkeypatch: pytest.MonkeyPatch
) -> Kernels:
    """The Triton kernels on CPU tensors, in the interpreter (set for the test's launches)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    return interpreted_kernels(triton_modules)

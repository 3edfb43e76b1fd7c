"""Fixtures shared by the engine and server tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def cross_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight BERT cross-encoder (one logit), saved as transformers saves it."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(2)
    config = BertConfig(
        vocab_size=500,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
        num_labels=1,
    )  # type: ignore[call-arg]
    model = BertForSequenceClassification(config).eval()  # type: ignore[no-untyped-call]
    path = tmp_path_factory.mktemp("cross-encoder")
    model.save_pretrained(str(path))
    return path

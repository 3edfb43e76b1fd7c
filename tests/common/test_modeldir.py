from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from embedfleet.common.modeldir import (
    ModelDirError,
    default_model_path,
    load_model_dir,
    resolve_model_path,
)


def test_bundled_minilm_is_found_and_described() -> None:
    model = load_model_dir(resolve_model_path(""))
    assert model.path == default_model_path()
    assert model.name == "sentence-transformers/all-MiniLM-L6-v2"
    assert model.model_type == "bert"
    assert (model.task, model.pooling, model.normalize) == ("embed", "mean", True)
    assert model.hidden_size == 384
    # sentence-transformers caps MiniLM at 256 while its positions allow 512.
    assert (model.default_max_tokens, model.position_limit) == (256, 512)
    assert model.max_input_tokens(None) == 256
    assert model.max_input_tokens(512) == 512
    with pytest.raises(ModelDirError, match="513"):
        model.max_input_tokens(513)


def test_tokenizer_does_not_truncate_or_pad() -> None:
    # The packaged tokenizer.json truncates and pads to 128; ours must do neither.
    tok = load_model_dir(default_model_path()).tokenizer()
    long_ids = tok.encode("word " * 300).ids
    assert len(long_ids) == 302
    assert len(tok.encode("hi").ids) == 3


def test_file_url_and_bad_directories(tmp_path: Path) -> None:
    copy = tmp_path / "m"
    shutil.copytree(default_model_path(), copy)
    assert resolve_model_path(f"file://{copy}") == copy
    with pytest.raises(ModelDirError, match=r"no config\.json"):
        resolve_model_path(str(tmp_path))
    (copy / "config.json").write_text("{not json")
    with pytest.raises(ModelDirError, match="invalid JSON"):
        load_model_dir(copy)


def test_cross_encoder_and_qwen3_conventions(tmp_path: Path) -> None:
    ce = tmp_path / "ce"
    ce.mkdir()
    (ce / "config.json").write_text(
        json.dumps(
            {
                "model_type": "bert",
                "architectures": ["BertForSequenceClassification"],
                "hidden_size": 8,
                "vocab_size": 10,
                "max_position_embeddings": 64,
            }
        )
    )
    assert load_model_dir(ce).task == "score"
    qw = tmp_path / "qw"
    qw.mkdir()
    (qw / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen3",
                "hidden_size": 8,
                "vocab_size": 10,
                "max_position_embeddings": 4096,
            }
        )
    )
    q = load_model_dir(qw)
    assert (q.task, q.pooling, q.normalize, q.default_max_tokens) == (
        "embed",
        "last_token",
        True,
        4096,
    )

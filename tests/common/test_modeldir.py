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


def _dir(root: Path, name: str, config: dict[str, object], modules: object = None) -> Path:
    path = root / name
    path.mkdir()
    base = {"hidden_size": 8, "vocab_size": 10, "max_position_embeddings": 64}
    (path / "config.json").write_text(json.dumps({**base, **config}))
    if modules is not None:
        (path / "modules.json").write_text(json.dumps(modules))
    return path


def test_family_task_and_head_from_the_architecture(tmp_path: Path) -> None:
    def seq_cls(labels: int, **extra: object) -> dict[str, object]:
        return {"model_type": "bert", "architectures": ["BertForSequenceClassification"],
                "id2label": {str(i): f"L{i}" for i in range(labels)}, **extra}  # fmt: skip

    cases: list[tuple[str, dict[str, object], object, tuple[str, str, str]]] = [
        ("one-label", seq_cls(1), None, ("score", "classifier", "sigmoid")),
        ("three", seq_cls(3), None, ("classify", "classifier", "softmax")),
        ("multi", seq_cls(3, problem_type="multi_label_classification"), None,
         ("classify", "classifier", "sigmoid")),
        ("regression", seq_cls(1, problem_type="regression"), None,
         ("score", "classifier", "none")),
        ("mlm", {"model_type": "bert", "architectures": ["BertForMaskedLM"]}, None,
         ("sparse", "splade", "sigmoid")),
        ("mlm-pooled", {"model_type": "bert", "architectures": ["BertForMaskedLM"]},
         [{"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"}],
         ("embed", "pool", "sigmoid")),
        ("mlm-splade", {"model_type": "bert", "architectures": ["BertForMaskedLM"]},
         [{"type": "sentence_transformers.sparse_encoder.models.SpladePooling", "path": "1"}],
         ("sparse", "splade", "sigmoid")),
        ("Qwen3-Reranker-4B", {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]},
         None, ("score", "yes_no", "sigmoid")),
        ("Qwen3-Embedding-4B", {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]},
         None, ("embed", "pool", "sigmoid")),
    ]  # fmt: skip
    for name, config, modules, (task, head, activation) in cases:
        model = load_model_dir(_dir(tmp_path, name, config, modules))
        assert (model.task, model.head, model.activation) == (task, head, activation), name
    three = load_model_dir(tmp_path / "three")
    assert three.labels == ("L0", "L1", "L2")
    assert load_model_dir(tmp_path / "Qwen3-Embedding-4B").normalize  # embedders keep theirs


def test_explicit_task_is_checked_against_the_checkpoint(tmp_path: Path) -> None:
    qwen = _dir(tmp_path, "q", {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]})
    assert load_model_dir(qwen, "score").head == "yes_no"
    assert load_model_dir(qwen, "auto").task == "embed"
    one = _dir(tmp_path, "one", {"model_type": "bert", "id2label": {"0": "relevant"},
                                 "architectures": ["BertForSequenceClassification"]})  # fmt: skip
    assert load_model_dir(one, "classify").labels == ("relevant",)
    classifier = ["BertForSequenceClassification"]
    three = _dir(tmp_path, "three", {"model_type": "bert", "num_labels": 3,
                                     "architectures": classifier})  # fmt: skip
    assert load_model_dir(three).labels == ("LABEL_0", "LABEL_1", "LABEL_2")
    with pytest.raises(ModelDirError, match="one-label classifier; this one has 3 labels"):
        load_model_dir(three, "score")
    with pytest.raises(ModelDirError, match="task sparse does not fit"):
        load_model_dir(one, "sparse")
    with pytest.raises(ModelDirError, match="unknown task 'generate'"):
        load_model_dir(one, "generate")
    bad = _dir(tmp_path, "bad", {"architectures": ["BertForSequenceClassification"],
                                 "id2label": {"0": "a", "2": "b"}})  # fmt: skip
    with pytest.raises(ModelDirError, match=r"ids are not 0\.\.1"):
        load_model_dir(bad)
    splade_sum = _dir(
        tmp_path, "sum", {"model_type": "bert", "architectures": ["BertForMaskedLM"]},
        [{"type": "sentence_transformers.sparse_encoder.models.SpladePooling", "path": "p"}],
    )  # fmt: skip
    (splade_sum / "p").mkdir()
    (splade_sum / "p" / "config.json").write_text(json.dumps({"pooling_strategy": "sum"}))
    with pytest.raises(ModelDirError, match="max/relu only"):
        load_model_dir(splade_sum)

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
    with pytest.raises(ModelDirError, match=r"sparse: a \*ForMaskedLM or bge-m3's sparse_linear"):
        load_model_dir(one, "sparse")
    # bge-m3's sparse_linear.pt serves sparse when asked; a masked-LM with one stays SPLADE.
    cases = {"m3": ("XLMRobertaModel", "lexical"), "mlm": ("BertForMaskedLM", "splade")}
    for name, (arch, head) in cases.items():
        both = _dir(tmp_path, name, {"model_type": "xlm-roberta", "architectures": [arch]})
        (both / "sparse_linear.pt").touch()
        assert load_model_dir(both, "sparse").head == head
    assert load_model_dir(tmp_path / "m3").task == "embed"
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


def _model_dir(
    root: Path, config: dict[str, object], modules: list[dict[str, str]] | None = None
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    if modules is not None:
        (root / "modules.json").write_text(json.dumps(modules))
    return root


def _st(kind: str, path: str) -> dict[str, str]:
    return {"path": path, "type": f"sentence_transformers.models.{kind}"}


BERT = {"model_type": "bert", "hidden_size": 8, "vocab_size": 10}


@pytest.mark.parametrize(
    ("pooling_config", "want"),
    [
        ({"pooling_mode": "weightedmean"}, "weighted_mean"),
        ({"pooling_mode": ["max"]}, "max"),
        ({"pooling_mode_mean_sqrt_len_tokens": True}, "mean_sqrt_len"),
        ({"pooling_mode_lasttoken": True, "pooling_mode_cls_token": False}, "last_token"),
        ({"word_embedding_dimension": 8}, "mean"),  # no mode set: sentence-transformers' default
    ],
)
def test_pooling_modes_in_both_config_layouts(
    tmp_path: Path, pooling_config: dict[str, object], want: str
) -> None:
    path = _model_dir(tmp_path, BERT, [_st("Transformer", ""), _st("Pooling", "1_Pooling")])
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config))
    assert load_model_dir(path).pooling == want


def test_unservable_sentence_transformers_modules_are_refused(tmp_path: Path) -> None:
    pooling = [_st("Transformer", ""), _st("Pooling", "1_Pooling")]

    def refused(modules: list[dict[str, str]], pool: dict[str, object], match: str) -> None:
        path = _model_dir(tmp_path / match.replace(" ", "_")[:20], BERT, modules)
        (path / "1_Pooling").mkdir(exist_ok=True)
        (path / "1_Pooling" / "config.json").write_text(json.dumps(pool))
        (path / "config_sentence_transformers.json").write_text(
            json.dumps({"prompts": {"query": "query: "}})
        )
        with pytest.raises(ModelDirError, match=match):
            load_model_dir(path)

    refused(pooling, {"pooling_mode": ["cls", "mean"]}, "pooling")
    refused(pooling, {"pooling_mode": "mean", "include_prompt": False}, "include_prompt")
    refused([*pooling, _st("LSTM", "2_LSTM")], {}, "module LSTM")
    refused([*pooling, _st("Normalize", "2"), _st("Dense", "3_Dense")], {}, "after Normalize")


def test_dense_modules_set_the_embedding_size(tmp_path: Path) -> None:
    modules = [_st("Transformer", ""), _st("Pooling", "1_Pooling"), _st("Dense", "2_Dense")]
    path = _model_dir(tmp_path, BERT, modules)
    (path / "2_Dense").mkdir()
    dense = {"in_features": 8, "out_features": 3, "bias": False}
    for activation, ok in (("torch.nn.modules.activation.Tanh", True), ("mymodule.Swish", False)):
        config = {**dense, "activation_function": activation}
        (path / "2_Dense" / "config.json").write_text(json.dumps(config))
        if not ok:
            with pytest.raises(ModelDirError, match="Swish"):
                load_model_dir(path)
            continue
        model = load_model_dir(path)
        assert (model.hidden_size, model.embedding_size) == (8, 3)
        assert model.dense[0].activation == "Tanh"
        assert not model.dense[0].bias


def test_family_conventions_distilbert_names_and_mpnet_positions(tmp_path: Path) -> None:
    distil = {"model_type": "distilbert", "dim": 12, "n_heads": 3, "n_layers": 2,
              "hidden_dim": 48, "activation": "gelu", "vocab_size": 10}  # fmt: skip
    model = load_model_dir(_model_dir(tmp_path / "d", distil))
    assert (model.hidden_size, model.config["num_attention_heads"]) == (12, 3)
    assert model.config["intermediate_size"] == 48
    assert model.position_limit == 512
    mpnet = {**BERT, "model_type": "mpnet", "max_position_embeddings": 514, "pad_token_id": 1}
    # MPNet's position ids start at 2, as RoBERTa's: 514 embeddings hold 512 tokens.
    assert load_model_dir(_model_dir(tmp_path / "m", mpnet)).position_limit == 512

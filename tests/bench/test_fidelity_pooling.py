"""The bench's `transformers` reference pools as the model's sentence-transformers module says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from embedfleet.bench.fidelity import pool, pooling_mode


def model_dir(tmp_path: Path, pooling: dict[str, object] | None) -> Path:
    tmp_path.mkdir()
    if pooling is not None:
        (tmp_path / "1_Pooling").mkdir()
        (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
        modules = [{"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        (tmp_path / "modules.json").write_text(json.dumps(modules))
    return tmp_path


def test_the_mode_is_read_in_either_spelling_and_mean_without_a_module(tmp_path: Path) -> None:
    assert pooling_mode(model_dir(tmp_path / "a", {"pooling_mode": "lasttoken"})) == "lasttoken"
    old = {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}
    assert pooling_mode(model_dir(tmp_path / "b", old)) == "cls"
    assert pooling_mode(model_dir(tmp_path / "c", None)) == "mean"
    both = {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True}
    with pytest.raises(ValueError, match="no reference"):
        pooling_mode(model_dir(tmp_path / "d", both))


def test_each_mode_pools_the_real_tokens_only() -> None:
    hidden = torch.tensor([[1.0, 0.0], [3.0, 4.0], [5.0, -2.0], [9.0, 9.0]])
    mask = torch.tensor([1, 1, 1, 0])  # the last row is padding
    assert pool(hidden, mask, "cls").tolist() == [1.0, 0.0]
    assert pool(hidden, mask, "lasttoken").tolist() == [5.0, -2.0]
    assert pool(hidden, mask, "max").tolist() == [5.0, 4.0]
    assert pool(hidden, mask, "mean").tolist() == pytest.approx([3.0, 2.0 / 3.0])

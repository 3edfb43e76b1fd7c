"""Gateway test fixtures: the bundled model directory, shared by every test."""

from __future__ import annotations

import pytest

from embedfleet.common.modeldir import ModelDir, default_model_path, load_model_dir


@pytest.fixture(scope="session")
def minilm() -> ModelDir:
    return load_model_dir(default_model_path())

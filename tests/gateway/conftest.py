"""Gateway test fixtures: the binary built from this tree's gateway/ (built once, cached by
content), the bundled model's directory, and the binary in front of two FAKE workers or of one
real null-engine worker, one per module that asks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from embedfleet.common.modeldir import ModelDir, default_model_path, load_model_dir
from embedfleet.testing.gateway import gateway_binary
from embedfleet.testing.workers import running_worker

from .helpers import LIMITS, Gateway, fake_fleet, serving


@pytest.fixture(scope="session", autouse=True)
def binary() -> Path:
    """Built before the first test, so that no test's timeout pays for a cold build."""
    return gateway_binary()


@pytest.fixture(scope="session")
def minilm() -> ModelDir:
    return load_model_dir(default_model_path())


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """LIMITS, in front of two FAKE workers both numbered 0: a row is the same wherever it
    landed, and the fakes' calls show the gateway's chunking."""
    with fake_fleet(LIMITS, tmp_path_factory.mktemp("fakes") / "gateway.log") as gateway:
        yield gateway


@pytest.fixture(scope="module")
def null(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """LIMITS, in front of one real worker process with the null engine, whose row of an input
    is [its tokens, the sum of its ids, its first id, 0, ...]."""
    workdir = tmp_path_factory.mktemp("null")
    with (
        running_worker(workdir, "--engine", "null", "--warmup-seconds", "0.2") as worker,
        serving(LIMITS, workdir / "gateway.log", addresses=[worker.address]) as gateway,
    ):
        yield gateway

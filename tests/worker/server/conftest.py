"""A real MiniLM worker process shared by the module, with its start-up observed from outside."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from embedfleet.common.modeldir import default_model_path, load_model_dir
from embedfleet.testing.workers import WorkerProcess, start_worker, worker_stub

from .helpers import WORKER_ARGS, Served, wait_serving_traced


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    worker = start_worker(tmp_path_factory.mktemp("worker"), *WORKER_ARGS)
    try:
        startup = wait_serving_traced(worker)
        yield Served(worker, startup, worker_stub(worker.channel()))
    finally:
        worker.stop()


@pytest.fixture(scope="module")
def null_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """A real worker process on the null engine: the server's own paths, no compute."""
    proc = start_worker(
        tmp_path_factory.mktemp("null-worker"), "--engine", "null", "--warmup-seconds", "0.2"
    )
    try:
        proc.wait_serving(120)
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return load_model_dir(default_model_path()).tokenizer()


@pytest.fixture(scope="session")
def model_path() -> Path:
    return default_model_path()

"""The Python gateway (the reference) and the Rust one side by side, each in front of its own
pair of FAKE workers (so each pair's calls show how its gateway chunked), or both in front of
one real null-engine worker."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from embedfleet.common.modeldir import ModelDir, default_model_path, load_model_dir
from embedfleet.gateway.settings import GatewaySettings
from embedfleet.testing.gateway_rs import child_env, gateway_rs_binary
from embedfleet.testing.workers import running_worker
from tests.gateway.fakes import FakeWorker
from tests.gateway.helpers import wait_until

from .pair import Pair, gateways

#: settings both gateways run with: small limits, so the 413s are cheap to reach
LIMITS = {
    "max_client_batch": 64,
    "max_request_tokens": 10_000,
    "max_body_bytes": 400_000,
    "probe_seconds": 0.1,
    "eject_seconds": 0.2,
}


def flags(settings: dict[str, object]) -> list[str]:
    return [f for k, v in settings.items() for f in (f"--{k.replace('_', '-')}", str(v))]


def run_binary(
    binary: Path, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The binary run to its exit (a refusal at start, the tests expect), output captured."""
    return subprocess.run(
        [str(binary), *argv],
        env=child_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


#: small chunks, so a request of a few inputs already travels as several calls
SMALL_CHUNKS = {**LIMITS, "chunk_tokens": 64, "min_chunk_tokens": 16}


@contextlib.contextmanager
def behind_worker(
    path: Path, workdir: Path, extra: dict[str, object] | None = None, engine: str = "null"
) -> Iterator[Pair]:
    """Both gateways serving the model directory `path` (SMALL_CHUNKS and `extra`, which the
    worker gets too) in front of one real worker process: the null engine, or with "torch"
    one computing real numbers (one thread)."""
    extra = extra or {}
    own = ("--engine", "null") if engine == "null" else ("--threads", "1")
    argv = (*own, "--warmup-seconds", "0.2", "--model", str(path), *flags(extra))
    with running_worker(workdir, *argv) as worker:
        settings = GatewaySettings(
            model=str(path), workers=(worker.address,), **SMALL_CHUNKS, **extra
        )  # type: ignore[arg-type]
        rust = [
            "--model",
            str(path),
            "--workers",
            worker.address,
            *flags({**SMALL_CHUNKS, **extra}),
        ]
        # The Python gateway serves the ModelDir it is handed, so that carries the task.
        model = load_model_dir(path, str(extra.get("task", "")))
        with gateways(model, settings, rust, workdir / "gateway-rs.log") as pair:
            wait_until("worker ready", lambda: pair.worker_counts() == [(1, 1)] * 2)
            yield pair


@pytest.fixture(scope="session")
def minilm() -> ModelDir:
    return load_model_dir(default_model_path())


@pytest.fixture(scope="session")
def rust_binary() -> Path:
    return gateway_rs_binary()


@contextlib.contextmanager
def fake_gateways(
    minilm: ModelDir,
    settings: dict[str, object],
    log: Path,
    make: Callable[[int], FakeWorker] = FakeWorker,
    numbers: tuple[int, int] = (0, 0),
) -> Iterator[Pair]:
    """Each gateway with `settings` in front of two fakes of its own (`make(number)`, started),
    once both count them ready; the fakes stopped after the block."""
    py_workers = [make(n).start() for n in numbers]
    rs_workers = [make(n).start() for n in numbers]
    python = GatewaySettings(workers=tuple(w.address for w in py_workers), **settings)  # type: ignore[arg-type]
    rust = ["--workers", ",".join(w.address for w in rs_workers), *flags(settings)]
    try:
        with gateways(minilm, python, rust, log, (py_workers, rs_workers)) as pair:
            wait_until("workers ready", lambda: pair.worker_counts() == [(2, 2)] * 2)
            yield pair
    finally:
        for w in py_workers + rs_workers:
            w.stop()


@pytest.fixture(scope="module")
def fake_pair(
    minilm: ModelDir, rust_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pair]:
    """Each gateway in front of two fake workers numbered alike: answers are equal wherever
    they landed, and each pair's recorded calls show its gateway's chunking."""
    log = tmp_path_factory.mktemp("gateway_rs") / "gateway-rs.log"
    with fake_gateways(minilm, LIMITS, log) as pair:
        yield pair


@pytest.fixture(scope="module")
def null_pair(
    minilm: ModelDir, rust_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pair]:
    """Both gateways in front of one real worker process with the null engine."""
    workdir = tmp_path_factory.mktemp("gateway_rs_null")
    with running_worker(workdir, "--engine", "null", "--warmup-seconds", "0.2") as worker:
        settings = GatewaySettings(workers=(worker.address,), **LIMITS)  # type: ignore[arg-type]
        rust = ["--workers", worker.address, *flags(LIMITS)]
        with gateways(minilm, settings, rust, workdir / "gateway-rs.log") as pair:
            wait_until("worker ready", lambda: pair.worker_counts() == [(1, 1)] * 2)
            yield pair

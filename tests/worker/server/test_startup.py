"""Workers of their own: a failing self-check, the null engine, a scoring model, a taken port."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest

from embedfleet.common.codec import pack_tokens
from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.testing.polling import wait_for
from embedfleet.testing.workers import (
    front_library,
    health_status,
    running_worker,
    start_worker,
    worker_stub,
)

from .helpers import embed_request, vectors


def _mispooled_copy(model_path: Path, into: Path) -> Path:
    """The real MiniLM weights (symlinked) served with CLS instead of mean pooling.

    The weights' digest still selects the committed sentence-transformers reference, whose vectors
    are mean-pooled, so only a self-check that really compares values can catch it.
    """
    into.mkdir()
    for entry in model_path.iterdir():
        if entry.name != "1_Pooling":
            (into / entry.name).symlink_to(entry)
    (into / "1_Pooling").mkdir()
    config = json.loads((model_path / "1_Pooling" / "config.json").read_text())
    config.update(pooling_mode_cls_token=True, pooling_mode_mean_tokens=False)
    (into / "1_Pooling" / "config.json").write_text(json.dumps(config))
    return into


def test_failed_selfcheck_never_becomes_ready(tmp_path: Path, model_path: Path) -> None:
    model = _mispooled_copy(model_path, tmp_path / "model")
    worker = start_worker(tmp_path, "--model", str(model), "--warmup-seconds", "0.2")
    seen = set()
    try:

        def exited() -> bool:
            if worker.proc.poll() is not None:
                return True
            if worker.port or worker.port_file.is_file():
                if not worker.port:
                    worker.wait_port(5)
                seen.add(health_status(worker.address, timeout=0.5))
            return False

        wait_for("the worker to exit", exited, timeout=240, interval=0.05)
        assert worker.proc.wait(timeout=5) == 1
    finally:
        worker.stop()
    assert "SERVING" not in seen
    assert "NOT_SERVING" in seen
    failures = [r for r in worker.log_records() if r.get("msg") == "start-up failed"]
    assert len(failures) == 1
    assert "SelfCheckError" in failures[0]["exc"]
    assert "min cosine" in failures[0]["exc"]


def test_null_engine_serves_replies_derived_from_the_ids(tmp_path: Path) -> None:
    args = ("--engine", "null", "--warmup-seconds", "0.1", "--capacity-measurement", "startup")
    with running_worker(tmp_path, *args) as worker:
        stub = worker_stub(worker.channel())
        seqs = [[101, 7, 102], [101, 5, 6, 8, 102]]
        got = vectors(stub.Embed(embed_request(seqs), timeout=10))
        assert got.shape == (2, 384)
        assert np.array_equal(got[:, :3], [[3, 210, 101], [5, 222, 101]])
        info = stub.Info(pb.InfoRequest())
        assert info.device == "null"
        assert info.ready
        with pytest.raises(grpc.RpcError) as refused:
            stub.Embed(embed_request([[101, 40000]]), timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert worker.metric("embedfleet_worker_capacity_tokens_per_second") > 0
        assert worker.metric("embedfleet_worker_eager_runs_total") > 0


def test_score_rpc_matches_transformers(tmp_path: Path, cross_encoder_dir: Path) -> None:
    """Through the OpenVINO runtime, whose converter (its telemetry) used to fork() after gRPC
    started: each fork wrote a `fork_posix.cc ... skipping fork() handlers` line to stderr."""
    import torch
    from transformers import BertForSequenceClassification

    model = cross_encoder_dir
    rng = np.random.default_rng(0)
    pairs = [rng.integers(5, 500, n).tolist() for n in (3, 17, 60)]
    types = [[0] * (len(p) // 2) + [1] * (len(p) - len(p) // 2) for p in pairs]
    reference = BertForSequenceClassification.from_pretrained(str(model))
    reference.eval()  # type: ignore[no-untyped-call]
    with torch.inference_mode():
        logits = [
            reference(input_ids=torch.tensor([p]), token_type_ids=torch.tensor([t])).logits
            for p, t in zip(pairs, types, strict=True)
        ]
    expected = np.array([float(x[0, 0]) for x in logits])
    args = ("--model", str(model), "--warmup-seconds", "0.2", "--dtype", "float32")
    openvino = ("--cpu-runtime", "openvino", "--openvino-cache-dir", str(tmp_path / "graphs"))
    with running_worker(tmp_path, *args, *openvino) as worker:
        stub = worker_stub(worker.channel())
        batch = pack_tokens(pairs, types)
        raw = stub.Score(pb.ScoreRequest(batch=batch), timeout=60)
        got = np.frombuffer(raw.scores, "<f4")
        assert raw.count == 3
        assert raw.prompt_tokens == sum(len(p) for p in pairs)
        assert np.abs(got - expected).max() < 1e-3
        activated = stub.Score(pb.ScoreRequest(batch=batch, activate=True), timeout=60)
        sig = 1 / (1 + np.exp(-expected))
        assert np.abs(np.frombuffer(activated.scores, "<f4") - sig).max() < 1e-3
        with pytest.raises(grpc.RpcError) as refused:
            stub.Embed(embed_request(pairs), timeout=10)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert worker_stub(worker.channel()).Info(pb.InfoRequest()).task == "score"
    log = worker.log.read_text()
    assert "openvino runtime ready" in log
    assert "fork_posix" not in log


@pytest.mark.parametrize("front", ["python", "rust"])
def test_capacity_is_measured_after_serving_and_yields_to_requests(
    front: str, tmp_path: Path
) -> None:
    # A paced null engine (known capacity, asleep): the worker serves before any saturation run
    # (capacity 0, unmeasured), the run waits for an idle second, and a request arriving during
    # it stops it; the next idle period measures the pace. The Rust front's run goes through its
    # own queue (rust_capacity.py).
    pace = 20_000.0
    args = ("--engine", "null", "--null-tokens-per-second", str(pace), "--warmup-seconds", "2",
            "--capacity-idle-seconds", "1", "--max-batch-seconds", "0.1")  # fmt: skip
    if front == "rust":
        args += ("--front", "rust", "--front-library", str(front_library()))
    with running_worker(tmp_path, *args) as worker:
        stub = worker_stub(worker.channel())
        unmeasured = stub.Info(pb.InfoRequest())
        assert unmeasured.capacity_tokens_per_second == 0
        assert unmeasured.max_batch_tokens == 16384  # the configured budget (the default)
        # The test sends nothing yet, so new batches are the run's. Not the queue: the run keeps
        # few requests outstanding, a batch takes them all, and the queue sits empty while it
        # computes (under load the test never saw it non-empty: CI).
        warmed_up = worker.metric("embedfleet_worker_batch_tokens_count")

        def measuring() -> bool:
            return any(r.get("msg") == "capacity measured" for r in worker.log_records()) or (
                worker.metric("embedfleet_worker_batch_tokens_count") > warmed_up
            )

        wait_for("the capacity run to start", measuring, timeout=30, interval=0.05)
        stub.Embed(embed_request([[101, 7, 102]]), timeout=10)
        wait_for(
            "a capacity",
            lambda: worker.metric("embedfleet_worker_capacity_tokens_per_second") > 0,
            timeout=30,
        )
        measured = stub.Info(pb.InfoRequest())
        # The worker's delivered rate through the paced null engine: the engine's sleeps bound
        # it from above; the front's own time per batch takes it below, more so on a busy
        # machine (0.80x the pace in a CI run at load 7), so the machine sets no lower bound
        # but a wrong count's.
        capacity = measured.capacity_tokens_per_second
        assert 0.5 * pace < capacity <= 1.02 * pace
        # Info reports the batch budget in force: paced to 0.1 s of work at the measured rate.
        paced = next(r for r in worker.log_records() if r.get("msg") == "capacity measured")
        assert measured.max_batch_tokens == paced["batch_tokens"]
        assert measured.max_batch_tokens == int(capacity * 0.1)
        # The run's requests are no one's: only the test's own call is counted.
        assert worker.metric("embedfleet_worker_requests_total", rpc="Embed", code="OK") == 1
        assert worker.metric("embedfleet_worker_tokens_total") == 3
    messages = [r.get("msg") for r in worker.log_records()]
    assert messages.index("serving") < messages.index("capacity measured")
    assert "capacity measurement yielded to a request" in messages


def test_a_slow_workers_batches_hold_about_a_second_of_its_measured_work(tmp_path: Path) -> None:
    # A null engine paced at 2,000 tokens/s: once measured, a batch holds ~2,000 tokens, so six
    # queued 1,000-token requests run two by two, not (all but the first) in one 5,000-token batch.
    args = ("--engine", "null", "--null-tokens-per-second", "2000", "--warmup-seconds", "1",
            "--capacity-measurement", "startup")  # fmt: skip
    with running_worker(tmp_path, *args) as worker:
        stub = worker_stub(worker.channel())
        before = worker.metric("embedfleet_worker_batch_tokens_count")
        request = embed_request([[7] * 250] * 4)
        calls = [stub.Embed.future(request, timeout=60) for _ in range(6)]
        assert all(len(vectors(c.result())) == 4 for c in calls)
        assert worker.metric("embedfleet_worker_batch_tokens_count") - before >= 3
    (measured,) = [r for r in worker.log_records() if r.get("msg") == "capacity measured"]
    assert 1500 <= measured["batch_tokens"] <= 2500


def _worker_exits(tmp_path: Path, *args: str) -> tuple[int, str]:
    """A worker's exit code and its error line, once it has exited without a traceback."""
    argv = [sys.executable, "-m", "embedfleet.worker.cli", "--metrics-port", "0", *args]
    done = subprocess.run(
        [*argv, "--log-format", "text"],
        check=False, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert "Traceback" not in done.stderr
    (line,) = [x for x in done.stderr.splitlines() if " error " in x]
    return done.returncode, line


def test_a_taken_port_is_one_line_that_says_what_to_do(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, line = _worker_exits(tmp_path, "--engine", "null", "--port", str(port))
    assert code == 2
    assert line.endswith(
        f"cannot listen on 127.0.0.1:{port} (--port): another process holds it; stop that "
        "process or give --port a free port (0 picks one)"
    )


def test_settings_the_engine_cannot_run_are_one_line(tmp_path: Path) -> None:
    code, line = _worker_exits(tmp_path, "--port", "0", "--cuda-memory-fraction", "2")
    assert code == 1
    assert line.endswith(
        "start-up failed: --cuda-memory-fraction must be between 0 and 1  error=UnservableError"
    )

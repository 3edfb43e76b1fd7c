"""The worker's Rust front (`--front rust`, worker-front/) over real gRPC, beside the Python
front: the same replies and refusals, deadlines, cancellation of queued work, the byte budget,
the drain on SIGTERM, and one request through the Rust gateway. The extension is built (or
reused from ~/.cache/embedfleet/worker-front) by hack/build-rust.sh, as the gateway is."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from embedfleet.common.codec import pack_tokens
from embedfleet.common.modeldir import default_model_path, load_model_dir
from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.common.proto import embedfleet_pb2_grpc as pb_grpc
from embedfleet.testing import families
from embedfleet.testing.families import FamilyDirs
from embedfleet.testing.gateway import running_gateway
from embedfleet.testing.polling import wait_for
from embedfleet.testing.workers import (
    WorkerProcess,
    front_library,
    metric_value,
    start_worker,
    worker_stub,
)
from embedfleet.worker.inflight import ByteBudget
from embedfleet.worker.null_engine import NullEngine
from embedfleet.worker.rust_front import Batches
from embedfleet.worker.scheduler import Budget, paced

from .helpers import embed_request, rust_worker_with, vectors

#: small limits so that every refusal shows with short requests; the null engine takes a
#: batch's tokens / RATE seconds (sleeping), so queueing is seen with few requests
RATE = 2000
BATCH_TOKENS = 1024
HARD_TOKENS = 2048
INFLIGHT_BYTES = 9 * BATCH_TOKENS + 4096
NULL_ARGS = (
    "--engine", "null",
    "--null-tokens-per-second", str(RATE),
    "--max-batch-tokens", str(BATCH_TOKENS),
    "--max-request-tokens", str(HARD_TOKENS),
    "--max-inflight-bytes", str(INFLIGHT_BYTES),
    "--capacity-measurement", "startup",
    "--warmup-seconds", "0.1",
)  # fmt: skip
SATURATED = "embedfleet_worker_saturated_tokens_per_second"
FLOAT32 = ("--dtype", "float32", "--warmup-seconds", "0.2", "--capacity-measurement", "startup")
Code = grpc.StatusCode


def _rust_args(*args: str) -> tuple[str, ...]:
    return ("--front", "rust", "--front-library", str(front_library()), *args)


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, WorkerProcess]]:
    """A Rust-front and a Python-front worker on the null engine, with the same limits."""
    tmp = tmp_path_factory.mktemp("fronts")
    started = {
        "rust": start_worker(tmp, *_rust_args(*NULL_ARGS), name="rust"),
        "python": start_worker(tmp, *NULL_ARGS, name="python"),
    }
    try:
        for worker in started.values():
            worker.wait_serving(120)
        yield started
    finally:
        for worker in started.values():
            worker.stop()


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, WorkerProcess]]:
    """The bundled MiniLM in float32 behind each front."""
    tmp = tmp_path_factory.mktemp("minilm")
    started = {
        "rust": start_worker(tmp, *_rust_args(*FLOAT32), name="rust"),
        "python": start_worker(tmp, *FLOAT32, name="python"),
    }
    try:
        for worker in started.values():
            worker.wait_serving(240)
        yield started
    finally:
        for worker in started.values():
            worker.stop()


def _outcome(call: Callable[[], Any]) -> tuple[Code, str]:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    return Code.OK, ""


def _rpc_outcome(stub: pb_grpc.WorkerStub, rpc: str, request: Any) -> tuple[Code, str]:
    return _outcome(lambda: getattr(stub, rpc)(request, timeout=10))


def _wait_queued(stub: pb_grpc.WorkerStub, requests: int) -> None:
    """Until the worker's queue holds `requests` requests (Info's live figure)."""

    def queued() -> bool:
        return stub.Info(pb.InfoRequest(), timeout=5).queued_requests >= requests

    wait_for(f"{requests} queued requests", queued, timeout=5, interval=0.01)


def _long(tokens: int) -> pb.EmbedRequest:
    """`tokens` tokens in sequences of at most 200 (the null engine's MiniLM takes 256)."""
    ids = [1000 + i % 20000 for i in range(tokens)]
    return embed_request([ids[at : at + 200] for at in range(0, tokens, 200)])


BAD_REQUESTS = {
    "ragged ids": pb.EmbedRequest(batch=pb.TokenBatch(token_ids=b"\x01\x02\x03", lengths=b"")),
    "lengths off": pb.EmbedRequest(
        batch=pb.TokenBatch(token_ids=np.arange(4, dtype="<i4").tobytes(), lengths=b"\x05\0\0\0")
    ),
    "over the hard limit": _long(HARD_TOKENS + 10),
    "dimensions": embed_request([[101, 102]], dimensions=100000),
    "pooling": embed_request([[101, 102]], pooling=99),
    "format": embed_request([[101, 102]], format=99),
    "id past the vocabulary": embed_request([[101, 10**8]]),
}


def test_replies_and_refusals_are_the_python_fronts(workers: dict[str, WorkerProcess]) -> None:
    stubs = {name: worker_stub(worker.channel()) for name, worker in workers.items()}
    good = embed_request([[101, 7592, 102], [101, 2088, 2003, 102]], dimensions=8)
    replies = {name: stub.Embed(good, timeout=10) for name, stub in stubs.items()}
    assert replies["rust"] == replies["python"]
    assert replies["rust"].count == 2
    for what, request in BAD_REQUESTS.items():
        got = {name: _rpc_outcome(stub, "Embed", request) for name, stub in stubs.items()}
        assert got["rust"][0] is Code.INVALID_ARGUMENT, (what, got)
        assert got["rust"] == got["python"], what


def test_undecodable_bytes_are_invalid_argument(workers: dict[str, WorkerProcess]) -> None:
    channel = workers["rust"].channel()
    embed = channel.unary_unary("/embedfleet.v1.Worker/Embed")
    code, details = _outcome(lambda: embed(b"\xff\xff\xff", timeout=10))
    assert code is Code.INVALID_ARGUMENT
    assert details.startswith("malformed Embed request: ")


def _stream(stub: pb_grpc.WorkerStub, calls: Sequence[pb.EmbedCall]) -> dict[int, pb.EmbedReply]:
    return {reply.id: reply for reply in stub.EmbedStream(iter(calls), timeout=20)}


def test_a_bad_call_among_good_ones_fails_alone(workers: dict[str, WorkerProcess]) -> None:
    calls = [
        pb.EmbedCall(id=1, request=embed_request([[101, 7592, 102]])),
        pb.EmbedCall(id=2, request=BAD_REQUESTS["dimensions"]),
        pb.EmbedCall(id=3, request=embed_request([[101, 2088, 102]])),
    ]
    got = {name: _stream(worker_stub(w.channel()), calls) for name, w in workers.items()}
    assert got["rust"] == got["python"]
    assert got["rust"][2].code == Code.INVALID_ARGUMENT.value[0]
    assert got["rust"][1].response.count == 1
    assert got["rust"][3].response.count == 1


def test_queued_calls_past_their_deadline_are_dropped(workers: dict[str, WorkerProcess]) -> None:
    stub = worker_stub(workers["rust"].channel())
    # The first batch computes 0.5 s; the calls behind it cannot share it (over the budget).
    calls = [
        pb.EmbedCall(id=1, request=_long(1000)),
        pb.EmbedCall(id=2, request=_long(100), timeout_seconds=0.05),
    ]
    replies = _stream(stub, calls)
    assert replies[1].response.count == 5
    assert (replies[2].code, replies[2].message) == (
        Code.DEADLINE_EXCEEDED.value[0],
        "deadline passed while queued",
    )
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        ahead = pool.submit(stub.Embed, _long(1000), timeout=10)
        time.sleep(0.1)  # so that it arrives first
        late = _outcome(lambda: stub.Embed(_long(100), timeout=0.1))
        assert ahead.result().count == 5
    assert late[0] is Code.DEADLINE_EXCEEDED


def test_a_cancelled_queued_call_is_not_computed(workers: dict[str, WorkerProcess]) -> None:
    stub = worker_stub(workers["rust"].channel())
    _wait_queued(stub, 0)  # the channel connected
    started = time.monotonic()
    ahead = stub.Embed.future(_long(1000), timeout=10)  # 0.5 s
    # Two calls sent at once may arrive in either order: this one must be the queued one.
    time.sleep(0.1)
    cancelled = stub.Embed.future(_long(2000), timeout=10)  # 1.0 s if run
    _wait_queued(stub, 1)
    cancelled.cancel()
    behind = stub.Embed(_long(10), timeout=10)
    assert (ahead.result().count, behind.count) == (5, 1)
    # Computed, the cancelled call would have put it past 1.5 s.
    assert time.monotonic() - started < 1.2


def test_messages_past_the_byte_budget_are_refused(workers: dict[str, WorkerProcess]) -> None:
    stub = worker_stub(workers["rust"].channel())
    held = _long(2000)
    refused = _long(HARD_TOKENS - 8)
    ahead = stub.Embed.future(held, timeout=10)
    time.sleep(0.1)
    code, details = _outcome(lambda: stub.Embed(refused, timeout=10))
    assert ahead.result().count == 10
    assert code is Code.RESOURCE_EXHAUSTED
    budget = ByteBudget(INFLIGHT_BYTES, held=held.ByteSize())
    assert details == budget.refusal(refused.ByteSize())


def test_a_message_over_the_size_limit_is_resource_exhausted(
    workers: dict[str, WorkerProcess],
) -> None:
    # 4,000 tokens: past the longest message the budgets allow (INFLIGHT_BYTES), before parsing.
    huge = _long(4000)
    assert huge.ByteSize() > INFLIGHT_BYTES
    for worker in workers.values():
        stub = worker_stub(worker.channel())
        assert _rpc_outcome(stub, "Embed", huge)[0] is Code.RESOURCE_EXHAUSTED
        calls = iter([pb.EmbedCall(id=1, request=huge)])
        code, _ = _outcome(lambda: list(stub.EmbedStream(calls, timeout=10)))  # noqa: B023
        assert code is Code.RESOURCE_EXHAUSTED


def test_info_says_ready_with_the_engines_figures(workers: dict[str, WorkerProcess]) -> None:
    info = {
        n: worker_stub(w.channel()).Info(pb.InfoRequest(), timeout=5) for n, w in workers.items()
    }
    assert info["rust"].ready
    for field in ("model_name", "task", "dimensions", "max_input_tokens", "vocab_size", "device"):
        assert getattr(info["rust"], field) == getattr(info["python"], field), field
    assert info["rust"].max_batch_tokens == BATCH_TOKENS


def test_minilm_float32_embeddings_equal_the_python_fronts(
    minilm: dict[str, WorkerProcess],
) -> None:
    request = embed_request([[101, 7592, 2088, 102], [101, 1037, 2307, 2154, 1012, 102]])
    got = {
        n: vectors(worker_stub(w.channel()).Embed(request, timeout=30)) for n, w in minilm.items()
    }
    assert got["rust"].shape == (2, 384)
    np.testing.assert_allclose(got["rust"], got["python"], rtol=0, atol=1e-6)


def test_a_request_through_the_rust_gateway(
    minilm: dict[str, WorkerProcess], tmp_path: Path
) -> None:
    with running_gateway([minilm["rust"].address], log=tmp_path / "gateway.log") as gateway:
        body = json.dumps({"input": ["hello world"]}).encode()
        request = urllib.request.Request(
            f"{gateway.url}/v1/embeddings", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            data = json.loads(reply.read())
    assert len(data["data"][0]["embedding"]) == 384


def test_sigterm_drains_queued_work_and_exits_0(tmp_path: Path) -> None:
    worker = start_worker(tmp_path, *_rust_args(*NULL_ARGS), name="drain")
    try:
        worker.wait_serving(120)
        stub = worker_stub(worker.channel())
        # Three batches of 0.3 s each, queued before the signal.
        pending = [stub.Embed.future(_long(600), timeout=10) for _ in range(3)]
        _wait_queued(stub, 2)  # one computing, two waiting
        worker.signal(signal.SIGTERM)
        assert [future.result().count for future in pending] == [3, 3, 3]
        assert worker.proc.wait(10) == 0
    finally:
        worker.stop()
    # One log shape from both halves (crates/logs writes common/logs.py's): a JSON object a line.
    lines = [line for line in worker.log.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]
    assert all(list(record)[:4] == ["ts", "level", "logger", "msg"] for record in records)
    rust = {
        (r["logger"], r["msg"])
        for r in records
        if r["logger"].startswith("embedfleet.worker.front")
    }
    assert ("embedfleet.worker.front.server", "draining") in rust, rust


def test_sigterm_during_a_background_measurement_exits_0_cleanly(tmp_path: Path) -> None:
    # The measurement starts after a tenth of a second idle and would run 3 s of probes.
    args = ("--engine", "null", "--null-tokens-per-second", str(RATE), "--warmup-seconds", "3",
            "--capacity-idle-seconds", "0.1")  # fmt: skip
    worker = start_worker(tmp_path, *_rust_args(*args))
    try:
        worker.wait_serving(120)
        wait_for(
            "the measurement's batches",
            lambda: worker.metric("embedfleet_worker_batch_tokens_count") > 1,
            timeout=30,
        )
        worker.signal(signal.SIGTERM)
        assert worker.proc.wait(10) == 0
    finally:
        worker.stop()
    levels = {str(record.get("level")).lower() for record in worker.log_records()}
    assert "error" not in levels, worker.log.read_text()


def test_each_of_two_engines_serves_through_the_rust_front(tmp_path: Path) -> None:
    # No metrics: the second engine's port (the first's + 1) is not known to be free.
    args = _rust_args("--engine", "null", "--engines", "2", "--metrics-port", "0")
    worker = start_worker(tmp_path, *args)
    try:
        worker.wait_serving(120)
        # engines.py: engine i writes the port file with the suffix .i (none for the first)
        second = Path(f"{worker.port_file}.1")
        wait_for("the second engine's port file", second.is_file, timeout=60)
        ports = [worker.port, json.loads(second.read_text())["port"]]
        for port in ports:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                reply = worker_stub(channel).Embed(embed_request([[101, 102]]), timeout=30)
            assert reply.count == 1
    finally:
        assert worker.stop() == 0


#: (family checkpoint, its RPC and request) for each task the Rust front serves besides embed
TASKS = {
    "score": ("bge-reranker-base", "Score", pb.ScoreRequest),
    "classify": ("finbert", "Classify", pb.ClassifyRequest),
    "sparse": ("splade", "SparseEmbed", pb.SparseEmbedRequest),
    "multivector": ("pylate-colbert", "MultiVectorEmbed", pb.MultiVectorEmbedRequest),
    "hybrid": ("bge-m3", "HybridEmbed", pb.HybridEmbedRequest),
}


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
def test_every_other_task_equals_the_python_fronts(
    task: str, family_dirs: FamilyDirs, tmp_path: Path
) -> None:
    family, rpc, message = TASKS[task]
    path = family_dirs.get(family)
    args = (
        "--model",
        str(path),
        "--task",
        task,
        "--threads",
        "1",
        "--dtype",
        "float32",
        "--warmup-seconds",
        "0.1",
    )
    tok = load_model_dir(path).tokenizer()
    good = message(batch=pack_tokens([tok.encode(t).ids for t in families.TEXTS[:3]]))
    bad = message(batch=pb.TokenBatch(token_ids=b"\x01", lengths=b""))
    # An RPC of another task (a hybrid model answers Embed too).
    wrong_rpc, wrong = (
        ("Embed", pb.EmbedRequest(batch=good.batch))
        if task == "score"
        else ("Score", pb.ScoreRequest(batch=good.batch))
    )
    # Both fronts start at once: their start-ups (torch's import, the self-check) overlap.
    started = {
        "rust": start_worker(tmp_path, *args, *_rust_args(), name="rust"),
        "python": start_worker(tmp_path, *args, name="python"),
    }
    got = {}
    try:
        for front, worker in started.items():
            worker.wait_serving(120)
            stub = worker_stub(worker.channel())
            reply = getattr(stub, rpc)(good, timeout=30)
            refusals = [_rpc_outcome(stub, rpc, bad), _rpc_outcome(stub, wrong_rpc, wrong)]
            got[front] = (reply, refusals)
    finally:
        for worker in started.values():
            worker.stop()
    assert got["rust"][0].prompt_tokens == len(good.batch.token_ids) // 4
    assert got["rust"][1][0][0] is Code.INVALID_ARGUMENT
    assert got["rust"][1][1][0] is Code.FAILED_PRECONDITION
    assert got["rust"] == got["python"]


def test_the_batch_call_answers_each_request_alone() -> None:
    """The Python half of a batch, without the extension: one bad request fails alone."""
    model = load_model_dir(default_model_path())
    engine = NullEngine.from_model_dir(model)
    batches = Batches(engine, Budget(BATCH_TOKENS, 16, HARD_TOKENS), model)
    good = embed_request([[101, 7592, 102]], dimensions=8)
    replies = batches(
        [
            ("Embed", good.SerializeToString(), 0.001, None),
            ("Embed", b"\xff\xff", 0.002, None),
            ("Score", pb.ScoreRequest(batch=good.batch).SerializeToString(), 0.003, None),
            ("Embed", BAD_REQUESTS["dimensions"].SerializeToString(), 0.004, None),
        ]
    )
    reply = replies[0]
    assert isinstance(reply, bytes)
    assert pb.EmbedResponse.FromString(reply).dimensions == 8
    codes = [code for code, _ in replies[1:]]
    assert codes == [
        Code.INVALID_ARGUMENT.value[0],
        Code.FAILED_PRECONDITION.value[0],
        Code.INVALID_ARGUMENT.value[0],
    ]
    # Its metrics, as the Python front's runner observes them: every call waited, one computed.
    sample = batches.metrics.registry.get_sample_value
    assert sample("embedfleet_worker_queue_wait_seconds_count") == 4
    assert sample("embedfleet_worker_queue_wait_seconds_sum") == pytest.approx(0.01)
    assert sample("embedfleet_worker_batch_tokens_sum") == 3
    assert sample("embedfleet_worker_tokens_total") == 3
    assert sample("embedfleet_worker_compute_seconds_count") == 1
    assert sample("embedfleet_worker_stage_seconds_count", {"stage": "serialize"}) == 1


def _families(exposition: str) -> set[str]:
    """The metrics' names, without prometheus-client's own *_created series."""
    names = {family.name for family in text_string_to_metric_families(exposition)}
    return {name for name in names if not name.endswith("_created")}


def test_metrics_are_the_python_fronts_and_move(workers: dict[str, WorkerProcess]) -> None:
    rust = workers["rust"]
    assert _families(rust.metrics_text()) == _families(workers["python"].metrics_text())
    assert json.loads(rust.port_file.read_text())["metrics_port"] == rust.metrics_port
    before = rust.metrics_text()
    stub = worker_stub(rust.channel())
    for _ in range(3):
        stub.Embed(embed_request([[101, 7592, 102]]), timeout=10)
    refused = _rpc_outcome(stub, "Embed", BAD_REQUESTS["over the hard limit"])
    assert refused[0] is Code.INVALID_ARGUMENT
    after = rust.metrics_text()

    def moved(name: str, **labels: str) -> float:
        return metric_value(after, name, **labels) - metric_value(before, name, **labels)

    assert moved("embedfleet_worker_requests_total", rpc="Embed", code="OK") == 3
    assert moved("embedfleet_worker_requests_total", rpc="Embed", code="INVALID_ARGUMENT") == 1
    assert moved("embedfleet_worker_request_seconds_count") == 4
    assert moved("embedfleet_worker_queue_wait_seconds_count") == 3
    assert moved("embedfleet_worker_tokens_total") == 9
    assert moved("embedfleet_worker_stage_seconds_count", stage="parse") == 3
    assert metric_value(after, "embedfleet_worker_ready") == 1
    assert metric_value(after, "embedfleet_worker_draining") == 0
    assert metric_value(after, "embedfleet_worker_inflight_requests") == 0
    info = stub.Info(pb.InfoRequest(), timeout=5)
    capacity = metric_value(after, "embedfleet_worker_capacity_tokens_per_second")
    assert capacity == pytest.approx(info.capacity_tokens_per_second)


def test_a_backlog_reports_the_saturated_rate_as_the_python_front_does(
    workers: dict[str, WorkerProcess],
) -> None:
    # Four closed-loop clients of 600 tokens each (within the byte budget) against a 1,024-token
    # budget: one request per 0.3 s batch, the other three waiting, so every batch but the last
    # is cut with work left behind: ~3 busy seconds, past the figure's 2.
    request = _long(600)

    def client(stub: pb_grpc.WorkerStub) -> None:
        for _ in range(3):
            stub.Embed(request, timeout=30)

    stubs = {name: worker_stub(worker.channel()) for name, worker in workers.items()}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        running = [pool.submit(client, stub) for stub in stubs.values() for _ in range(4)]
        for done in running:
            done.result()
    for name, stub in stubs.items():
        rate = stub.Info(pb.InfoRequest(), timeout=5).saturated_tokens_per_second
        # Sleeps last at least their length: never above the engine's pace; a busy machine's
        # delays between batches are the worker's cost and may lower it.
        assert 0.5 * RATE < rate <= RATE * 1.001, (name, rate)
        exposed = metric_value(workers[name].metrics_text(), SATURATED)
        assert exposed == pytest.approx(rate), name


#: MOCK: an asynchronous (GPU-like) engine for the Rust front's worker: once argv[0] exists, the
#: results of step k are held until the file argv[1]/release-k exists; each launch and wait is
#: a line of argv[2]
_GATED = """
import time
arm, gates, events = argv
class Gate:
    def __init__(self, number, done):
        self.number, self.done = number, done
    def ready(self):
        return (Path(gates) / f"release-{self.number}").exists()
    def wait(self):
        deadline = time.monotonic() + 30
        while not self.ready() and time.monotonic() < deadline:
            time.sleep(0.001)
        with open(events, "a") as out:
            out.write(f"waited {self.number}\\n")
        return self.done.wait()
class Engine(NullEngine):
    launched = 0
    def step(self, items):
        done = super().step(items)
        if not Path(arm).exists():
            return done
        Engine.launched += 1
        with open(events, "a") as out:
            out.write(f"launched {Engine.launched}\\n")
        return Gate(Engine.launched, done)
"""


def test_the_next_batch_launches_while_the_previous_computes(tmp_path: Path) -> None:
    arm, events = tmp_path / "arm", tmp_path / "events"
    with (
        rust_worker_with(tmp_path, _GATED, str(arm), str(tmp_path), str(events)) as worker,
        grpc.insecure_channel(worker.address) as channel,
    ):
        stub = worker_stub(channel)
        arm.touch()

        def said() -> list[str]:
            return events.read_text().splitlines() if events.exists() else []

        def send() -> grpc.Future:
            return stub.Embed.future(embed_request([[101, 7592, 102]]), timeout=30)

        a = send()
        wait_for("batch 1 launched", lambda: said() == ["launched 1"], timeout=10)
        b = send()
        # Batch 2 launches while batch 1 is still on the "device".
        wait_for("batch 2 launched", lambda: said() == ["launched 1", "launched 2"], timeout=10)
        assert not a.done()
        c = send()
        time.sleep(0.1)
        assert said() == ["launched 1", "launched 2"], "at most two batches in flight"
        (tmp_path / "release-1").touch()
        assert a.result().count == 1
        # Batch 1's reply went out while batch 2 computes; batch 3 launched behind it.
        wait_for("batch 3 launched", lambda: len(said()) == 4, timeout=10)
        assert not b.done()
        for k in (2, 3):
            (tmp_path / f"release-{k}").touch()
        assert [b.result().count, c.result().count] == [1, 1]
    assert said() == [
        "launched 1",
        "launched 2",
        "waited 1",
        "launched 3",
        "waited 2",
        "waited 3",
    ]


def test_capacity_is_measured_and_paces_the_batches(tmp_path: Path) -> None:
    # A third of a second of work at the null engine's 2,000 tokens/s: under the 1,024 budget.
    args = _rust_args(*NULL_ARGS, "--max-batch-seconds", "0.3", "--metrics-port", "0")
    worker = start_worker(tmp_path, *args)
    try:
        worker.wait_serving(120)
        info = worker_stub(worker.channel()).Info(pb.InfoRequest(), timeout=5)
    finally:
        assert worker.stop() == 0
    assert 0.5 * RATE < info.capacity_tokens_per_second < 1.5 * RATE
    budget = Budget(BATCH_TOKENS, 512, HARD_TOKENS)
    expected = paced(budget, info.capacity_tokens_per_second, 0.3).max_tokens
    assert info.max_batch_tokens == expected < BATCH_TOKENS


def test_a_front_library_that_cannot_load_is_one_line_and_exit_2(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "embedfleet.worker.cli", "--engine", "null", "--front", "rust"]
    missing = str(tmp_path / "missing.abi3.so")
    done = subprocess.run(
        [*argv, "--front-library", missing, "--metrics-port", "0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert missing in done.stderr.strip().splitlines()[-1]

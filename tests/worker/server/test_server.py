"""The worker server as a real process on 127.0.0.1 with the real MiniLM weights.

One worker serves the whole module (start-up costs tens of seconds on 2 shared cores); the SIGTERM
test consumes it, so it comes last. Batching is observed through the trailing metadata each reply
carries: the request's arrival number and the number of the batch it ran in.
"""

from __future__ import annotations

import itertools
import random
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import numpy as np
import pytest
from tokenizers import Tokenizer

from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.testing.polling import wait_for
from embedfleet.testing.workers import WorkerProcess, health_status, running_worker, worker_stub

from .helpers import (
    BUDGET_SEQUENCES,
    BUDGET_TOKENS,
    HARD_TOKENS,
    QUEUE,
    WORKER_ARGS,
    Served,
    embed_request,
    vectors,
)

VOCAB = 30522
RNG = random.Random(1234)


def rand_seqs(tokens: int, sequences: int = 1) -> list[list[int]]:
    per = tokens // sequences
    return [[RNG.randrange(1000, VOCAB) for _ in range(per)] for _ in range(sequences)]


def blocker() -> pb.EmbedRequest:
    """Over the batch budget, so it runs alone; slow enough (2048 tokens) to let a queue build."""
    return embed_request(rand_seqs(2048, 8))


def placement(call: Any) -> tuple[int, int]:
    """(arrival number, batch number) from a reply's trailing metadata."""
    meta = dict(call.trailing_metadata())
    return int(meta["embedfleet-arrival"]), int(meta["embedfleet-batch"])


def code_of(future: Any) -> grpc.StatusCode:
    try:
        future.result()
    except grpc.RpcError as exc:
        return exc.code()
    except grpc.FutureCancelledError:
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.OK


def tokens_of(request: pb.EmbedRequest) -> tuple[int, int]:
    return len(request.batch.token_ids) // 4, len(request.batch.lengths) // 4


# --- readiness --------------------------------------------------------------------------------


def test_readiness_flips_only_after_the_selfcheck(served: Served) -> None:
    records = served.worker.log_records()
    checks = [r for r in records if r.get("msg") == "self-check passed"]
    assert len(checks) == 1, records
    assert checks[0]["reference"].startswith("sentence-transformers")
    assert checks[0]["min_cosine"] >= 0.999
    statuses = served.startup.statuses
    assert statuses[0][1] == "NOT_SERVING"
    assert served.startup.early_embed_code == grpc.StatusCode.UNAVAILABLE
    first_serving = next(t for t, s in statuses if s == "SERVING")
    assert first_serving >= checks[0]["ts"]
    assert all(s != "SERVING" for t, s in statuses if t < checks[0]["ts"])
    assert served.worker.metric("embedfleet_worker_ready") == 1.0
    info = served.stub.Info(pb.InfoRequest())
    assert info.ready
    assert not info.draining
    assert info.dimensions == 384
    assert info.max_input_tokens == 256
    assert info.vocab_size == VOCAB
    assert info.capacity_tokens_per_second > 0
    assert info.max_batch_tokens == BUDGET_TOKENS


# --- batching ---------------------------------------------------------------------------------


def test_fcfs_order_and_token_budget(served: Served) -> None:
    stub = served.stub
    first = stub.Embed.future(blocker())
    time.sleep(0.05)  # let it start computing, so the rest queue up behind it
    shapes = [(300, 2), (150, 1), (100, 2), (64, 4), (256, 1), (256, 1), (16, 1), (16, 1),
              (600, 3), (16, 1), (200, 1), (400, 2), (32, 16), (32, 1), (480, 4),
              (8, 1)]  # fmt: skip
    requests = [embed_request(rand_seqs(t, n)) for t, n in shapes]
    futures = [stub.Embed.future(r) for r in requests]
    replies = [f.result(timeout=120) for f in futures]
    first.result(timeout=120)
    for reply, (_, n) in zip(replies, shapes, strict=True):
        assert reply.count == n
    _, blocker_batch = placement(first)
    placed = sorted(
        (placement(f) + tokens_of(r) for f, r in zip(futures, requests, strict=True)),
        key=lambda p: p[0],
    )
    batches: dict[int, list[tuple[int, int]]] = {}
    for _, batch, tokens, seqs in placed:
        batches.setdefault(batch, []).append((tokens, seqs))
    assert blocker_batch not in batches  # over the budget: it ran alone
    order = [batch for _, batch, _, _ in placed]
    assert order == sorted(order), "a later arrival ran in an earlier batch"
    for members in batches.values():
        tokens = sum(t for t, _ in members)
        seqs = sum(s for _, s in members)
        assert (tokens <= BUDGET_TOKENS and seqs <= BUDGET_SEQUENCES) or len(members) == 1
    # All of them queued while the blocker ran, so each batch is as full as the order allows.
    numbers = sorted(batches)
    for this, nxt in itertools.pairwise(numbers):
        tokens = sum(t for t, _ in batches[this])
        seqs = sum(s for _, s in batches[this])
        head_tokens, head_seqs = batches[nxt][0]
        assert tokens + head_tokens > BUDGET_TOKENS or seqs + head_seqs > BUDGET_SEQUENCES
    assert len(batches) < len(requests)  # some did share a batch


def test_large_request_is_not_starved(served: Served) -> None:
    stub = served.stub
    small: list[tuple[Any, float]] = []
    stop = threading.Event()

    def stream() -> None:
        while not stop.is_set():
            small.append((stub.Embed.future(embed_request(rand_seqs(32))), time.monotonic()))
            time.sleep(0.006)

    thread = threading.Thread(target=stream)
    thread.start()
    time.sleep(0.3)
    big = stub.Embed.future(embed_request(rand_seqs(1000, 4)))
    time.sleep(0.6)
    stop.set()
    thread.join()
    assert big.result(timeout=120).count == 4
    big_arrival, big_batch = placement(big)
    before = after = 0
    for future, _ in small:
        future.result(timeout=120)
        arrival, batch = placement(future)
        assert batch != big_batch
        assert (batch < big_batch) == (arrival < big_arrival)
        before += arrival < big_arrival
        after += arrival > big_arrival
    assert before
    assert after


#: the paced worker's speed: the blocker's 2,048 tokens hold its engine ~2 s on any CPU
PACED_TOKENS_PER_SECOND = 1000


@pytest.fixture(scope="module")
def paced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """A null-engine worker whose batches take tokens / PACED_TOKENS_PER_SECOND asleep, with the
    real worker's budgets: a queue behind the blocker lasts as long on a fast CPU as on a slow
    one (behind the real engine it lasted ~60 ms on a quiet Xeon with AMX: shorter than sending
    the eight calls, so they were never queued together)."""
    with running_worker(
        tmp_path_factory.mktemp("paced-worker"),
        "--engine", "null",
        "--null-tokens-per-second", str(PACED_TOKENS_PER_SECOND),
        *WORKER_ARGS,
        ready_timeout=120,
    ) as proc:  # fmt: skip
        yield proc


def test_cancelled_and_expired_requests_are_dropped_and_counted(paced: WorkerProcess) -> None:
    worker, stub = paced, worker_stub(paced.channel())
    dropped_before = {
        r: worker.metric("embedfleet_worker_dropped_requests_total", reason=r)
        for r in ("cancelled", "deadline")
    }
    tokens_before = worker.metric("embedfleet_worker_tokens_total")
    first_request = blocker()
    first = stub.Embed.future(first_request)
    time.sleep(0.05)
    # Expiring while queued: the deadline is well past their arrival, well before the blocker
    # (~2 s) ends.
    expiring = [stub.Embed.future(embed_request(rand_seqs(64)), timeout=0.5) for _ in range(4)]
    cancelled = [stub.Embed.future(embed_request(rand_seqs(64))) for _ in range(3)]
    last_request = embed_request(rand_seqs(40))
    last = stub.Embed.future(last_request)
    # Cancel only once the server holds all eight behind the blocker: a call cancelled before it
    # arrived would end CANCELLED on the client with nothing for the worker to drop or count.
    wait_for(
        "the eight calls queued behind the blocker",
        lambda: worker.metric("embedfleet_worker_queued_requests") >= 8,
        timeout=30,
    )
    for future in cancelled:
        future.cancel()
    assert last.result(timeout=120).count == 1
    assert first.result(timeout=120).count == 8
    assert [code_of(f) for f in expiring] == [grpc.StatusCode.DEADLINE_EXCEEDED] * 4
    assert [code_of(f) for f in cancelled] == [grpc.StatusCode.CANCELLED] * 3
    # The drops are counted by the engine thread as it meets them, just before `last` runs.
    assert worker.metric("embedfleet_worker_dropped_requests_total", reason="deadline") == (
        dropped_before["deadline"] + 4
    )
    assert worker.metric("embedfleet_worker_dropped_requests_total", reason="cancelled") == (
        dropped_before["cancelled"] + 3
    )
    computed = tokens_of(first_request)[0] + tokens_of(last_request)[0]
    assert worker.metric("embedfleet_worker_tokens_total") == tokens_before + computed


def test_concurrent_clients_get_what_a_lone_request_gets(
    served: Served, tokenizer: Tokenizer
) -> None:
    texts = [
        f"Request {i}: " + " ".join(["the river bends past the old mill"] * (1 + i % 7))
        for i in range(24)
    ]
    ids = [enc.ids for enc in tokenizer.encode_batch(texts)]
    requests = [embed_request([seq]) for seq in ids]
    requests.append(embed_request(ids[:5]))  # a multi-sequence request among them
    lone = [vectors(served.stub.Embed(r, timeout=60)) for r in requests]

    def client(seed: int) -> list[tuple[int, np.ndarray[Any, Any]]]:
        channel = served.worker.channel()
        stub = worker_stub(channel)
        order = list(range(len(requests)))
        random.Random(seed).shuffle(order)
        futures = [(i, stub.Embed.future(requests[i])) for i in order]
        return [(i, vectors(f.result(timeout=120))) for i, f in futures]

    with ThreadPoolExecutor(6) as pool:
        results = [row for rows in pool.map(client, range(6)) for row in rows]
    assert len(results) == 6 * len(requests)
    worst = 1.0
    for i, got in results:
        assert got.shape == lone[i].shape
        cos = (got * lone[i]).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(lone[i], axis=1)
        worst = min(worst, float(cos.min()))
    # Rows are unit vectors of distinct texts: a mixed-up reply would score far below this.
    assert worst >= 0.9999, worst


# --- bad requests -----------------------------------------------------------------------------


def _raw(ids: bytes, lengths: list[int], types: bytes = b"") -> pb.EmbedRequest:
    packed = np.asarray(lengths, "<i4").tobytes()
    return pb.EmbedRequest(batch=pb.TokenBatch(token_ids=ids, lengths=packed, token_type_ids=types))


def _bad_requests() -> list[tuple[str, Any, grpc.StatusCode]]:
    ok = rand_seqs(8)
    ids = np.asarray(ok[0], "<i4").tobytes()
    return [
        ("no sequences", embed_request([]), grpc.StatusCode.INVALID_ARGUMENT),
        ("empty sequence", embed_request([[101, 102], []]), grpc.StatusCode.INVALID_ARGUMENT),
        ("too long", embed_request(rand_seqs(257)), grpc.StatusCode.INVALID_ARGUMENT),
        ("over the hard limit", embed_request(rand_seqs(HARD_TOKENS + 16, 17)),
         grpc.StatusCode.INVALID_ARGUMENT),
        ("id past vocab", embed_request([[101, VOCAB, 102]]), grpc.StatusCode.INVALID_ARGUMENT),
        ("negative id", embed_request([[101, -5, 102]]), grpc.StatusCode.INVALID_ARGUMENT),
        ("ragged bytes", _raw(ids[:-1], [8]), grpc.StatusCode.INVALID_ARGUMENT),
        ("lengths mismatch", _raw(ids, [9]), grpc.StatusCode.INVALID_ARGUMENT),
        ("negative length", _raw(b"", [-1, 1]), grpc.StatusCode.INVALID_ARGUMENT),
        ("type ids misaligned", _raw(ids, [8], b"\0"), grpc.StatusCode.INVALID_ARGUMENT),
        ("type id 7", _raw(ids, [8], b"\7" * 8), grpc.StatusCode.INVALID_ARGUMENT),
        ("too many dims", embed_request(ok, dimensions=385), grpc.StatusCode.INVALID_ARGUMENT),
        ("unknown format", embed_request(ok, format=7), grpc.StatusCode.INVALID_ARGUMENT),
        ("unknown pooling", embed_request(ok, pooling=9), grpc.StatusCode.INVALID_ARGUMENT),
        ("score on an embedder", pb.ScoreRequest(batch=embed_request(ok).batch),
         grpc.StatusCode.FAILED_PRECONDITION),
    ]  # fmt: skip


@pytest.mark.parametrize(("name", "request_", "code"), _bad_requests(), ids=lambda v: str(v)[:24])
def test_bad_request_gets_its_status_and_the_server_stays_healthy(
    served: Served, name: str, request_: Any, code: grpc.StatusCode
) -> None:
    rpc = "Score" if isinstance(request_, pb.ScoreRequest) else "Embed"
    method = served.stub.Score if rpc == "Score" else served.stub.Embed
    with pytest.raises(grpc.RpcError) as info:
        method(request_, timeout=30)
    assert info.value.code() == code, (name, info.value.details())
    assert info.value.details()
    counted = served.worker.metric("embedfleet_worker_requests_total", rpc=rpc, code=code.name)
    assert counted >= 1
    assert health_status(served.worker.address) == "SERVING"
    assert served.stub.Embed(embed_request(rand_seqs(8)), timeout=60).count == 1


def test_full_queue_refuses_with_resource_exhausted(paced: WorkerProcess) -> None:
    """Behind the paced worker (its blocker holds the engine ~2 s): the real engine can finish
    the blocker before the client has sent the 172 calls, and then the queue never fills (it
    failed once in six runs of the worker server tests on a quiet Xeon)."""
    stub = worker_stub(paced.channel())
    first = stub.Embed.future(blocker())
    time.sleep(0.05)
    futures = [stub.Embed.future(embed_request(rand_seqs(8))) for _ in range(QUEUE + 12)]
    codes = [code_of(f) for f in futures]
    first.result(timeout=120)
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) >= 1
    assert codes.count(grpc.StatusCode.OK) >= QUEUE - 1
    assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert health_status(paced.address) == "SERVING"


def test_options_reach_the_engine(served: Served) -> None:
    seqs = rand_seqs(20, 2)
    full = vectors(served.stub.Embed(embed_request(seqs), timeout=60))
    assert np.allclose(np.linalg.norm(full, axis=1), 1.0, atol=1e-3)  # MiniLM normalizes
    half = served.stub.Embed(
        embed_request(seqs, dimensions=64, format=pb.FLOAT_FORMAT_FLOAT16), timeout=60
    )
    assert (half.count, half.dimensions, half.format) == (2, 64, pb.FLOAT_FORMAT_FLOAT16)
    assert half.prompt_tokens == 20
    raw = vectors(served.stub.Embed(embed_request(seqs, normalize=False), timeout=60))
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0, atol=1e-2)


# --- metrics ----------------------------------------------------------------------------------

METRICS = (
    "embedfleet_worker_tokens_total",
    "embedfleet_worker_requests_total",
    "embedfleet_worker_batch_tokens_bucket",
    "embedfleet_worker_batch_sequences_bucket",
    "embedfleet_worker_queue_wait_seconds_bucket",
    "embedfleet_worker_compute_seconds_bucket",
    "embedfleet_worker_request_seconds_bucket",
    "embedfleet_worker_inflight_requests",
    "embedfleet_worker_queued_tokens",
    "embedfleet_worker_queued_requests",
    "embedfleet_worker_dropped_requests_total",
    "embedfleet_worker_graph_captures_total",
    "embedfleet_worker_graph_replays_total",
    "embedfleet_worker_eager_runs_total",
    "embedfleet_worker_capacity_tokens_per_second",
    "embedfleet_worker_ready",
)


def test_metrics_exist_and_move(served: Served) -> None:
    worker = served.worker
    text = worker.metrics_text()
    for name in METRICS:
        assert f"\n{name}" in text, name
    watched = {
        "tokens": ("embedfleet_worker_tokens_total", {}),
        "ok": ("embedfleet_worker_requests_total", {"rpc": "Embed", "code": "OK"}),
        "batches": ("embedfleet_worker_batch_tokens_count", {}),
        "waits": ("embedfleet_worker_queue_wait_seconds_count", {}),
        "compute": ("embedfleet_worker_compute_seconds_sum", {}),
        "latency": ("embedfleet_worker_request_seconds_count", {}),
        "eager": ("embedfleet_worker_eager_runs_total", {}),
    }
    before = {k: worker.metric(n, **labels) for k, (n, labels) in watched.items()}
    served.stub.Embed(embed_request(rand_seqs(30, 3)), timeout=60)
    after = {k: worker.metric(n, **labels) for k, (n, labels) in watched.items()}
    assert after["tokens"] == before["tokens"] + 30
    assert after["ok"] == before["ok"] + 1
    for key in ("batches", "waits", "compute", "latency", "eager"):
        assert after[key] > before[key], key
    assert worker.metric("embedfleet_worker_capacity_tokens_per_second") > 0
    assert worker.metric("embedfleet_worker_inflight_requests") == 0
    assert worker.metric("embedfleet_worker_queued_tokens") == 0


def test_logs_are_json_lines_without_request_content(served: Served) -> None:
    lines = served.worker.log.read_text().splitlines()
    records = served.worker.log_records()
    assert lines
    assert len(records) == len(lines)
    assert not any("river bends" in line for line in lines)


# --- drain (consumes the shared worker: keep last) --------------------------------------------


def test_sigterm_drains_without_losing_in_flight_requests(served: Served) -> None:
    worker, stub = served.worker, served.stub
    requests = [blocker()] + [embed_request(rand_seqs(64 + 8 * i, 1 + i % 3)) for i in range(20)]
    futures = [stub.Embed.future(r) for r in requests]
    deadline = time.monotonic() + 30
    wait_for(
        "all requests admitted",
        lambda: worker.metric("embedfleet_worker_inflight_requests") >= len(requests),
        timeout=30,
        interval=0.01,
    )
    worker.signal(signal.SIGTERM)
    wait_for(
        "the worker to report draining",
        lambda: stub.Info(pb.InfoRequest(), timeout=5).draining,
        timeout=max(deadline - time.monotonic(), 0.0),
        interval=0.01,
    )
    with pytest.raises(grpc.RpcError) as refused:
        stub.Embed(embed_request(rand_seqs(8)), timeout=30)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert health_status(worker.address) == "NOT_SERVING"
    for future, request in zip(futures, requests, strict=True):
        assert future.result(timeout=120).count == tokens_of(request)[1]
    assert worker.proc.wait(timeout=60) == 0
    messages = [r.get("msg") for r in worker.log_records()]
    assert "draining" in messages
    assert messages[-1] == "stopped"

"""Workers failing, as clients see it: each gRPC failure's status and retry, ejection and its gauge,
a chunk's deadline, a client that leaves, a failed chunk cancelling the rest of its request, no
ready worker; against FAKE workers (fakes.py) failing on command. Then REAL worker processes: one
killed under load loses no request, one restarted on its address is readmitted, one stopped (as
SIGSTOP leaves it: connected, silent) has its calls failed over within the probe's bound."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import grpc
import httpx
import pytest

from embedfleet.testing.workers import WorkerProcess, running_worker

from .fakes import FakeWorker, StoppingWorker
from .helpers import LIMITS, SMALL_CHUNKS, Gateway, fake_fleet, sample, serving, wait_until

Code = grpc.StatusCode
RETRIES = ("embedfleet_gateway_retries_total", {})
EJECTIONS = ("embedfleet_gateway_worker_ejections_total", {})
OUTSTANDING = "embedfleet_gateway_worker_outstanding_tokens"
#: longer than any test here: a worker back in rotation was readmitted, its ejection never ran out
NO_EXPIRY: dict[str, object] = {**LIMITS, "eject_seconds": 600}


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Gateway]:
    """NO_EXPIRY, in front of FAKE workers 0 and 1."""
    with fake_fleet(NO_EXPIRY, tmp_path / "gateway.log", numbers=(0, 1)) as gateway:
        yield gateway


#: code -> (status, error code, retries, ejections, calls) when both workers fail once
BOTH_FAIL: dict[Code, tuple[int, str | None, int, int, list[int]]] = {
    Code.INVALID_ARGUMENT: (400, None, 0, 0, [1]),  # the client's fault: never retried
    Code.DEADLINE_EXCEEDED: (504, "upstream_timeout", 0, 0, [1]),
    Code.INTERNAL: (502, "upstream_error", 0, 0, [1]),
    Code.RESOURCE_EXHAUSTED: (429, "overloaded", 1, 0, [1, 1]),  # busy, not gone: no ejection
    Code.CANCELLED: (502, "upstream_error", 1, 0, [1, 1]),
    Code.UNAVAILABLE: (502, "upstream_error", 1, 2, [1, 1]),  # one retry only, both ejected
}


@pytest.mark.parametrize("code", list(BOTH_FAIL), ids=lambda c: c.name)
def test_each_failure_is_its_status_after_at_most_one_retry(pair: Gateway, code: Code) -> None:
    status, error_code, retries, ejections, calls = BOTH_FAIL[code]
    pair.set_workers(fail_code=code, fail_count=1)
    before = pair.values([RETRIES, EJECTIONS])
    error = pair.error("/v1/embeddings", {"input": [[5, 6]]}, status)
    assert error["code"] == error_code
    if code == Code.INVALID_ARGUMENT:
        assert "rejected the input" in error["message"]
    if status == 429:
        assert pair.request("GET", "/health").status == 200
    after = pair.values([RETRIES, EJECTIONS])
    assert (after[0] - before[0], after[1] - before[1]) == (retries, ejections)
    assert pair.calls() == calls
    assert pair.request("GET", "/health").status == 200


@pytest.mark.parametrize("code", [Code.UNAVAILABLE, Code.RESOURCE_EXHAUSTED, Code.CANCELLED],
                         ids=lambda c: c.name)  # fmt: skip
def test_a_failure_on_one_worker_is_retried_on_the_other(pair: Gateway, code: Code) -> None:
    """Worker 0 fails every call: whatever lands there is answered by worker 1. Two idle
    workers are an even draw for each request, so 40 requests reach worker 0 at least once but
    for p = 2^-40 (5 missed it in one CI run of ~30: p = 1/32)."""
    first = pair.workers[0]
    first.fail_code, first.fail_count = code, 1000
    for _ in range(40):
        doc = pair.ok("/v1/embeddings", {"input": [[i] * 3 for i in range(1, 13)]})
        assert [int(d["embedding"][0]) for d in doc["data"]] == list(range(1, 13))
        assert {int(d["embedding"][3]) for d in doc["data"]} == {1}
    ejected = code == Code.UNAVAILABLE
    assert pair.value(RETRIES[0]) >= 1
    assert pair.value(EJECTIONS[0]) == (1 if ejected else 0)
    text = pair.metrics()
    gauge = [sample(text, "embedfleet_gateway_workers", state=s)
             for s in ("ready", "ejected", "unready")]  # fmt: skip
    # Ejected, not unready: its probes answer. Busy or cancelled: still in rotation.
    assert gauge == ([1, 1, 0] if ejected else [2, 0, 0])


def test_an_ejected_worker_gets_nothing_while_it_sits_its_ejection_out(pair: Gateway) -> None:
    first, _ = pair.workers
    first.fail_code, first.fail_count = Code.UNAVAILABLE, 1000
    # One call a request: worker 0 picked at least once in 40 (p = 1 - 2^-40).
    moved = pair.deltas([RETRIES, EJECTIONS], [("/v1/embeddings", {"input": "x"})] * 40)
    assert moved == (1, 1)
    assert first.fail_count == 999
    assert pair.served_by(["x", "y"]) == {1}


def test_one_worker_unavailable_is_a_503_and_busy_a_429_in_rotation(tmp_path: Path) -> None:
    with fake_fleet({**LIMITS, "retry_after_seconds": 3}, tmp_path / "gw.log", numbers=(0,)) as gw:
        gw.set_workers(fail_code=Code.RESOURCE_EXHAUSTED, fail_count=1)
        reply = gw.post("/v1/embeddings", {"input": [[5, 6]]})
        assert (reply.status, reply.headers["retry-after"]) == (429, "3")
        assert reply.json()["error"]["code"] == "overloaded"
        assert gw.worker_counts() == (1, 1)
        assert gw.post("/v1/embeddings", {"input": [[5, 6]]}).status == 200
        gw.set_workers(fail_code=Code.UNAVAILABLE, fail_count=1)
        error = gw.error("/v1/embeddings", {"input": [[5, 6]]}, 503)
        assert (error["type"], error["code"]) == ("server_error", "no_workers")


def test_no_ready_worker_is_a_503_and_not_ready(tmp_path: Path) -> None:
    workers = [FakeWorker(n, ready=False).start() for n in range(2)]
    try:
        with serving(LIMITS, tmp_path / "gateway.log", workers, ready=0) as gateway:
            wait_until("probed", lambda: gateway.worker_counts() == (0, 2))
            assert gateway.request("GET", "/ready").status == 503
            assert gateway.request("GET", "/ready").json() == {"ready": False}
            assert gateway.request("GET", "/health").status == 200
            error = gateway.error("/v1/embeddings", {"input": "hi"}, 503)
            assert error["code"] == "no_workers"
            workers[0].ready = True
            wait_until("ready", lambda: gateway.request("GET", "/ready").status == 200)
    finally:
        for w in workers:
            w.stop()


def test_a_chunk_past_its_deadline_is_a_504_after_one_call(tmp_path: Path) -> None:
    """Not a retry on another worker that would wait the bound out again."""
    settings = {**LIMITS, "upstream_timeout_seconds": 0.5}
    with fake_fleet(settings, tmp_path / "gw.log", lambda n: FakeWorker(n, delay=5.0)) as gateway:
        assert gateway.error("/v1/embeddings", {"input": "slow"}, 504)["code"] == "upstream_timeout"
        assert gateway.calls() == [1]


def test_a_client_that_leaves_cancels_its_calls(tmp_path: Path) -> None:
    settings = {**LIMITS, "chunk_tokens": 10, "min_chunk_tokens": 1}
    names = [("embedfleet_gateway_cancelled_requests_total", {}),
             ("embedfleet_gateway_cancelled_calls_total", {})]  # fmt: skip
    with fake_fleet(settings, tmp_path / "gw.log", lambda n: FakeWorker(n, delay=5.0)) as gateway:
        body = {"input": [[i + 1] * 3 for i in range(12)]}  # four chunks
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(gateway.url + "/v1/embeddings", json=body, timeout=0.5)
        wait_until("counted", lambda: gateway.values(names)[0] == 1)
        calls = sum(len(w.calls) for w in gateway.workers)
        assert gateway.values(names) == (1, calls)
        # The fakes see each reset when they next poll their context (every 10 ms).
        wait_until("cancelled", lambda: sum(w.cancelled for w in gateway.workers) == calls)
        text = gateway.metrics()
        for w in gateway.workers:
            assert sample(text, OUTSTANDING, worker=w.address) == 0


def test_a_failed_chunk_cancels_the_rest_of_its_request(tmp_path: Path) -> None:
    """One chunk is refused at once, the other waits at its worker: the request is a 400 and
    the waiting call is given up, counted as the gateway's own cancelled call."""
    settings = {**LIMITS, "chunk_tokens": 2, "min_chunk_tokens": 1}
    gate, waiting = threading.Event(), threading.Event()

    def make(number: int) -> FakeWorker:
        return FakeWorker(number, reject_id=999, gate=gate, waiting=waiting)

    try:
        with fake_fleet(settings, tmp_path / "gw.log", make, (0, 1)) as gateway:
            assert gateway.error("/v1/embeddings", {"input": [[1, 2], [999, 4]]}, 400)
            assert waiting.is_set()  # the refusal came while the other chunk's call waited
            wait_until("cancelled", lambda: sum(w.cancelled for w in gateway.workers) == 1)
            assert gateway.value("embedfleet_gateway_cancelled_calls_total") == 1
    finally:
        gate.set()


def test_a_stopped_workers_calls_fail_over_within_the_probe_bound(tmp_path: Path) -> None:
    """Its Info probe times out (max(1 s, --probe-seconds)): the calls in flight there are given
    up and answered by the other worker well before --upstream-timeout-seconds (30 s), with one
    retry and one ejection; the call given up is not counted as a cancelled request's."""
    settings = {**LIMITS, "probe_seconds": 0.2, "upstream_timeout_seconds": 30.0}
    workers: list[StoppingWorker] = []

    def make(number: int) -> StoppingWorker:
        workers.append(StoppingWorker(number))
        return workers[-1]

    series = [RETRIES, EJECTIONS, ("embedfleet_gateway_cancelled_calls_total", {})]
    try:
        with fake_fleet(settings, tmp_path / "gw.log", make, (0, 1)) as gateway:
            stopped, other = workers
            before = gateway.values(series)
            other.ready = False  # so that the request lands on worker 0, and stalls there
            wait_until("worker 1 unready", lambda: gateway.worker_counts() == (1, 2))
            stopped.stall.set()
            with ThreadPoolExecutor(1) as pool:
                sent = pool.submit(gateway.post, "/v1/embeddings", {"input": "x"})
                wait_until("stalled at worker 0", lambda: stopped.stalled == 1)
                other.ready = True
                wait_until("worker 1 ready", lambda: gateway.worker_counts() == (2, 2))
                at = time.monotonic()
                stopped.stopped.set()  # its probes time out from now on
                answer = sent.result(timeout=45)
                took = time.monotonic() - at
            assert answer.status == 200, answer.body
            assert took < 10.0, took
            assert [int(d["embedding"][3]) for d in answer.json()["data"]] == [1]
            wait_until("the call cancelled", lambda: stopped.cancelled == 1, timeout=5)
            assert stopped.stalled == 1  # and nothing more was sent to worker 0
            moved = tuple(a - b for a, b in zip(gateway.values(series), before, strict=True))
            assert moved == (1, 1, 0)
            assert gateway.worker_counts() == (1, 2)  # unready while it does not answer
            stopped.stall.clear()
            stopped.stopped.clear()
            wait_until("worker 0 back", lambda: gateway.worker_counts() == (2, 2))
    finally:
        for w in workers:  # release any call still stalled, so the fakes stop at once
            w.stall.clear()
            w.stopped.clear()


# --- real worker processes ---------------------------------------------------------------------

#: null-engine workers that sleep through each batch as a real engine would compute it, so calls
#: are in flight when one is killed and the load costs the shared CPUs little
WORKER = ("--engine", "null", "--warmup-seconds", "0.2", "--null-tokens-per-second", "5000")


@pytest.fixture
def real(tmp_path: Path) -> Iterator[tuple[Gateway, list[WorkerProcess]]]:
    """SMALL_CHUNKS with NO_EXPIRY, in front of two real worker processes."""
    with ExitStack() as stack:
        workers = [
            stack.enter_context(running_worker(tmp_path, *WORKER, name=f"worker-{n}"))
            for n in range(2)
        ]
        settings = {**SMALL_CHUNKS, "eject_seconds": 600}
        addresses = [w.address for w in workers]
        yield (
            stack.enter_context(serving(settings, tmp_path / "gw.log", addresses=addresses)),
            workers,
        )


def _kill(worker: WorkerProcess) -> None:
    worker.signal(signal.SIGKILL)
    worker.proc.wait()


def test_a_worker_killed_under_load_loses_no_request(
    real: tuple[Gateway, list[WorkerProcess]],
) -> None:
    """Three clients over both workers (a request travels as several calls); one worker
    SIGKILLed: every request answered 200 with its own rows."""
    gateway, (victim, _) = real
    body = {"input": [f"{n} the quick brown fox jumps over the lazy dog" for n in range(8)]}
    want = gateway.ok("/v1/embeddings", body)["data"]
    stop = threading.Event()
    answered: list[int] = []
    failures: list[str] = []

    def client() -> None:
        with httpx.Client(base_url=gateway.url, timeout=60) as http:
            deadline = time.monotonic() + 60
            for _ in range(300):
                if stop.is_set() or time.monotonic() > deadline:
                    return
                reply = http.post("/v1/embeddings", json=body)
                if reply.status_code != 200 or reply.json()["data"] != want:
                    failures.append(f"{reply.status_code}: {reply.text[:200]}")
                answered.append(1)

    with ThreadPoolExecutor(3) as pool:
        clients = [pool.submit(client) for _ in range(3)]
        try:
            wait_until("load running", lambda: len(answered) >= 3)
            before = len(answered)
            _kill(victim)
            wait_until("answers after the kill", lambda: len(answered) >= before + 10)
        finally:
            stop.set()
        for c in clients:
            c.result()
    assert failures == []
    # The dead worker leaves the rotation (its probes fail); the survivor serves alone.
    wait_until("the killed worker unready", lambda: gateway.worker_counts() == (1, 2))


def test_a_worker_restarted_on_its_address_is_readmitted(
    real: tuple[Gateway, list[WorkerProcess]], tmp_path: Path
) -> None:
    """Within probes, never by its ejection running out, and served again."""
    gateway, (victim, _) = real
    port = victim.port
    _kill(victim)
    for _ in range(10):  # the survivor answers whatever picks the dead worker first
        assert gateway.post("/v1/embeddings", {"input": "x"}).status == 200
    wait_until("the dead worker out of rotation", lambda: gateway.worker_counts() == (1, 2))
    with running_worker(tmp_path, *WORKER, "--port", str(port), name="restarted") as again:
        wait_until("the restarted worker ready", lambda: gateway.worker_counts() == (2, 2))

        def embeds() -> float:
            return again.metric("embedfleet_worker_requests_total", rpc="Embed", code="OK")

        start = embeds()
        for _ in range(40):  # two workers to pick from: at most 40 requests
            assert gateway.post("/v1/embeddings", {"input": "x"}).status == 200
            if embeds() > start:
                break
        assert embeds() > start

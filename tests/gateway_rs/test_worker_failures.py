"""Workers failing behind both gateways, as clients see it: a worker killed under load loses no
request, one restarted on its address is readmitted, one answering UNAVAILABLE is ejected and
gauged so, one rejecting the input is a 400 and no retry; and --coalesce-inflight "" is unset
(a negative one is refused with every other setting below its minimum: test_settings.py)."""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import orjson

from embedfleet.common.modeldir import ModelDir
from embedfleet.common.settings import load
from embedfleet.gateway.settings import ENV_PREFIX, GatewaySettings
from embedfleet.testing.workers import WorkerProcess, metric_value, running_worker
from tests.gateway.fakes import FakeWorker
from tests.gateway.helpers import wait_until

from .conftest import LIMITS, SMALL_CHUNKS, fake_gateways, flags
from .pair import Answer, One, Pair, gateways, same

RETRIES: tuple[str, dict[str, str]] = ("embedfleet_gateway_retries_total", {})
EJECTIONS: tuple[str, dict[str, str]] = ("embedfleet_gateway_worker_ejections_total", {})
#: longer than any test here: a worker back in rotation was readmitted, its ejection never ran out
NO_EXPIRY: dict[str, object] = {**LIMITS, "eject_seconds": 600}
#: null-engine workers that sleep through each batch as a real engine would compute it, so calls
#: are in flight when one is killed and the load costs the shared CPUs little
WORKER = ("--engine", "null", "--warmup-seconds", "0.2", "--null-tokens-per-second", "5000")
#: per gateway: concurrent clients, and each one's bound in requests and seconds
CLIENTS = 3
MOST_REQUESTS = 300
LOAD_SECONDS = 60.0


@contextlib.contextmanager
def _real_workers(
    minilm: ModelDir, workdir: Path, settings: Mapping[str, object]
) -> Iterator[tuple[Pair, list[WorkerProcess]]]:
    """Both gateways with `settings` in front of the same two real worker processes, once both
    count both ready."""
    with contextlib.ExitStack() as stack:
        workers = [
            stack.enter_context(running_worker(workdir, *WORKER, name=f"worker-{n}"))
            for n in range(2)
        ]
        addresses = tuple(w.address for w in workers)
        python = GatewaySettings(workers=addresses, **settings)  # type: ignore[arg-type]
        rust = ["--workers", ",".join(addresses), *flags(dict(settings))]
        pair = stack.enter_context(gateways(minilm, python, rust, workdir / "gateway-rs.log"))
        wait_until("workers ready", lambda: pair.worker_counts() == [(2, 2)] * 2)
        yield pair, workers


def _kill(worker: WorkerProcess) -> None:
    worker.signal(signal.SIGKILL)
    worker.proc.wait()


@dataclass
class _Load:
    """Clients posting `body` through one gateway until `stop` (or their bounds), each answer
    checked against `want`, the rows of the same body answered before."""

    gateway: One
    body: bytes
    want: Any
    stop: threading.Event
    answered: int = 0
    failures: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def client(self) -> None:
        deadline = time.monotonic() + LOAD_SECONDS
        for _ in range(MOST_REQUESTS):
            if self.stop.is_set() or time.monotonic() > deadline:
                return
            reply = self.gateway.request("POST", "/v1/embeddings", content=self.body)
            problem = ""
            if reply.status != 200:
                problem = f"{reply.status}: {reply.body!r}"
            else:
                try:
                    same(reply.json()["data"], self.want)
                except AssertionError as exc:
                    problem = f"wrong rows: {exc}"
            with self._lock:
                self.answered += 1
                if problem:
                    self.failures.append(problem)


def test_a_worker_killed_under_load_loses_no_request(
    minilm: ModelDir, rust_binary: Path, tmp_path: Path
) -> None:
    """Each gateway under load from its own clients, over both workers (small chunks: a request
    travels as several calls); one worker SIGKILLed: every request answered 200, its own rows."""
    with _real_workers(minilm, tmp_path, SMALL_CHUNKS) as (pair, (victim, _)):
        body = {"input": [f"{n} the quick brown fox jumps over the lazy dog" for n in range(8)]}
        want = pair.embed(body)["data"]
        stop = threading.Event()
        loads = [_Load(one, orjson.dumps(body), want, stop) for one in (pair.python(), pair.rust())]
        with ThreadPoolExecutor(CLIENTS * len(loads)) as pool:
            clients = [pool.submit(load.client) for load in loads for _ in range(CLIENTS)]
            try:
                wait_until("both loads running", lambda: all(x.answered >= 3 for x in loads))
                before = [x.answered for x in loads]
                _kill(victim)
                wait_until(
                    "answers after the kill",
                    lambda: all(x.answered >= b + 10 for x, b in zip(loads, before, strict=True)),
                )
            finally:
                stop.set()
            for c in clients:
                c.result()
        for load, name in zip(loads, ("python", "rust"), strict=True):
            assert load.failures == [], (name, load.failures[:3])
        # The dead worker leaves the rotation (its probes fail); the survivor serves alone.
        wait_until("the killed worker unready", lambda: pair.worker_counts() == [(1, 2)] * 2)
        assert pair.embed(body)["data"] == want


def _served_new(pair: Pair, worker: WorkerProcess) -> list[bool]:
    """Whether each gateway's requests reach `worker` (two workers to pick from: at most 40
    requests each, so a worker left out of the picks shows as False)."""

    def embeds() -> float:
        return worker.metric("embedfleet_worker_requests_total", rpc="Embed", code="OK")

    out = []
    for one in (pair.python(), pair.rust()):
        start = embeds()
        for _ in range(40):
            reply = one.request("POST", "/v1/embeddings", content=b'{"input": "x"}')
            assert reply.status == 200, reply.body
            if embeds() > start:
                break
        out.append(embeds() > start)
    return out


def test_a_worker_restarted_on_its_address_is_readmitted(
    minilm: ModelDir, rust_binary: Path, tmp_path: Path
) -> None:
    """A worker killed and started again on its port comes back to each gateway's rotation within
    probes, never by its ejection running out, and serves again (Rust: on a new stream)."""
    with _real_workers(minilm, tmp_path, NO_EXPIRY) as (pair, (victim, _)):
        port = victim.port
        _kill(victim)
        # Requests right after the kill may pick the dead worker first (a failed call ejects it)
        # or find it unready (a failed probe): either way the survivor answers them.
        for _ in range(10):
            pair.embed({"input": "x"})
        wait_until("the dead worker out of rotation", lambda: pair.worker_counts() == [(1, 2)] * 2)
        with running_worker(tmp_path, *WORKER, "--port", str(port), name="restarted") as again:
            assert again.port == port
            wait_until("the restarted worker ready", lambda: pair.worker_counts() == [(2, 2)] * 2)
            assert _served_new(pair, again) == [True, True]


def _unavailable_worker_0(number: int) -> FakeWorker:
    if number == 0:
        return FakeWorker(number, fail_code=grpc.StatusCode.UNAVAILABLE, fail_count=1000)
    return FakeWorker(number)


def test_a_worker_failing_unavailable_is_ejected_and_gauged_alike(
    minilm: ModelDir, rust_binary: Path, tmp_path: Path
) -> None:
    """Worker 0 answers every call UNAVAILABLE: the first call each gateway sends it is retried
    on worker 1 and ejects it; from then on neither sends it anything while it sits its ejection
    out, gauged as ejected (not unready: its probes answer)."""
    requests = [("/v1/embeddings", {"input": "x"})] * 40  # one call each, so one retry at most
    with fake_gateways(
        minilm,
        NO_EXPIRY,
        tmp_path / "gw.log",
        _unavailable_worker_0,
        numbers=(0, 1),
    ) as pair:
        # compare(): every answer equal, so worker 1's rows through both (worker 0 answers none)
        deltas = pair.metric_deltas([RETRIES, EJECTIONS], requests)
        assert deltas == [(1, 1), (1, 1)]  # worker 0 picked at least once in 40 (p = 1 - 2^-40)
        assert [ws[0].fail_count for ws in (pair.python_workers, pair.rust_workers)] == [999] * 2
        assert pair.served_by(["x", "y"]) == [{1}, {1}]
        for one in (pair.python(), pair.rust()):
            text = one.request("GET", "/metrics").body.decode()
            gauge = [
                metric_value(text, "embedfleet_gateway_workers", state=s)
                for s in ("ready", "ejected", "unready")
            ]
            assert gauge == [1, 1, 0]


def test_a_worker_s_rejection_is_a_400_and_no_retry(fake_pair: Pair) -> None:
    """INVALID_ARGUMENT is the client's fault: answered 400 at once, never retried elsewhere."""

    def arm(count: int) -> None:
        for w in fake_pair.python_workers + fake_pair.rust_workers:
            w.fail_code, w.fail_count = grpc.StatusCode.INVALID_ARGUMENT, count

    body = {"input": [[5, 6]]}
    try:
        arm(1)
        py, rs = fake_pair.both("POST", "/v1/embeddings", content=orjson.dumps(body))
        assert py.status == rs.status == 400, (py.body, rs.body)
        same(py.json(), rs.json())
        assert "rejected the input" in py.json()["error"]["message"]
        arm(1)
        deltas = fake_pair.metric_deltas([RETRIES, EJECTIONS], [("/v1/embeddings", body)])
        assert deltas == [(0, 0), (0, 0)]
        # One call each, the one that failed: the other worker kept its failure unspent.
        for workers in (fake_pair.python_workers, fake_pair.rust_workers):
            assert sorted(w.fail_count for w in workers) == [0, 1]
    finally:
        arm(0)


def _query(gateway: One, text: str) -> Answer:
    return gateway.request("POST", "/v1/embeddings", json={"input": text})


def test_an_empty_coalesce_inflight_is_unset(
    minilm: ModelDir, rust_binary: Path, tmp_path: Path
) -> None:
    """ "" takes the device's calls in flight, one for a CPU worker; were it 0 (no coalescing),
    concurrent queries would each be a call of their own, in flight at once."""
    argv = ["--coalesce-inflight", "", *flags(dict[str, object](LIMITS))]
    assert load(GatewaySettings, ENV_PREFIX, argv, env={}).coalesce_inflight is None
    env = {ENV_PREFIX + "COALESCE_INFLIGHT": ""}
    assert load(GatewaySettings, ENV_PREFIX, [], env=env).coalesce_inflight is None
    workers = [FakeWorker(n, delay=0.3).start() for n in range(2)]
    try:
        python = load(GatewaySettings, ENV_PREFIX, [*argv, "--workers", workers[0].address], env={})
        rust = [*argv, "--workers", workers[1].address]
        with gateways(minilm, python, rust, tmp_path / "gw.log") as pair:
            wait_until("workers ready", lambda: pair.worker_counts() == [(1, 1)] * 2)
            texts = [" ".join(["word"] * n) for n in range(1, 7)]
            for one, worker in zip((pair.python(), pair.rust()), workers, strict=True):
                with ThreadPoolExecutor(len(texts)) as pool:
                    answers = list(pool.map(functools.partial(_query, one), texts))
                assert [a.status for a in answers] == [200] * len(texts)
                assert sum(worker.calls) == len(texts)
                assert worker.most_running == 1, worker.calls
    finally:
        for w in workers:
            w.stop()

"""The gateway binary as the tests run it: started on 127.0.0.1 with settings as flags, in front of
FAKE workers (fakes.py) or real worker processes, and read through HTTP alone: its answers, and
its /metrics parsed by prometheus_client's text parser."""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from embedfleet.testing.families import FamilyDirs
from embedfleet.testing.gateway import child_env, gateway_binary, running_gateway
from embedfleet.testing.polling import wait_for
from embedfleet.testing.workers import running_worker

from .fakes import FakeWorker

#: small limits, so the 413s are cheap to reach; quick probes and ejections
LIMITS: dict[str, object] = {
    "max_client_batch": 64,
    "max_request_tokens": 10_000,
    "max_body_bytes": 400_000,
    "probe_seconds": 0.1,
    "eject_seconds": 0.2,
}
#: small chunks, so a request of a few inputs already travels as several calls
SMALL_CHUNKS: dict[str, object] = {**LIMITS, "chunk_tokens": 64, "min_chunk_tokens": 16}
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
#: the OpenAI error body's keys
ERROR_KEYS = {"message", "type", "param", "code"}


def wait_until(what: str, probe: Callable[[], object], timeout: float = 20.0) -> None:
    """`wait_for` at the pace of in-process fakes and a local gateway (milliseconds)."""
    wait_for(what, probe, timeout=timeout, interval=0.02)


def flags(settings: Mapping[str, object]) -> list[str]:
    return [f for k, v in settings.items() for f in (f"--{k.replace('_', '-')}", str(v))]


def run_binary(
    *argv: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The binary run to its exit (a refusal at start, say), its output captured."""
    return subprocess.run(
        [str(gateway_binary()), *argv],
        env=child_env() if env is None else dict(env),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _label_is(got: str | None, want: str | float) -> bool:
    if got is None:
        return False
    if isinstance(want, int | float):  # a histogram's `le`, whatever its spelling
        return float(got) == float(want)
    return got == want


def sample(text: str, name: str, **labels: str | float) -> float:
    """The value of the first sample `name` carrying `labels` (others may be there too) in a
    Prometheus text exposition; 0.0 when there is none."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(_label_is(s.labels.get(k), v) for k, v in labels.items()):
                return float(s.value)
    return 0.0


#: (sample name, labels): one series, as `Gateway.values` reads it
Series = tuple[str, dict[str, Any]]


@dataclass
class Reply:
    status: int
    headers: httpx.Headers
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class Gateway:
    """A running gateway binary; `workers`: its FAKE workers, when a test reads them."""

    url: str
    log: Path
    proc: subprocess.Popen[bytes]
    workers: list[FakeWorker] = field(default_factory=list)
    client: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.client = httpx.Client(base_url=self.url, timeout=60)

    def request(self, method: str, path: str, **kw: Any) -> Reply:
        reply = self.client.request(method, path, **kw)
        return Reply(reply.status_code, reply.headers, reply.content)

    def post(self, path: str, body: Any, **kw: Any) -> Reply:
        content = body if isinstance(body, bytes) else orjson.dumps(body)
        return self.request("POST", path, content=content, **kw)

    def ok(self, path: str, body: Any, **kw: Any) -> Any:
        """The answer's document, asserting a 200."""
        reply = self.post(path, body, **kw)
        assert reply.status == 200, reply.body
        return reply.json()

    def error(self, path: str, body: Any, status: int, **kw: Any) -> dict[str, Any]:
        """The OpenAI-shaped error of the answer, asserting its status."""
        reply = self.post(path, body, **kw)
        assert reply.status == status, reply.body
        doc = reply.json()
        assert set(doc) == {"error"}
        error: dict[str, Any] = doc["error"]
        assert set(error) == ERROR_KEYS
        return error

    def metrics(self) -> str:
        reply = self.request("GET", "/metrics")
        assert reply.status == 200
        return reply.body.decode()

    def value(self, name: str, **labels: str | float) -> float:
        return sample(self.metrics(), name, **labels)

    def values(self, series: Sequence[Series]) -> tuple[float, ...]:
        text = self.metrics()
        return tuple(sample(text, name, **labels) for name, labels in series)

    def deltas(self, series: Sequence[Series], requests: Sequence[tuple[str, Any]]) -> tuple:  # type: ignore[type-arg]
        """How far `series` moved while `requests` (path, body) were answered."""
        before = self.values(series)
        for path, body in requests:
            self.post(path, body)
        return tuple(a - b for a, b in zip(self.values(series), before, strict=True))

    def calls(self) -> list[int]:
        """Sequences per call the FAKE workers saw, sorted, and forgets them."""
        seen = sorted(n for w in self.workers for n in w.calls)
        for w in self.workers:
            w.calls.clear()
        return seen

    def worker_counts(self, **labels: str) -> tuple[float, float]:
        """(ready, all) workers the gateway counts in embedfleet_gateway_workers{state}."""
        text = self.metrics()
        name = "embedfleet_gateway_workers"
        states = [sample(text, name, state=s, **labels) for s in ("ready", "ejected", "unready")]
        return states[0], sum(states)

    def served_by(self, inputs: list[Any]) -> set[int]:
        """The numbers of the FAKE workers that computed the rows of `inputs`."""
        return {
            int(d["embedding"][3]) for d in self.ok("/v1/embeddings", {"input": inputs})["data"]
        }

    def set_workers(self, **fields: Any) -> None:
        for w in self.workers:
            for name, value in fields.items():
                setattr(w, name, value)

    def queued_seconds_are(self, want: float) -> None:
        """Waits until embedfleet_gateway_queued_work_seconds reads `want` (probes read Info)."""
        name = "embedfleet_gateway_queued_work_seconds"
        wait_until(f"{name} {want}", lambda: abs(self.value(name) - want) < 1e-6, timeout=5)

    def shed(self, path: str, body: Any) -> tuple[str, str]:
        """The request sent until the gateway sheds it (its probes see the workers' new Info
        within --probe-seconds); the 429's message and Retry-After."""

        def refused() -> Reply | None:
            reply = self.post(path, body)
            return reply if reply.status == 429 else None

        reply = wait_for("a 429", refused, timeout=5, interval=0.02)
        error = reply.json()["error"]
        assert (error["type"], error["code"]) == ("rate_limit_error", "overloaded")
        return str(error["message"]), reply.headers["retry-after"]

    def served(self) -> None:
        """Waits until a one-text request is answered 200 again."""
        wait_until("served", lambda: self.post("/v1/embeddings", {"input": "x"}).status == 200, 5)


@contextlib.contextmanager
def serving(
    settings: Mapping[str, object],
    log: Path,
    workers: Sequence[FakeWorker] = (),
    addresses: Sequence[str] = (),
    ready: int | None = None,
) -> Iterator[Gateway]:
    """The binary with `settings` in front of `workers` (FAKE) or `addresses`, once it counts
    `ready` workers ready (default: all of them; 0 or None without workers: once it serves)."""
    named = [w.address for w in workers] or list(addresses)
    want = len(named) if ready is None else ready
    with running_gateway(named, *flags(settings), log=log, wait_ready=want > 0) as rs:
        gateway = Gateway(rs.url, log, rs.proc, list(workers))
        try:
            if want:
                wait_until("workers ready", lambda: gateway.worker_counts()[0] == want)
            yield gateway
        finally:
            gateway.client.close()


@contextlib.contextmanager
def fake_fleet(
    settings: Mapping[str, object],
    log: Path,
    make: Callable[[int], FakeWorker] = FakeWorker,
    numbers: Sequence[int] = (0, 0),
) -> Iterator[Gateway]:
    """The binary with `settings` in front of FAKE workers `make(n)` for n in `numbers`."""
    workers = [make(n).start() for n in numbers]
    try:
        with serving(settings, log, workers) as gateway:
            yield gateway
    finally:
        for w in workers:
            w.stop()


@contextlib.contextmanager
def behind_worker(
    model: Path, workdir: Path, extra: Mapping[str, object] | None = None, engine: str = "null"
) -> Iterator[Gateway]:
    """The binary serving the model directory `model` (SMALL_CHUNKS and `extra`, which the worker
    gets too) in front of one real worker process: the null engine, or with "torch" one computing
    real numbers (one thread, float32)."""
    extra = dict(extra or {})
    # float32: these tests compare to the reference at float32's tolerance, and `auto` picks
    # bfloat16 on a CPU with native bf16 (avx512_bf16, AMX)
    own = ("--engine", "null") if engine == "null" else ("--threads", "1", "--dtype", "float32")
    argv = (*own, "--warmup-seconds", "0.2", "--model", str(model), *flags(extra))
    with running_worker(workdir, *argv) as worker:
        settings = {"model": model, **SMALL_CHUNKS, **extra}
        with serving(settings, workdir / "gateway.log", addresses=[worker.address]) as gateway:
            yield gateway


def bge_m3_served_as(task: str, family_dirs: FamilyDirs, workdir: Path) -> Iterator[Gateway]:
    """The binary in front of a real torch worker serving the random-weight bge-m3 as `task`
    (multivector, sparse): a module fixture's body."""
    with behind_worker(family_dirs.get("bge-m3"), workdir, {"task": task}, engine="torch") as gw:
        yield gw


def host_ip() -> str:
    """This machine's outbound IPv4 address: the API refuses loopback endpoint addresses."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(("203.0.113.1", 9))  # UDP connect sends nothing; it only picks a route
            return str(sock.getsockname()[0])
    except OSError:  # no default route: any non-loopback address of this host
        names = socket.gethostbyname_ex(socket.gethostname())[2]
        return next(a for a in names if not a.startswith("127."))


def service_slice(
    name: str, service: str, ip: str, port: int, ready: bool = True
) -> dict[str, Any]:
    """An EndpointSlice of `service` with one endpoint at ip:port (its port named grpc)."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "grpc", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": ready}}],
    }

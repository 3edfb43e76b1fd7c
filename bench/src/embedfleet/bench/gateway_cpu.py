"""The gateway benchmark's CPU suites: server CPU µs per request, gateway and worker front apart.

`python -m embedfleet.bench.gateway --suites cpu,scaling [--engine null|torch] [--profile]`

- `cpu`: 1-text ~20-token queries, 16-text batches of them, and 100-text batches of 512 tokens,
  at 1 and 16 clients, through each gateway variant in turn against the same worker. For each point
  it reads the gateway's and the worker's own utime+stime (/proc) before and after, so each figure
  is one process's CPU per answered request; req/s per core is 10^6 / (gateway + worker µs).
  `worker alone` is the same batches sent straight to the worker over gRPC (no gateway).
- `scaling`: the same 1x20 queries from 16 clients through one gateway process, then through two
  (8 clients each, one worker behind both): the gateway keeps no state, so a second one adds req/s.
- `--profile` (on by default): a fresh fleet runs the `PROFILED` points with its worker under
  cProfile (cpu_profile.py) and the stage table says where the worker's CPU went.

Variants: this tree's gateway binary (gateway/, built or reused by hack/build-gateway.sh) as
it runs by default and with each option under test switched (`VARIANTS`: no coalescing, unary
calls instead of the stream, two calls in flight) and tracing every request to a collector that
only counts (`TRACED`), plus `--baseline-binary` (another tree's build, e.g. main's) for a
before/after in one run, against the same worker. The `gateway's own ms/req` column is a
gateway's request time less its time waiting on workers (its own histograms, mean over the
warm-up and the measured window).
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import orjson

from embedfleet.bench import corpus, cpu_profile
from embedfleet.bench.gateway_procs import (
    RawHttp,
    spawn_gateway,
    worker_call,
)
from embedfleet.bench.http_load import Call, Measurement, run_point
from embedfleet.common.codec import pack_tokens
from embedfleet.common.modeldir import default_model_path, load_model_dir
from embedfleet.common.net import free_ports
from embedfleet.fleet.supervisor import Fleet
from embedfleet.testing.gateway import child_env, gateway_binary
from embedfleet.testing.otlp import running_collector
from embedfleet.testing.procfs import tree_cpu_seconds
from embedfleet.testing.workers import metric_value, scrape

#: shape name -> (texts per request, tokens per text including [CLS]/[SEP])
SHAPES: dict[str, tuple[int, int]] = {"1x20": (1, 20), "16x20": (16, 20), "100x512": (100, 512)}
#: shape -> client counts, per engine (the real engine on a CPU runs 100x512 in seconds)
CLIENTS: dict[str, dict[str, tuple[int, ...]]] = {
    "null": {"1x20": (1, 16), "16x20": (1, 16), "100x512": (1, 4)},
    "torch": {"1x20": (1, 16), "16x20": (1, 16), "100x512": (1,)},
}
#: the points --profile runs: (shape, clients)
PROFILED = (("1x20", 16), ("100x512", 1))
#: MiniLM's sentence-transformers limit is 256 tokens; its positions allow 512 (the 100x512 shape)
LIMIT = ["--max-input-tokens", "512"]
#: bodies per shape, cycled: requests differ without the client encoding anything while measured
POOL = 32

#: gateway variant -> its extra flags (this tree's gateway with an option under test)
VARIANTS: dict[str, list[str]] = {
    "gateway, no coalescing": ["--coalesce-inflight", "0"],
    "gateway, unary calls": ["--coalesce-stream", "0"],
    "gateway (default)": [],
    # The default before calls in flight followed the worker's device (one for a CPU worker).
    "gateway, 2 calls in flight": ["--coalesce-inflight", "2"],
}
#: the gateway exporting a span of every request (to a collector that only counts them)
TRACED = "gateway, traced"
#: another build of the gateway (--baseline-binary), in front of the same worker
BASELINE = "baseline gateway"


@dataclass(frozen=True)
class CpuRow:
    system: str
    engine: str
    shape: str
    clients: int
    requests: int
    requests_per_second: float
    p50_ms: float
    p99_ms: float
    gateway_cpu_us: float
    worker_cpu_us: float
    errors: int
    #: the gateway's own time per request, ms (mean): its request_seconds less its
    #: upstream_seconds (the worker calls); NaN for the worker alone
    gateway_own_ms: float = float("nan")

    @property
    def total_cpu_us(self) -> float:
        return self.gateway_cpu_us + self.worker_cpu_us

    @property
    def per_core(self) -> float:
        """Requests one core serves at this CPU cost (10^6 µs / server µs per request)."""
        return 1e6 / self.total_cpu_us if self.total_cpu_us > 0 else float("inf")


def exact_texts(length: int, n: int) -> list[str]:
    """`n` corpus passages of exactly `length` tokens ([CLS] and [SEP] included)."""
    pool = corpus.load().of_length(length)
    return [pool[i % len(pool)] for i in range(n)]


@dataclass(frozen=True)
class Inputs:
    bodies: list[bytes]
    token_ids: list[list[list[int]]]


def inputs(shape: str) -> Inputs:
    batch, length = SHAPES[shape]
    texts = exact_texts(length, POOL * batch if length != 512 else 256)
    tok = load_model_dir(default_model_path()).tokenizer()
    bodies, ids = [], []
    for i in range(POOL):
        chosen = [texts[(i * batch + j) % len(texts)] for j in range(batch)]
        body = {"input": chosen[0] if batch == 1 else chosen}
        bodies.append(orjson.dumps(body))
        ids.append([e.ids for e in tok.encode_batch(chosen)])
    return Inputs(bodies, ids)


def http_call(
    ports: Sequence[int], clients: int, bodies: list[bytes]
) -> tuple[Call, list[RawHttp]]:
    """Client i talks to gateway ports[i % len(ports)] and sends the pool's bodies in turn."""
    conns = [RawHttp("127.0.0.1", ports[i % len(ports)]) for i in range(clients)]

    async def call(index: int, n: int) -> None:
        await conns[index].post("/v1/embeddings", bodies[(index * 7 + n) % len(bodies)])

    return call, conns


async def measure(
    call: Call, clients: int, seconds: float, gateways: Sequence[int], worker: int
) -> tuple[Measurement, float, float]:
    """(measurement, gateway CPU µs/request, worker CPU µs/request) over one point."""
    await run_point(call, clients, min(1.0, seconds / 3), 0, 0, 1)
    g0 = sum(tree_cpu_seconds(p) for p in gateways)
    w0 = tree_cpu_seconds(worker)
    m = await run_point(call, clients, seconds, 0, 0, 1, min_requests=3)
    n = max(1, m.requests)
    g = (sum(tree_cpu_seconds(p) for p in gateways) - g0) / n * 1e6
    w = (tree_cpu_seconds(worker) - w0) / n * 1e6
    return m, g, w


Seconds = tuple[float, float, float, float]


def gateway_seconds(port: int) -> Seconds:
    """(requests, request seconds, worker calls, their seconds) a gateway has counted for
    /v1/embeddings: the same families in both gateways."""
    text = scrape(port)
    route = {"route": "/v1/embeddings"}
    return (
        metric_value(text, "embedfleet_gateway_request_seconds_count", **route),
        metric_value(text, "embedfleet_gateway_request_seconds_sum", **route),
        metric_value(text, "embedfleet_gateway_upstream_seconds_count"),
        metric_value(text, "embedfleet_gateway_upstream_seconds_sum"),
    )


def own_ms(before: Seconds, after: Seconds) -> float:
    """Mean ms a request spent in the gateway other than waiting on its worker call; NaN unless
    each request made exactly one call (several run at once and overlap). Pure."""
    n, request, calls, upstream = (b - a for a, b in zip(before, after, strict=True))
    return (request - upstream) / n * 1e3 if n > 0 and calls == n else float("nan")


async def measure_together(
    systems: Sequence[tuple[Call, Sequence[int], int]], clients: int, seconds: float
) -> list[tuple[Measurement, float, float]]:
    """`measure` for several (call, gateway pids, worker pid) systems loaded at the same time,
    each by its own `clients`: whatever else the machine runs meanwhile falls on all alike."""

    def cpu() -> list[tuple[float, float]]:
        return [(sum(tree_cpu_seconds(p) for p in g), tree_cpu_seconds(w)) for _, g, w in systems]

    warm = min(1.0, seconds / 3)
    await asyncio.gather(*(run_point(c, clients, warm, 0, 0, 1) for c, _, _ in systems))
    before = cpu()
    ms = await asyncio.gather(
        *(run_point(c, clients, seconds, 0, 0, 1, min_requests=3) for c, _, _ in systems)
    )
    after = cpu()
    out = []
    for m, (g0, w0), (g1, w1) in zip(ms, before, after, strict=True):
        n = max(1, m.requests)
        out.append((m, (g1 - g0) / n * 1e6, (w1 - w0) / n * 1e6))
    return out


@dataclass
class Gateways:
    """Gateway processes by variant name, all in front of the same workers."""

    ports: dict[str, int]
    pids: dict[str, int]


#: a system: the gateway binary and its extra flags
System = tuple[str, list[str]]


@contextmanager
def gateways(workers: str, variants: dict[str, System], log: Path) -> Iterator[Gateways]:
    procs = []
    out = Gateways({}, {})
    try:
        for name, (binary, flags) in variants.items():
            (port,) = free_ports(1)
            argv = [binary, "--port", str(port), "--workers", workers, "--log-level", "warning"]
            proc = spawn_gateway([*argv, *LIMIT, *flags], child_env(), port, log)
            procs.append(proc)
            out.ports[name], out.pids[name] = port, proc.pid
        yield out
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(20)


def systems(baseline_binary: str = "", collector: str = "") -> dict[str, System]:
    """The systems of a run; with a `collector` endpoint, also the gateway tracing every request
    to it (TRACED: what tracing costs the gateway; its worker does not trace)."""
    binary = str(gateway_binary())
    chosen = {name: (binary, flags) for name, flags in VARIANTS.items()}
    if collector:
        chosen[TRACED] = (binary, ["--tracing-endpoint", collector])
    if baseline_binary:
        chosen = {BASELINE: (baseline_binary, []), **chosen}
    return chosen


async def run_cpu(
    engine: str,
    seconds: float,
    baseline_binary: str,
    shapes: Sequence[str],
    log_dir: Path,
    repeat: int = 1,
) -> list[CpuRow]:
    """Each system in front of the same worker, one after the other, then (with a baseline) the
    baseline and PAIRED at the same time (their worker CPU then shared between them)."""
    rows: list[CpuRow] = []
    worker_args = ["--engine", engine, "--warmup-seconds", "0.5", *LIMIT]
    (gw_port,) = free_ports(1)
    with (
        running_collector(keep=False) as (_, collector),
        Fleet(workers=1, port=gw_port, worker_args=worker_args, log_dir=log_dir) as fleet,
    ):
        worker = fleet.worker_children[0]
        assert worker.process is not None
        wpid = worker.process.pid
        # The fleet's own gateway idles; ours are started with the variants' flags.
        chosen = systems(baseline_binary, collector)
        with gateways(worker.address, chosen, log_dir / "gateways.log") as gws:
            for shape in shapes:
                data = inputs(shape)
                for clients in CLIENTS[engine][shape]:
                    batch = pack_tokens(data.token_ids[0])
                    point: list[CpuRow] = []
                    # Rounds of every system in turn: a neighbour's load that comes and goes
                    # then lands on all of them, and each system's median round is kept.
                    for _ in range(repeat):
                        wcall, channel = worker_call(worker.address, batch)
                        m, _, w = await measure(wcall, clients, seconds, [], wpid)
                        await channel.close(None)
                        point.append(_row("worker alone (gRPC)", engine, shape, m, 0.0, w))
                        _print(point[-1])
                        for name, port in gws.ports.items():
                            call, conns = http_call([port], clients, data.bodies)
                            # counted from the warm-up on too: a mean over both windows
                            before = gateway_seconds(port)
                            m, g, w = await measure(call, clients, seconds, [gws.pids[name]], wpid)
                            own = own_ms(before, gateway_seconds(port))
                            for c in conns:
                                c.close()
                            point.append(_row(name, engine, shape, m, g, w, own))
                            _print(point[-1])
                        if BASELINE in gws.ports:
                            point += await _paired(gws, wpid, engine, shape, clients, seconds, data)
                    rows += medians(point)
    return rows


async def _paired(
    gws: Gateways, wpid: int, engine: str, shape: str, clients: int, seconds: float, data: Inputs
) -> list[CpuRow]:
    pair = [BASELINE, PAIRED]
    calls = [http_call([gws.ports[n]], clients, data.bodies) for n in pair]
    both = [(call, [gws.pids[n]], wpid) for n, (call, _) in zip(pair, calls, strict=True)]
    results = await measure_together(both, clients, seconds)
    out = []
    for n, (_, conns), (m, g, w) in zip(pair, calls, results, strict=True):
        for c in conns:
            c.close()
        out.append(_row(f"{n}, paired", engine, shape, m, g, w))
        _print(out[-1])
    return out


#: the variant that also runs at the same time as the baseline (rows "..., paired")
PAIRED = "gateway (default)"


def medians(rows: Sequence[CpuRow]) -> list[CpuRow]:
    """Per system (in first-seen order), its round of median total CPU per request. Pure."""
    by: dict[str, list[CpuRow]] = {}
    for r in rows:
        by.setdefault(r.system, []).append(r)
    out = []
    for group in by.values():
        ranked = sorted(group, key=lambda r: r.total_cpu_us)
        out.append(ranked[(len(ranked) - 1) // 2])
    return out


async def run_scaling(seconds: float, log_dir: Path, clients: int = 16) -> list[CpuRow]:
    """1x20 queries from `clients` clients via one gateway, then split over two."""
    rows: list[CpuRow] = []
    worker_args = ["--engine", "null", "--warmup-seconds", "0.5", *LIMIT]
    (gw_port,) = free_ports(1)
    data = inputs("1x20")
    with Fleet(workers=1, port=gw_port, worker_args=worker_args, log_dir=log_dir) as fleet:
        worker = fleet.worker_children[0]
        assert worker.process is not None
        binary = str(gateway_binary())
        two: dict[str, System] = {"a": (binary, []), "b": (binary, [])}
        with gateways(worker.address, two, log_dir / "scaling.log") as gws:
            for n in (1, 2):
                ports = list(gws.ports.values())[:n]
                pids = list(gws.pids.values())[:n]
                call, conns = http_call(ports, clients, data.bodies)
                m, g, w = await measure(call, clients, seconds, pids, worker.process.pid)
                for c in conns:
                    c.close()
                rows.append(_row(f"{n} gateway process(es)", "null", "1x20", m, g, w))
                _print(rows[-1])
    return rows


async def run_profile(
    engine: str, seconds: float, log_dir: Path, shape: str = "1x20", clients: int = 16
) -> str:
    """The stage table of a profiled worker serving `shape` from `clients` clients through the
    gateway (a native binary: cProfile sees only the worker's Python)."""
    prof = Path(tempfile.mkdtemp(prefix="bench-profile-"))
    hook = cpu_profile.hook_dir(prof / "hook")
    saved = dict(os.environ)
    os.environ[cpu_profile.ENV] = str(prof)
    os.environ["PYTHONPATH"] = f"{hook}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    data = inputs(shape)
    try:
        (gw_port,) = free_ports(1)
        worker_args = ["--engine", engine, "--warmup-seconds", "0.5", *LIMIT]
        fleet = Fleet(
            workers=1, port=gw_port, worker_args=worker_args, gateway_args=LIMIT, log_dir=log_dir
        )
        with fleet:
            pids = [c.process.pid for c in fleet.worker_children if c.process is not None]
            call, conns = http_call([gw_port], clients, data.bodies)
            await run_point(call, clients, 0.5, 0, 0, 1)
            for pid in pids:
                os.kill(pid, signal.SIGUSR1)
            m = await run_point(call, clients, seconds, 0, 0, 1, min_requests=3)
            for pid in pids:
                os.kill(pid, signal.SIGUSR2)
            for c in conns:
                c.close()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    head = f"Profiled: {engine} engine, {shape}, {clients} clients, {m.requests} requests.\n\n"
    return head + cpu_profile.table("worker", sorted(prof.glob("*.prof")), m.requests)


def _row(
    name: str, engine: str, shape: str, m: Measurement, g: float, w: float, own: float = math.nan
) -> CpuRow:
    return CpuRow(
        name, engine, shape, m.clients, m.requests, m.requests_per_second,
        m.p50_ms, m.p99_ms, g, w, m.errors, own,
    )  # fmt: skip


def _print(r: CpuRow) -> None:
    print(
        f"  {r.system:28s} {r.engine:5s} {r.shape:8s} x{r.clients:<3d} {r.requests_per_second:8.0f}"
        f" req/s  gateway {r.gateway_cpu_us:6.0f} µs  worker {r.worker_cpu_us:6.0f} µs",
        flush=True,
    )


def cpu_table(rows: Sequence[CpuRow]) -> str:
    lines = [
        "| engine | shape | clients | system | req/s | p50 ms | gateway's own ms/req | "
        "gateway CPU µs/req | worker CPU µs/req | total µs/req | req/s per core | errors |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        own = "" if math.isnan(r.gateway_own_ms) else f"{r.gateway_own_ms:.3f}"
        lines.append(
            f"| {r.engine} | {r.shape} | {r.clients} | {r.system} | {r.requests_per_second:.0f} | "
            f"{r.p50_ms:.2f} | {own} | {r.gateway_cpu_us:.0f} | {r.worker_cpu_us:.0f} | "
            f"{r.total_cpu_us:.0f} | {r.per_core:.0f} | {r.errors} |"
        )
    ratios = _ratios(rows)
    if ratios:
        lines += ["", *ratios]
    return "\n".join(lines) + "\n"


def _ratios(rows: Sequence[CpuRow]) -> list[str]:
    """Each variant's total CPU per request against the first gateway system of its point."""
    points: dict[tuple[str, str, int], list[CpuRow]] = {}
    for r in rows:
        if not r.system.endswith("worker alone (gRPC)"):
            points.setdefault((r.engine, r.shape, r.clients), []).append(r)
    out = []
    for (engine, shape, clients), group in points.items():
        if len(group) < 2:
            continue
        base = group[0]
        paired = next((r for r in group if r.system == f"{BASELINE}, paired"), None)
        for r in group[1:]:
            if r is paired:
                continue
            # A paired row against the baseline that ran beside it, the rest against the first.
            base = paired if paired is not None and r.system.endswith(", paired") else group[0]
            out.append(
                f"| {engine} | {shape} | {clients} | {r.system} / {base.system} | "
                f"{r.total_cpu_us / max(base.total_cpu_us, 1e-9):.2f} | "
                f"{r.gateway_cpu_us / max(base.gateway_cpu_us, 1e-9):.2f} | "
                f"{r.requests_per_second / max(base.requests_per_second, 1e-9):.2f} |"
            )
    if not out:
        return []
    head = [
        "| engine | shape | clients | ratio | total CPU/req | gateway CPU/req | req/s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    return head + out


def scaling_table(rows: Sequence[CpuRow]) -> str:
    lines = [
        "| gateways | clients | req/s | gateway CPU µs/req | worker CPU µs/req | vs 1 gateway |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    first = rows[0].requests_per_second if rows else 1.0
    for r in rows:
        lines.append(
            f"| {r.system} | {r.clients} | {r.requests_per_second:.0f} | {r.gateway_cpu_us:.0f} |"
            f" {r.worker_cpu_us:.0f} | {r.requests_per_second / max(first, 1e-9):.2f} |"
        )
    return "\n".join(lines) + "\n"

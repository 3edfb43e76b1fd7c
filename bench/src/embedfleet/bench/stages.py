"""Where one request's time goes at batch 1: the per-stage breakdown of `embedfleet serve`.

Run: ``python -m embedfleet.bench.stages [--requests 40] [--lengths 128,512] [--layout 1x2 ...]``.
For each fleet layout (workers x threads, run one after the other in this one run) and each
length, one client sends single texts one at a time; the stages are the fleet's own histograms
(embedfleet_gateway_stage_seconds, _tokenize_seconds, _upstream_seconds, _request_seconds and the
worker's embedfleet_worker_stage_seconds, _queue_wait_seconds, _compute_seconds, _request_seconds),
read as the change of each histogram's sum over its count across the measured requests, so the
benchmark also checks what the metrics say. What no histogram covers is derived: the client and
HTTP server (client latency minus the gateway's request time), the gRPC hop (the gateway's call
minus the worker's handler, decode and encode) and each process's glue. The worker's compute is
split into pack / forward / pool by the engine's own stages (the same histogram, per batch: one
batch per request here).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from embedfleet.bench import corpus as corpus_mod
from embedfleet.bench import peers, st_inprocess, thread_cpu
from embedfleet.bench.targets import HttpTarget
from embedfleet.common.cpus import detect_cores, layout
from embedfleet.common.net import free_ports
from embedfleet.fleet.supervisor import Fleet, kept_openvino_args
from embedfleet.testing.workers import metric_value, scrape

#: (row label, process, what it covers), in the order a request meets them
ROWS = (
    ("client + HTTP server", "client", "client send/receive and the gateway's HTTP server"),
    ("HTTP parse", "gateway", "body read, JSON decoded, request validated"),
    ("tokenize", "gateway", "tokenizer run, incl. the hop to its threads"),
    ("gateway glue", "gateway", "admission, service, event-loop hops"),
    ("gRPC out + back", "network", "protobuf over loopback both ways, channel and server"),
    ("worker parse", "worker", "request protobuf decoded"),
    ("validate", "worker", "tokens unpacked, admitted, checked"),
    ("queue", "worker", "until the engine thread launched its batch"),
    ("compute", "worker", "the batch on the engine (pack + forward + pool, split below)"),
    ("reply", "worker", "results to the reply message"),
    ("worker serialize", "worker", "reply protobuf encoded"),
    ("worker glue", "worker", "handler, future and thread hops"),
    ("JSON out", "gateway", "answer JSON-encoded and sent"),
)
SPLIT = ("pack", "forward", "pool")


@dataclass(frozen=True)
class Shape:
    workers: int
    threads: int
    wait_policy: str = ""  # "" leaves OMP_WAIT_POLICY as the fleet decides
    runtime: str = ""  # the workers' --cpu-runtime; "" leaves their default (auto)
    engine: str = "torch"  # the workers' --engine: torch (the model) or null (the harness alone)
    #: the worker executable and its label ("": this environment's): --also-worker, e.g. the
    #: main checkout's venv, to compare a change with what it changes in the same run
    worker: str = ""
    tag: str = ""
    #: the workers' gRPC front (the fleet's default, rust; or python)
    front: str = "rust"

    @property
    def label(self) -> str:
        policy = f" {self.wait_policy.lower()}" if self.wait_policy else ""
        runtime = f" {self.runtime}" if self.runtime else ""
        engine = f" {self.engine}" if self.engine != "torch" else ""
        engine += f" {self.front} front" if self.front != "rust" else ""
        tag = f" {self.tag}" if self.tag else ""
        return f"{self.workers}x{self.threads}{policy}{runtime}{engine}{tag}"


def parse_shape(text: str) -> Shape:
    """'1x2', '2x1', '1x2:passive' or '1x2:passive+eager' (workers x threads per worker[:OMP
    wait policy: active, passive, or default for libgomp's own, the variable unset][+the
    workers' --cpu-runtime])."""
    text, _, runtime = text.partition("+")
    size, _, policy = text.partition(":")
    workers, _, threads = size.partition("x")
    return Shape(int(workers), int(threads), policy.upper(), runtime)


@dataclass
class Breakdown:
    shape: str
    length: int
    requests: int
    p50_ms: float
    mean_ms: float
    #: row label -> mean milliseconds per request
    stages: dict[str, float] = field(default_factory=dict)
    #: pack / forward / pool mean ms per batch, from the engine's own stages where it reports them
    split: dict[str, float] = field(default_factory=dict)
    p99_ms: float = float("nan")
    max_ms: float = float("nan")
    #: "process: thread group" -> CPU µs per request (thread_cpu), client excluded
    cpu_us: dict[str, float] = field(default_factory=dict)
    #: client ms of each request sent after an idle pause (Plan.idle_probes)
    after_idle_ms: list[float] = field(default_factory=list)


def histogram_sums(text: str) -> dict[tuple[str, str], tuple[float, float]]:
    """(histogram name, stage label or "") -> (sum, count), from Prometheus text."""
    out: dict[tuple[str, str], list[float]] = {}
    for family in text_string_to_metric_families(text):
        if family.type != "histogram":
            continue
        for s in family.samples:
            if s.name.endswith("_sum") or s.name.endswith("_count"):
                key = (family.name, s.labels.get("stage", s.labels.get("route", "")))
                slot = out.setdefault(key, [0.0, 0.0])
                slot[0 if s.name.endswith("_sum") else 1] += float(s.value)
    return {k: (v[0], v[1]) for k, v in out.items()}


def mean_ms(
    before: dict[tuple[str, str], tuple[float, float]],
    after: dict[tuple[str, str], tuple[float, float]],
    name: str,
    label: str = "",
) -> float:
    """Mean milliseconds per observation between two scrapes (0 when none was observed)."""
    s0, c0 = before.get((name, label), (0.0, 0.0))
    s1, c1 = after.get((name, label), (0.0, 0.0))
    return (s1 - s0) / (c1 - c0) * 1e3 if c1 > c0 else 0.0


def stage_rows(
    client_ms: float,
    gw: tuple[
        dict[tuple[str, str], tuple[float, float]], dict[tuple[str, str], tuple[float, float]]
    ],
    wk: tuple[
        dict[tuple[str, str], tuple[float, float]], dict[tuple[str, str], tuple[float, float]]
    ],
) -> dict[str, float]:
    """Pure: the ROWS' mean milliseconds from the scrapes before and after (gateway, worker)."""

    def g(name: str, label: str = "") -> float:
        return mean_ms(gw[0], gw[1], "embedfleet_gateway_" + name, label)

    def w(name: str, label: str = "") -> float:
        return mean_ms(wk[0], wk[1], "embedfleet_worker_" + name, label)

    request = g("request_seconds", "/v1/embeddings")
    parse, tokenize = g("stage_seconds", "parse"), g("tokenize_seconds")
    upstream, respond = g("upstream_seconds"), g("stage_seconds", "respond")
    handler = w("request_seconds")
    wparse, validate = w("stage_seconds", "parse"), w("stage_seconds", "validate")
    queue, compute = w("queue_wait_seconds"), w("compute_seconds")
    reply, serialize = w("stage_seconds", "reply"), w("stage_seconds", "serialize")
    return {
        "client + HTTP server": client_ms - request,
        "HTTP parse": parse,
        "tokenize": tokenize,
        "gateway glue": request - parse - tokenize - upstream - respond,
        "gRPC out + back": upstream - handler - wparse - serialize,
        "worker parse": wparse,
        "validate": validate,
        "queue": queue,
        "compute": compute,
        "reply": reply,
        "worker serialize": serialize,
        "worker glue": handler - validate - queue - compute - reply,
        "JSON out": respond,
    }


def engine_stages(
    wk: tuple[
        dict[tuple[str, str], tuple[float, float]], dict[tuple[str, str], tuple[float, float]]
    ],
) -> dict[str, float]:
    """Pure: the engine's pack / forward / pool mean ms per batch between the worker scrapes
    before and after; a stage the engine did not report is left out."""
    name = "embedfleet_worker_stage_seconds"
    return {
        stage: mean_ms(wk[0], wk[1], name, stage)
        for stage in SPLIT
        if wk[1].get((name, stage), (0.0, 0.0))[1] > wk[0].get((name, stage), (0.0, 0.0))[1]
    }


async def _requests(target: HttpTarget, texts: Sequence[str], n: int) -> list[float]:
    latencies = []
    for i in range(n):
        started = time.perf_counter()
        await target.embed([texts[i % len(texts)]])
        latencies.append(time.perf_counter() - started)
    return latencies


def fleet_for(shape: Shape, logs: Path) -> Fleet:
    """A planned (not started) fleet of `shape` on the served model, gateway on a free port."""
    (port,) = free_ports(1)
    fleet = Fleet(
        workers=shape.workers,
        model=str(peers.served_model_dir()),
        port=port,
        worker_args=(
            *("--threads", str(shape.threads), "--max-input-tokens", str(peers.MAX_TOKENS)),
            *(("--cpu-runtime", shape.runtime) if shape.runtime else ()),
            *(("--engine", shape.engine) if shape.engine != "torch" else ()),
            *kept_openvino_args(),  # as `embedfleet serve` starts its workers
        ),
        gateway_args=(
            "--max-input-tokens",
            str(peers.MAX_TOKENS),
            "--served-model-name",
            peers.SERVED_NAME,
            # as the comparison runs it (peers.embedfleet_spec): no 429 or 504 on a slow machine
            "--max-queue-seconds",
            "300",
            "--upstream-timeout-seconds",
            "600",
        ),
        log_dir=logs / shape.label.replace(" ", "-"),
        front=shape.front,
    )
    fleet.plan()
    for child in fleet.worker_children:
        if shape.worker:
            child.argv[0] = shape.worker
        if shape.wait_policy == "DEFAULT":  # libgomp's own: spin a while, then sleep
            child.env.pop("OMP_WAIT_POLICY", None)
        elif shape.wait_policy:
            child.env["OMP_WAIT_POLICY"] = shape.wait_policy
    return fleet


@dataclass(frozen=True)
class Plan:
    lengths: Sequence[int]
    #: measured requests per length, one after another
    requests: int
    #: first, from the fleet's start, this many single requests at the first length, each after
    #: `idle_seconds` without one: what a request arriving at a worker idle since it started
    #: meets (its background capacity measurement starts after --capacity-idle-seconds, 1 s);
    #: then the fleet settles (its capacity measured, so no probe runs) before the lengths
    idle_probes: int = 3
    idle_seconds: float = 1.5
    settle_seconds: float = 60.0


def measure_fleet(
    shape: Shape, plan: Plan, corpus: corpus_mod.Corpus, logs: Path
) -> list[Breakdown]:
    """One fleet of `shape`; each length's breakdown over `plan.requests` single texts."""
    with fleet_for(shape, logs) as fleet:
        ports = [c.metrics_port for c in fleet.worker_children]
        pids = {
            c.name: c.process.pid
            for c in fleet.children
            if c.process is not None and c.process.poll() is None
        }
        return asyncio.run(_measure_lengths(shape, fleet.port, ports, pids, plan, corpus))


async def _measure_lengths(
    shape: Shape,
    port: int,
    worker_ports: Sequence[int],
    pids: dict[str, int],
    plan: Plan,
    corpus: corpus_mod.Corpus,
) -> list[Breakdown]:
    target = HttpTarget(
        "embedfleet", "127.0.0.1", port, peers.SERVED_NAME, "/v1/embeddings", "embed"
    )
    out: list[Breakdown] = []
    try:
        after_idle = []
        for i in range(plan.idle_probes):
            await asyncio.sleep(plan.idle_seconds)
            texts = corpus.of_length(plan.lengths[0])
            (ms,) = await _requests(target, texts[i:], 1)
            after_idle.append(ms * 1e3)
        settled = await asyncio.to_thread(settle, worker_ports, plan.settle_seconds)
        print(
            f"  {shape.label}: capacity measured {settled:.1f} s after the idle probes", flush=True
        )
        requests = plan.requests
        for length in plan.lengths:
            texts = corpus.of_length(length)
            await _requests(target, texts[-5:], 5)  # warm: connections, allocator
            gw0, wk0 = await asyncio.to_thread(scrape_all, port, worker_ports)
            cpu0 = threads_of(pids)
            latencies = await _requests(target, texts, requests)
            cpu1 = threads_of(pids)
            gw1, wk1 = await asyncio.to_thread(scrape_all, port, worker_ports)
            client = statistics.fmean(latencies) * 1e3
            row = Breakdown(
                shape.label,
                length,
                requests,
                statistics.median(latencies) * 1e3,
                client,
                stage_rows(client, (gw0, gw1), (wk0, wk1)),
                engine_stages((wk0, wk1)),
                float(np.percentile(latencies, 99)) * 1e3,
                max(latencies) * 1e3,
                thread_cpu.per_request_us(cpu0, cpu1, requests),
            )
            if not out:
                row.after_idle_ms = after_idle
            out.append(row)
            print(
                f"  {shape.label:12s} {length:4d} tokens  p50 {row.p50_ms:7.2f} ms  "
                f"p99 {row.p99_ms:7.2f} ms  max {row.max_ms:7.2f} ms  after idle "
                + " ".join(f"{ms:.1f}" for ms in row.after_idle_ms),
                flush=True,
            )
    finally:
        await target.close()
    return out


def settle(worker_ports: Sequence[int], timeout: float) -> float:
    """Seconds until every worker reports a measured capacity (its background probe done, so
    none runs during the measured requests); gives up after `timeout`."""
    started = time.monotonic()
    name = "embedfleet_worker_capacity_tokens_per_second"
    while time.monotonic() - started < timeout:
        if all(metric_value(scrape(p), name) > 0 for p in worker_ports):
            break
        time.sleep(0.25)
    return time.monotonic() - started


def threads_of(pids: dict[str, int]) -> dict[str, int]:
    """CPU ns so far of each "process: thread group" of the fleet's children."""
    return {
        f"{name}: {group}": ns
        for name, pid in pids.items()
        for group, ns in thread_cpu.thread_ns(pid).items()
    }


def scrape_all(
    gateway_port: int, worker_ports: Sequence[int]
) -> tuple[dict[tuple[str, str], tuple[float, float]], dict[tuple[str, str], tuple[float, float]]]:
    """The gateway's histograms and the workers' summed together (one at batch 1 serves each)."""
    gateway = histogram_sums(scrape(gateway_port))
    workers: dict[tuple[str, str], tuple[float, float]] = {}
    for p in worker_ports:
        for key, (s, c) in histogram_sums(scrape(p)).items():
            s0, c0 = workers.get(key, (0.0, 0.0))
            workers[key] = (s0 + s, c0 + c)
    return gateway, workers


def table(rows: Sequence[Breakdown]) -> str:
    """Pure: one column per (layout, length), one row per stage, in mean ms per request."""
    head = "| stage | where | " + " | ".join(f"{r.shape} @{r.length}" for r in rows) + " |"
    lines = [head, "|" + " --- |" * (len(rows) + 2)]
    for label, where, _ in ROWS:
        lines.append(
            f"| {label} | {where} | "
            + " | ".join(f"{r.stages.get(label, 0.0):.2f}" for r in rows)
            + " |"
        )
        if label == "compute":
            for name in SPLIT:
                cells = [f"{r.split[name]:.2f}" if name in r.split else "–" for r in rows]
                lines.append(f"| ↳ {name} (engine) | worker | " + " | ".join(cells) + " |")
    lines.append(
        "| **sum = client mean** | | "
        + " | ".join(f"**{sum(r.stages.values()):.2f}**" for r in rows)
        + " |"
    )
    lines.append("| client p50 | | " + " | ".join(f"{r.p50_ms:.2f}" for r in rows) + " |")
    lines.append("| client p99 | | " + " | ".join(f"{r.p99_ms:.2f}" for r in rows) + " |")
    return "\n".join(lines)


def cpu_table(rows: Sequence[Breakdown]) -> str:
    """Pure: CPU µs per request of each process's thread groups (one column per run), then
    each process's total and the servers' (gateway + workers) total."""
    groups = sorted({g for r in rows for g in r.cpu_us}, key=lambda g: (g.split(":")[0], g))
    head = "| process: threads | " + " | ".join(f"{r.shape} @{r.length}" for r in rows) + " |"
    lines = [head, "|" + " --- |" * (len(rows) + 1)]
    for group in groups:
        cells = [f"{r.cpu_us[group]:.0f}" if group in r.cpu_us else "–" for r in rows]
        lines.append(f"| {group} | " + " | ".join(cells) + " |")
    processes = sorted({g.split(":")[0] for g in groups})
    for process in processes:
        totals = [process_cpu_us(r, process) for r in rows]
        lines.append(f"| **{process} total** | " + " | ".join(f"{t:.0f}" for t in totals) + " |")
    servers = [sum(r.cpu_us.values()) for r in rows]
    lines.append("| **servers total** | " + " | ".join(f"**{t:.0f}**" for t in servers) + " |")
    return "\n".join(lines)


def process_cpu_us(row: Breakdown, process: str) -> float:
    """Pure: a process's CPU µs per request, all its thread groups summed."""
    return sum(us for g, us in row.cpu_us.items() if g.split(":")[0] == process)


def summary_table(rows: Sequence[Breakdown], baselines: Sequence[st_inprocess.Baseline]) -> str:
    """Pure: per length, each run's client p50 / p99 / max and the in-process baseline's."""
    lines = [
        "| tokens | system | p50 ms | p99 ms | max ms | p99 / p50 | CPU µs per request "
        "| after an idle pause from start, ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for length in sorted({r.length for r in rows} | {b.length for b in baselines}):
        for r in (r for r in rows if r.length == length):
            cpu = sum(r.cpu_us.values())
            lines.append(
                f"| {length} | embedfleet {r.shape} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | "
                f"{r.max_ms:.2f} | {r.p99_ms / r.p50_ms:.1f} | {cpu:.0f} (servers) | "
                + ", ".join(f"{ms:.1f}" for ms in r.after_idle_ms)
                + " |"
            )
        for b in (b for b in baselines if b.length == length):
            lines.append(
                f"| {length} | sentence-transformers {b.backend}, in-process | {b.p50_ms:.2f} | "
                f"{b.p99_ms:.2f} | {b.max_ms:.2f} | {b.p99_ms / b.p50_ms:.1f} | "
                f"{b.cpu_us:.0f} (its process) | |"
            )
    return "\n".join(lines)


def pad_us(length: int, reps: int = 200) -> float:
    """Best µs of building one lone sequence's padded layout (the compiled runtimes' attention
    plan: gather, inverse, mask), which the engine does inside its forward: timed here."""
    from embedfleet.worker.engine.padded import padded_layout, plan_tensors

    lengths = np.array([length], np.int64)
    best = float("inf")
    for _ in range(reps):
        started = time.perf_counter()
        plan_tensors(padded_layout(lengths))
        best = min(best, time.perf_counter() - started)
    return best * 1e6


def baselines(lengths: Sequence[int], requests: int, threads: int) -> list[st_inprocess.Baseline]:
    """sentence-transformers in a process of its own, as many threads as a worker has."""
    out = st_inprocess.run(lengths, requests, threads)
    for b in out:
        print(f"  st {b.backend:8s} {b.length:4d} tokens  p50 {b.p50_ms:7.2f} ms", flush=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedfleet.bench.stages", description=__doc__)
    parser.add_argument("--requests", type=int, default=40, help="measured requests per point")
    parser.add_argument("--lengths", default="20,128,512", help="tokens per text (20,128,512)")
    parser.add_argument(
        "--engines",
        default="torch,null",
        help="the workers' --engine, each run on every layout: torch (the model) and null "
        "(the harness alone); default %(default)s",
    )
    parser.add_argument(
        "--also-worker",
        action="append",
        default=[],
        metavar="TAG=PATH",
        help="also run every layout and engine with this embedfleet-worker executable (e.g. "
        "before=/path/to/main/.venv/bin/embedfleet-worker), labelled TAG; repeatable",
    )
    parser.add_argument(
        "--fronts",
        default="rust",
        help="the workers' gRPC fronts, each run on every layout and engine: rust (the fleet's "
        "default) and python; default %(default)s",
    )
    parser.add_argument("--idle-probes", type=int, default=3, help="requests after idle pauses")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="repeat every fleet this many times, the workers' order reversed each round (a "
        "shared machine's load drifts: what runs first is not favoured), labelled #1, #2, ...",
    )
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip sentence-transformers in-process (run after the fleets, none running)",
    )
    parser.add_argument(
        "--layout",
        action="append",
        default=[],
        help="a fleet as WORKERSxTHREADS[:OMP_WAIT_POLICY][+CPU_RUNTIME], repeatable (default: "
        "the fleet's own decision for this machine)",
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",") if x]
    corpus = corpus_mod.load()
    logs = corpus_mod.cache_dir() / "bench-runs" / time.strftime("%Y%m%dT%H%M%S") / "stages"
    if args.layout:
        shapes = [parse_shape(s) for s in args.layout]
    else:
        decided = layout(detect_cores())
        shapes = [Shape(decided.workers, decided.threads)]
    engines = [e for e in args.engines.split(",") if e]
    workers = [("", ""), *(tuple(w.split("=", 1)) for w in args.also_worker)]
    plan = Plan(lengths, args.requests, args.idle_probes)
    rows: list[Breakdown] = []
    fronts = [f for f in args.fronts.split(",") if f]
    for shape, engine, front in itertools.product(shapes, engines, fronts):
        for r in range(args.rounds):
            for tag, path in workers if r % 2 == 0 else workers[::-1]:
                label = f"{tag} #{r + 1}".strip() if args.rounds > 1 else tag
                run = replace(shape, engine=engine, tag=label, worker=path, front=front)
                rows += measure_fleet(run, plan, corpus, logs)
    threads = shapes[0].threads
    st = [] if args.no_baseline else baselines(lengths, args.requests, threads)
    print(f"\nstage wall time, mean ms per request ({time.strftime('%Y-%m-%d %H:%M UTC')})\n")
    print(table(rows))
    pads = ", ".join(f"{n} tokens {pad_us(n):.0f} µs" for n in lengths)
    print(f"\npad (padded layout of one sequence, inside forward; timed alone): {pads}")
    print("\nCPU per request, µs, by process and thread group (/proc schedstat)\n")
    print(cpu_table(rows))
    print("\nclient latency, batch 1, one client\n")
    print(summary_table(rows, st))
    if args.json:
        doc = {"rows": [asdict(r) for r in rows], "baselines": [asdict(b) for b in st]}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

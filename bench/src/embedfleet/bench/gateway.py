"""Gateway benchmarks: harness overhead with the null engine, and the concurrency suite against the
worker alone.

Run: ``python -m embedfleet.bench.gateway [--suites overhead,concurrency,cpu,scaling]
[--engine null] [--profile]``; the `cpu` and `scaling` suites (server CPU per request, gateway and
worker apart, and one against two gateway processes) are gateway_cpu.py's.
Every system runs in this process tree on the same inputs; ratios are printed side by side. The
client is a minimal keep-alive HTTP/1.1 client on asyncio streams, so its own cost stays small next
to the gateway's (httpx costs a few hundred microseconds per request by itself).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from embedfleet.bench import gateway_cpu as cpu
from embedfleet.bench.gateway_procs import gateway_call, worker_call
from embedfleet.bench.http_load import Call, run_point
from embedfleet.common.codec import pack_tokens
from embedfleet.common.modeldir import default_model_path, load_model_dir
from embedfleet.common.net import free_ports
from embedfleet.fleet.supervisor import Fleet
from embedfleet.testing.procfs import tree_cpu_seconds

TEXT = "The quick brown fox jumps over the lazy dog near the river bank."
CONCURRENCY = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class Row:
    suite: str
    system: str
    clients: int
    p50_ms: float
    p99_ms: float
    requests_per_second: float
    errors: int
    #: CPU time the measured server process tree spent per request: unlike latency, this barely
    #: moves when other jobs share the machine
    server_cpu_us: float


async def measure_row(
    suite: str, system: str, call: Call, clients: int, seconds: float, pid: int
) -> Row:
    warm = min(1.0, seconds / 3)
    await run_point(call, clients, warm, 0, 0, 1)
    before = tree_cpu_seconds(pid)
    m = await run_point(call, clients, seconds, 0, 0, 1, min_requests=20)
    cpu = (tree_cpu_seconds(pid) - before) / max(1, m.requests) * 1e6
    return Row(suite, system, m.clients, m.p50_ms, m.p99_ms, m.requests_per_second, m.errors, cpu)


async def run(args: argparse.Namespace) -> list[Row]:
    suites = set(args.suites.split(","))
    model = load_model_dir(default_model_path())
    ids = model.tokenizer().encode(TEXT).ids
    batch = pack_tokens([ids])
    body = orjson.dumps({"input": TEXT})
    worker_args = ["--engine", args.engine, "--warmup-seconds", "0.5"]
    (gw_port,) = free_ports(1)
    rows: list[Row] = []
    logs = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    with Fleet(workers=args.workers, port=gw_port, worker_args=worker_args, log_dir=logs) as fleet:
        worker, gateway = fleet.worker_children[0], fleet.children[-1]
        assert worker.process is not None
        assert gateway.process is not None
        levels = (1,) if "concurrency" not in suites else CONCURRENCY
        for clients in levels if suites & {"overhead", "concurrency"} else ():
            wcall, channel = worker_call(worker.address, batch)
            name = "worker alone (gRPC)"
            pid = worker.process.pid
            rows.append(await measure_row("concurrency", name, wcall, clients, args.seconds, pid))
            await channel.close(None)
            gcall, conns = gateway_call(gw_port, clients, body)
            name = "gateway+worker (HTTP)"
            pid = gateway.process.pid
            rows.append(await measure_row("concurrency", name, gcall, clients, args.seconds, pid))
            for c in conns:
                c.close()
    return rows


def table(rows: Sequence[Row]) -> str:
    lines = [
        "| suite | system | clients | p50 ms | p99 ms | req/s | server CPU µs/req | errors |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r.suite} | {r.system} | {r.clients} | {r.p50_ms:.3f} | {r.p99_ms:.3f} | "
            f"{r.requests_per_second:.0f} | {r.server_cpu_us:.0f} | {r.errors} |"
        )
    # The overhead the gateway adds: same clients, same input, gateway path minus worker alone.
    by = {(r.system, r.clients): r for r in rows if r.suite == "concurrency"}
    extra = []
    for (system, clients), r in sorted(by.items()):
        if system.startswith("gateway") and ("worker alone (gRPC)", clients) in by:
            w = by[("worker alone (gRPC)", clients)]
            extra.append(
                f"| {clients} | {r.p50_ms - w.p50_ms:+.3f} | "
                f"{r.requests_per_second / max(w.requests_per_second, 1e-9):.2f} |"
            )
    if extra:
        lines += [
            "",
            "| clients | gateway p50 overhead ms | gateway/worker req/s |",
            "| --- | --- | --- |",
            *extra,
        ]
    return "\n".join(lines) + "\n"


def run_cpu_suites(args: argparse.Namespace) -> str:
    """The CPU suites (gateway_cpu.py) as markdown: tables and, with --profile, the stages."""
    suites = set(args.suites.split(","))
    logs = Path(tempfile.mkdtemp(prefix="bench-gateway-cpu-"))
    out = []
    if "cpu" in suites:
        shapes = args.shapes.split(",")
        rows = asyncio.run(
            cpu.run_cpu(args.engine, args.seconds, args.baseline_binary, shapes, logs, args.repeat)
        )
        out.append(cpu.cpu_table(rows))
        if args.json:
            Path(args.json).with_suffix(".cpu.json").write_text(
                json.dumps([asdict(r) for r in rows], indent=2) + "\n"
            )
    if "scaling" in suites:
        out.append(cpu.scaling_table(asyncio.run(cpu.run_scaling(args.seconds, logs))))
    if args.profile:
        for shape, clients in cpu.PROFILED:
            profile = cpu.run_profile(args.engine, args.seconds, logs, shape, clients)
            out.append(asyncio.run(profile))
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedfleet.bench.gateway")
    parser.add_argument("--suites", default="overhead,concurrency,cpu,scaling")
    parser.add_argument("--shapes", default="1x20,16x20,100x512", help="cpu suite's shapes")
    parser.add_argument(
        "--baseline-binary",
        default="",
        help="cpu suite: also run this gateway binary (another tree's build) beside this tree's",
    )
    parser.add_argument(
        "--profile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="profile the worker at 1x20 x16 clients and 100x512 x1 (cProfile stages)",
    )
    parser.add_argument("--engine", default="null", help="worker engine: null (harness) or torch")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured time per point")
    parser.add_argument("--json", default="", help="also write the rows here")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="cpu suite: rounds of every system per point; each system's median round is kept",
    )
    args = parser.parse_args(argv)
    wanted = set(args.suites.split(","))
    rows = asyncio.run(run(args)) if wanted & {"overhead", "concurrency"} else []
    if rows:
        print(table(rows))
    print(run_cpu_suites(args))
    if args.json and rows:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

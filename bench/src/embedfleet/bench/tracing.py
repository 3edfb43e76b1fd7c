"""What OpenTelemetry tracing costs a batch-1 request: the same fleet shape with tracing off and
with tracing on (sampling 1.0, every request traced and exported), side by side in one run.

Run: ``python -m embedfleet.bench tracing [--engine null] [--rounds 3] [--seconds 3]``.
Two fleets (one gateway, one worker each) run at once on the same input; the rounds alternate off
and on so that drift in the machine's load hits both alike. The traced fleet exports to a
collector in this process that counts the bytes without decoding them. The null engine (the
default) shows the harness cost, where tracing's share is largest; `--engine torch` shows it
against real compute.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import timeit
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import orjson

from embedfleet.bench.gateway import TEXT, Row, measure_row
from embedfleet.bench.gateway_procs import gateway_call
from embedfleet.common.net import free_ports
from embedfleet.common.tracing import OFF
from embedfleet.fleet.supervisor import Fleet
from embedfleet.testing.otlp import Collector, running_collector

SYSTEMS = ("tracing off", "tracing on (sample 1.0)")


def _fleet(engine: str, logs: Path, name: str, tracing: Sequence[str]) -> Fleet:
    (port,) = free_ports(1)
    return Fleet(
        workers=1,
        port=port,
        worker_args=["--engine", engine, "--warmup-seconds", "0.5", *tracing],
        gateway_args=[*tracing],
        log_dir=logs / name,
    )


async def _measure(fleets: dict[str, Fleet], rounds: int, seconds: float) -> list[Row]:
    body = orjson.dumps({"input": TEXT})
    rows: list[Row] = []
    for _ in range(rounds):
        for system, fleet in fleets.items():
            gateway = fleet.children[-1]
            assert gateway.process is not None
            call, conns = gateway_call(fleet.port, 1, body)
            row = await measure_row("tracing", system, call, 1, seconds, gateway.process.pid)
            rows.append(row)
            for c in conns:
                c.close()
    return rows


def off_path_ns(number: int = 200_000) -> tuple[float, float]:
    """What tracing-off adds to one call in the worker, in ns: its server span entered and left
    with its attribute calls, the shared null span; and, for scale, one empty Python function
    call."""
    metadata = [("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")]

    def request() -> None:
        with OFF.server_span("embedfleet.v1.Worker/Embed", metadata) as span:
            span.set_attribute("rpc.system", "grpc")
            span.set_attribute("rpc.grpc.status_code", 0)

    def empty() -> None:
        pass

    spans = min(timeit.repeat(request, number=number, repeat=5)) / number * 1e9
    call = min(timeit.repeat(empty, number=number, repeat=5)) / number * 1e9
    return spans, call


def combine(rows: Sequence[Row]) -> list[Row]:
    """One row per system: the median over its rounds of each figure."""
    out = []
    for system in dict.fromkeys(r.system for r in rows):
        mine = [r for r in rows if r.system == system]

        def med(values: list[float]) -> float:
            return float(np.median(values))

        out.append(
            replace(
                mine[0],
                p50_ms=med([r.p50_ms for r in mine]),
                p99_ms=med([r.p99_ms for r in mine]),
                requests_per_second=med([r.requests_per_second for r in mine]),
                server_cpu_us=med([r.server_cpu_us for r in mine]),
                errors=sum(r.errors for r in mine),
            )
        )
    return out


def table(rows: Sequence[Row], sink: Collector) -> str:
    lines = [
        "| system | p50 ms | p99 ms | req/s | gateway CPU µs/req | errors |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r.system} | {r.p50_ms:.3f} | {r.p99_ms:.3f} | {r.requests_per_second:.0f} | "
            f"{r.server_cpu_us:.0f} | {r.errors} |"
        )
    if len(rows) == 2:
        off, on = rows
        lines += [
            "",
            f"on/off: p50 {on.p50_ms / off.p50_ms:.3f}x ({on.p50_ms - off.p50_ms:+.3f} ms), "
            f"p99 {on.p99_ms / off.p99_ms:.3f}x ({on.p99_ms - off.p99_ms:+.3f} ms), "
            f"gateway CPU {on.server_cpu_us / max(off.server_cpu_us, 1e-9):.3f}x; "
            f"collector received {sink.exports} exports, {sink.bytes} bytes",
        ]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> tuple[list[Row], list[Row], Collector]:
    logs = Path(tempfile.mkdtemp(prefix="bench-tracing-"))
    with running_collector(keep=False) as (sink, endpoint):
        off = _fleet(args.engine, logs, "off", ())
        on = _fleet(args.engine, logs, "on", ("--tracing-endpoint", endpoint))
        # The traced fleet samples everything (the default ratio), exported as it runs.
        with off, on:
            fleets = dict(zip(SYSTEMS, (off, on), strict=True))
            rows = asyncio.run(_measure(fleets, args.rounds, args.seconds))
    return rows, combine(rows), sink


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedfleet.bench tracing")
    parser.add_argument("--engine", default="null", help="worker engine: null or torch")
    parser.add_argument("--rounds", type=int, default=3, help="alternating off/on rounds")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured time per round")
    parser.add_argument("--json", default="", help="also write every round's rows here")
    args = parser.parse_args(argv)
    os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)  # the untraced fleet must stay untraced
    os.environ.pop("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", None)
    rounds, combined, sink = run(args)
    print(table(combined, sink))
    spans, call = off_path_ns()
    print(
        f"tracing off, per worker call: {spans:.0f} ns for its null span ({call:.0f} ns "
        "for one empty function call)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rounds], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The worker's two fronts side by side: the Python front and the Rust one (`--front rust`).

Run: ``python -m embedfleet.bench.front [--seconds 1.0] [--rounds 2] [--engines null,torch]``.

Two fleets (one gateway, one worker of the machine's threads) run at once, alike but for the
worker's --front, and are measured in turn, round after round, so that what else the machine does
falls on both: 1-text ~20-token queries through the gateway from 1 client and (null engine) from
16, and the bundled MiniLM in float32 at batch 1 from 1 client. Each point reports latency
(p50, p99) and server CPU per answered request, the gateway's and the worker's (their processes'
utime + stime from /proc), as the gateway benchmark's cpu suite does (gateway_cpu.py), whose
request loop and CPU reading it reuses; the row of each system is its round of median CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import Sequence
from pathlib import Path

from embedfleet.bench.gateway_cpu import (
    LIMIT,
    CpuRow,
    cpu_table,
    http_call,
    inputs,
    measure,
    medians,
)
from embedfleet.bench.http_load import Measurement
from embedfleet.common.net import free_ports
from embedfleet.fleet.supervisor import Fleet
from embedfleet.testing.workers import front_library

FRONTS = ("python", "rust")
#: clients per point, by engine
CLIENTS = {"null": (1, 16), "torch": (1,)}


def fleet_of(engine: str, front: str, logs: Path) -> Fleet:
    args = [*LIMIT, "--warmup-seconds", "0.5", "--capacity-measurement", "startup"]
    args += ["--engine", "null"] if engine == "null" else ["--dtype", "float32"]
    (port,) = free_ports(1)
    logged = logs / f"{engine}-{front}"
    return Fleet(workers=1, port=port, worker_args=args, log_dir=logged, front=front)


def pids_of(fleet: Fleet) -> tuple[int, int]:
    """(gateway pid, worker pid)."""
    procs = {c.name: c.process for c in fleet.children}
    gateway, worker = procs["gateway"], procs["worker-0"]
    assert gateway is not None  # the fleet started them
    assert worker is not None
    return gateway.pid, worker.pid


def row_of(system: str, engine: str, clients: int, m: Measurement, g: float, w: float) -> CpuRow:
    return CpuRow(
        system, engine, "1x20", clients, m.requests, m.requests_per_second,
        m.p50_ms, m.p99_ms, g, w, m.errors,
    )  # fmt: skip


async def measure_engine(engine: str, seconds: float, rounds: int, logs: Path) -> list[CpuRow]:
    data = inputs("1x20")
    fleets = {front: fleet_of(engine, front, logs) for front in FRONTS}
    out: list[CpuRow] = []
    try:
        for fleet in fleets.values():
            fleet.start()
        for clients in CLIENTS[engine]:
            rows = []
            for _ in range(rounds):
                for front, fleet in fleets.items():
                    gateway, worker = pids_of(fleet)
                    call, conns = http_call([fleet.port], clients, data.bodies)
                    m, g, w = await measure(call, clients, seconds, [gateway], worker)
                    for conn in conns:
                        conn.close()
                    rows.append(row_of(f"{front} front", engine, clients, m, g, w))
                    print(
                        f"  {front:6s} {engine:5s} x{clients:<2d} p50 {m.p50_ms:6.3f} ms "
                        f"p99 {m.p99_ms:6.3f} ms  gateway {g:5.0f} µs  worker {w:5.0f} µs",
                        flush=True,
                    )
            out += medians(rows)
    finally:
        for fleet in fleets.values():
            fleet.stop()
    return out


def table(rows: Sequence[CpuRow]) -> str:
    """The gateway benchmark's CPU table, with each point's p99."""
    lines = cpu_table(rows).splitlines()
    p99 = [f"- {r.engine} x{r.clients} {r.system}: p99 {r.p99_ms:.2f} ms" for r in rows]
    return "\n".join([*lines, "", *p99]) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedfleet.bench.front", description=__doc__)
    parser.add_argument("--seconds", type=float, default=1.0, help="per point and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--engines", default="null,torch", help="null, torch, or both")
    args = parser.parse_args(argv)
    front_library()  # built (or reused) before the fleets, which find it by its key
    rows: list[CpuRow] = []
    with tempfile.TemporaryDirectory(prefix="bench-front-") as logs:
        for engine in args.engines.split(","):
            rows += asyncio.run(measure_engine(engine, args.seconds, args.rounds, Path(logs)))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A lone client that never pauses, from a fleet's start: what it meets while the worker measures
its capacity through the traffic (no idle second came within 10 s, so the run stops for nothing).

One client sends 20-token texts one after another until every worker reports a capacity, then 100
more; the fleet is `bench.stages`' (1 worker x 2 threads), once per worker named, alternating.

    python -m embedfleet.bench.busy_start [--also-worker before=PATH] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from embedfleet.bench import corpus, peers, stages
from embedfleet.bench.targets import HttpTarget
from embedfleet.testing.workers import metric_value, scrape

CAPACITY = "embedfleet_worker_capacity_tokens_per_second"


async def _client(port: int, worker_port: int, texts: Sequence[str]) -> tuple[list[float], float]:
    target = HttpTarget(
        "embedfleet", "127.0.0.1", port, peers.SERVED_NAME, "/v1/embeddings", "embed"
    )
    latencies: list[float] = []
    capacity, after = 0.0, 100
    try:
        while after > 0:
            started = time.perf_counter()
            await target.embed([texts[len(latencies) % len(texts)]])
            latencies.append((time.perf_counter() - started) * 1e3)
            if capacity:
                after -= 1
            elif len(latencies) % 20 == 0:
                capacity = metric_value(scrape(worker_port), CAPACITY)
    finally:
        await target.close()
    return latencies, capacity


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedfleet.bench.busy_start")
    parser.add_argument("--also-worker", action="append", default=[], metavar="TAG=PATH")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--length", type=int, default=20)
    args = parser.parse_args(argv)
    texts = corpus.load().of_length(args.length)
    workers = [("", ""), *(tuple(w.split("=", 1)) for w in args.also_worker)]
    logs = corpus.cache_dir() / "bench-runs" / time.strftime("%Y%m%dT%H%M%S") / "busy_start"
    for r in range(args.rounds):
        for tag, path in workers if r % 2 == 0 else workers[::-1]:
            shape = replace(stages.Shape(1, 2), tag=tag, worker=path)
            with stages.fleet_for(shape, Path(logs)) as fleet:
                port = fleet.worker_children[0].metrics_port
                ms, capacity = asyncio.run(_client(fleet.port, port, texts))
            print(
                f"{shape.label} #{r + 1}: {len(ms)} requests, p50 {np.median(ms):.2f} p99 "
                f"{np.percentile(ms, 99):.2f} max {max(ms):.1f} ms; capacity {capacity:.0f} "
                "tokens/s",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

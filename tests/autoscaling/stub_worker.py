"""STUB WORKER (not the real server): a real process serving the worker's real metric families.

It builds `embedfleet.worker.metrics.WorkerMetrics` (the registry the worker serves, so names and
types cannot drift) and serves it with prometheus-client's HTTP server; instead of computing
embeddings it advances the counters at the rates a JSON control file asks for:

    {"tokens_per_second": 12000, "latency_seconds": 0.2, "capacity": 10000, "queued_tokens": 0}

Used where a real worker would need a model and a CPU budget the tests do not have: the
autoscaler's scrape tests and its integration test with KWOK's fake pods.

    python tests/autoscaling/stub_worker.py --port 9101 --control /tmp/load.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from embedfleet.worker.metrics import WorkerMetrics

TICK = 0.1
TOKENS_PER_REQUEST = 100


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--control", type=Path, required=True)
    args = parser.parse_args()
    metrics = WorkerMetrics()
    metrics.serve("127.0.0.1", args.port)
    control: dict[str, float] = {}
    seen = 0.0
    owed = 0.0  # fractional requests carried between ticks
    last = time.monotonic()
    while True:
        try:
            mtime = args.control.stat().st_mtime
            if mtime != seen:
                control, seen = json.loads(args.control.read_text()), mtime
        except (OSError, ValueError):
            pass  # keep the last control while the file is being replaced
        # By the time that really passed: a busy machine stretches the sleeps.
        now = time.monotonic()
        tokens = float(control.get("tokens_per_second", 0.0)) * (now - last)
        last = now
        metrics.tokens.inc(tokens)
        owed += tokens / TOKENS_PER_REQUEST
        for _ in range(int(owed)):
            metrics.request.observe(float(control.get("latency_seconds", 0.01)))
        owed -= int(owed)
        metrics.capacity.set(float(control.get("capacity", 0.0)))
        metrics.queued_tokens.set(float(control.get("queued_tokens", 0.0)))
        metrics.ready.set(1)
        time.sleep(TICK)


if __name__ == "__main__":
    main()

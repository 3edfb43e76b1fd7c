"""Steady, bounded load on the gateway with the unmodified `openai` client, as a separate process.

Run inside the node's network namespace (where Service ClusterIPs route) by the end-to-end tests:

    python e2eload.py load --url http://10.96.0.20/v1 --out report.json --seconds 90
    python e2eload.py embed --url http://10.96.0.20/v1 < texts.json > vectors.json

`load` runs STREAMS closed loops, each at most RATE requests a second, until SIGTERM or SIGINT,
--seconds or --max-requests; it prints RUNNING once the first request is answered (its imports
take seconds on a busy machine: a test times its events from then), and at the end writes one
record per request (monotonic start and end, which every process on the machine shares, and
the error if any) to --out. The client makes no
retries of its own (max_retries=0): every failure the fleet lets through is counted.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import openai

MODEL = "all-MiniLM-L6-v2"
DIMENSIONS = 384
TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Kubernetes restarts a container whose liveness probe fails.",
    "A rolling update replaces pods one at a time.",
    "Embeddings map text to vectors whose cosine measures similarity.",
    "The gateway splits large batches into chunks for the workers.",
    "Readiness gates traffic; liveness restarts; startup waits for slow starts.",
)


#: the line `load` prints once its first request is answered
RUNNING = "load running"


@dataclass(frozen=True)
class Record:
    stream: int
    start: float
    end: float
    error: str = ""


def _client(url: str, timeout: float) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=timeout)


def _one(client: openai.OpenAI, texts: Sequence[str]) -> str:
    """'' when the answer is whole and right-sized, else what went wrong."""
    try:
        reply = client.embeddings.create(model=MODEL, input=list(texts))
    except openai.APIError as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    if len(reply.data) != len(texts):
        return f"{len(reply.data)} embeddings for {len(texts)} inputs"
    if any(len(item.embedding) != DIMENSIONS for item in reply.data):
        return "wrong dimensions"
    return ""


def run_load(
    url: str, streams: int, rate: float, seconds: float, max_requests: int, stop: threading.Event
) -> list[Record]:
    records: list[Record] = []
    lock = threading.Lock()
    running = threading.Event()
    deadline = time.monotonic() + seconds

    def stream(index: int) -> None:
        client = _client(url, timeout=30.0)
        n = 0
        while not stop.is_set() and time.monotonic() < deadline:
            with lock:
                if len(records) >= max_requests:
                    return
            start = time.monotonic()
            texts = [TEXTS[(n + i) % len(TEXTS)] for i in range(1 + n % 4)]
            error = _one(client, texts)
            end = time.monotonic()
            with lock:
                records.append(Record(index, start, end, error))
            if not running.is_set():
                running.set()
                print(RUNNING, flush=True)
            n += 1
            stop.wait(max(0.0, 1.0 / rate - (end - start)))
        client.close()

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(records, key=lambda r: r.start)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="e2eload")
    sub = parser.add_subparsers(dest="command", required=True)
    load = sub.add_parser("load")
    load.add_argument("--url", required=True)
    load.add_argument("--out", required=True, type=Path)
    load.add_argument("--streams", type=int, default=3)
    load.add_argument("--rate", type=float, default=8.0, help="requests per second per stream")
    load.add_argument("--seconds", type=float, default=120.0)
    load.add_argument("--max-requests", type=int, default=5000)
    embed = sub.add_parser("embed")
    embed.add_argument("--url", required=True)
    args = parser.parse_args(argv)

    if args.command == "embed":
        texts = json.load(sys.stdin)
        reply = _client(args.url, timeout=60.0).embeddings.create(model=MODEL, input=texts)
        json.dump([item.embedding for item in reply.data], sys.stdout)
        return 0

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    records = run_load(args.url, args.streams, args.rate, args.seconds, args.max_requests, stop)
    report: dict[str, Any] = {"records": [asdict(r) for r in records]}
    partial = args.out.with_suffix(".partial")
    partial.write_text(json.dumps(report))
    partial.rename(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

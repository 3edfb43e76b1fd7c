"""The lone request's baseline: sentence-transformers called in this process, one text per call.

What a user gets without a server: `SentenceTransformer.encode([text])`, tokenization included, no
HTTP and no gRPC. The OpenVINO backend (`backend="openvino"`) needs optimum-intel, which the
project's venv does not carry (the `st-openvino` peer installs it into a venv of its own, which
needs PyPI); where it is missing the PyTorch backend alone runs, and the result says so.
Measured while no fleet runs, so the two never share the cores. `python -m
embedfleet.bench.st_inprocess --lengths 20,128 --requests 200` prints one JSON line per backend
and length; bench.stages runs it as a child with the workers' OMP_WAIT_POLICY (`run`), since on
a shared machine torch's spinning threads made a 20-token call 8x slower (269 ms against 35 ms).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Baseline:
    backend: str
    length: int
    requests: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    #: this process's CPU per call (every thread: torch's intra-op pool included)
    cpu_us: float


def backends() -> list[str]:
    """The backends this environment can run: torch always, openvino with optimum-intel."""
    try:
        intel = importlib.util.find_spec("optimum.intel") is not None
    except ModuleNotFoundError:  # no optimum at all
        intel = False
    return ["torch", "openvino"] if intel else ["torch"]


def load(model_dir: str, backend: str) -> Any:
    from sentence_transformers import SentenceTransformer

    if backend == "openvino":
        return SentenceTransformer(model_dir, device="cpu", backend="openvino")
    return SentenceTransformer(model_dir, device="cpu")


def measure(model: Any, backend: str, length: int, texts: Sequence[str], n: int) -> Baseline:
    """`n` calls of one text each (cycling `texts`), after 5 untimed ones."""
    for text in texts[-5:]:
        model.encode([text])
    latencies = []
    cpu0 = time.process_time()
    for i in range(n):
        started = time.perf_counter()
        model.encode([texts[i % len(texts)]])
        latencies.append(time.perf_counter() - started)
    cpu = time.process_time() - cpu0
    return Baseline(
        backend,
        length,
        n,
        statistics.median(latencies) * 1e3,
        float(np.percentile(latencies, 99)) * 1e3,
        statistics.fmean(latencies) * 1e3,
        max(latencies) * 1e3,
        cpu / n * 1e6,
    )


def run(lengths: Sequence[int], requests: int, threads: int) -> list[Baseline]:
    """This module as a child process with `threads` torch threads and the OpenMP wait policy
    the workers get for them (common.cpus.wait_policy); its baselines (those it finished, when it
    failed: the reason goes to stderr, and the fleets' figures are kept)."""
    from embedfleet.common.cpus import wait_policy

    env = {**os.environ, "OMP_WAIT_POLICY": wait_policy(threads), "OMP_NUM_THREADS": str(threads)}
    argv = [sys.executable, "-m", __name__, "--lengths", ",".join(map(str, lengths))]
    proc = subprocess.run(
        [*argv, "--requests", str(requests)], env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        print(
            f"sentence-transformers baseline failed ({proc.returncode}): {tail[0]}", file=sys.stderr
        )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return [Baseline(**json.loads(line)) for line in lines]


def main(argv: Sequence[str] | None = None) -> int:
    from embedfleet.bench import corpus, peers

    parser = argparse.ArgumentParser(prog="python -m embedfleet.bench.st_inprocess")
    parser.add_argument("--lengths", default="20,128,512")
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args(argv)
    texts = corpus.load()
    for backend in backends():
        model = load(str(peers.served_model_dir()), backend)
        for length in (int(n) for n in args.lengths.split(",") if n):
            got = measure(model, backend, length, texts.of_length(length), args.requests)
            print(json.dumps(asdict(got)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

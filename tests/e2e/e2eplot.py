"""Draws the autoscaling timeline that tests/e2e/test_autoscaling.py writes, for docs/:

python tests/e2e/e2eplot.py TIMELINE.json docs/autoscaling-timeline.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def plot(timeline: Path, out: Path) -> None:
    rows = json.loads(timeline.read_text())["rows"]
    t = [r["t"] for r in rows]
    fig, (load, replicas, latency) = plt.subplots(3, 1, sharex=True, figsize=(9, 7))
    load.plot(t, [r["tokens_per_second"] or 0 for r in rows], label="tokens/s at the gateway")
    load.set_ylabel("tokens/s")
    streams = load.twinx()
    streams.step(t, [r["streams"] for r in rows], where="post", color="grey", linestyle=":",
                 label="client streams")  # fmt: skip
    streams.set_ylabel("streams")
    load.legend(loc="upper left")
    streams.legend(loc="upper right")
    replicas.step(t, [r["desired"] or 0 for r in rows], where="post", label="desired")
    replicas.step(t, [r["ready"] for r in rows], where="post", label="ready", linestyle="--")
    replicas.set_ylabel("worker replicas")
    replicas.legend(loc="upper left")
    latency.plot(t, [r["p99_ms"] for r in rows], label="p99 at the gateway (autoscaler)")
    latency.plot(t, [r["client_p99_ms"] for r in rows], label="p99 at the client (5 s)", alpha=0.6)
    latency.set_ylabel("p99 (ms)")
    latency.set_xlabel("seconds")
    latency.legend(loc="upper left")
    phases: list[tuple[float, str]] = []
    for r in rows:
        if not phases or phases[-1][1] != r["phase"]:
            phases.append((r["t"], r["phase"]))
    for axis in (load, replicas, latency):
        for start, _ in phases[1:]:
            axis.axvline(start, color="black", linewidth=0.5, alpha=0.4)
    for start, name in phases:
        load.annotate(name, (start, 1.02), xycoords=("data", "axes fraction"), fontsize=8)
    fig.suptitle("Autoscaling on the real node: load, replicas, p99")
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    plot(Path(sys.argv[1]), Path(sys.argv[2]))

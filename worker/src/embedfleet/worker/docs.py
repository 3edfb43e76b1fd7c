"""Keeps docs/worker.md's generated tables (flags/env vars, metrics) in step with the code.

`python -m embedfleet.worker.docs` rewrites them in place; `--check` exits 1 when they are stale.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from embedfleet.common.settings import markdown_table
from embedfleet.worker.metrics import GpuMemory, WorkerMetrics, metric_rows
from embedfleet.worker.settings import ENV_PREFIX, WorkerSettings

DOC = Path(__file__).resolve().parents[4] / "docs" / "worker.md"


def settings_table() -> str:
    return markdown_table(WorkerSettings, ENV_PREFIX)


def metrics_table() -> str:
    rows = ["| metric | type | labels | meaning |", "| --- | --- | --- | --- |"]
    # As a CUDA worker exports them: a CPU worker has no GPU memory series at all.
    cuda = WorkerMetrics(gpu_memory=lambda: GpuMemory(0, 0, 0))
    for name, kind, labels, help_text in metric_rows(cuda):
        shown = f"`{labels}`" if labels else ""
        rows.append(f"| `{name}` | {kind} | {shown} | {help_text} |")
    return "\n".join(rows) + "\n"


SECTIONS = {"settings": settings_table, "metrics": metrics_table}


def render(text: str) -> str:
    """`text` with each `<!-- generated:NAME -->` ... `<!-- end:NAME -->` block regenerated."""
    for name, make in SECTIONS.items():
        begin, end = f"<!-- generated:{name} -->\n", f"<!-- end:{name} -->"
        head, found, rest = text.partition(begin)
        if not found:
            raise ValueError(f"{DOC.name} lacks the marker {begin.strip()}")
        _, found, tail = rest.partition(end)
        if not found:
            raise ValueError(f"{DOC.name} lacks the marker {end}")
        text = head + begin + make() + end + tail
    return text


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Regenerate the tables in docs/worker.md.")
    parser.add_argument("--check", action="store_true", help="only report whether they are stale")
    args = parser.parse_args(argv)
    current = DOC.read_text()
    fresh = render(current)
    if args.check:
        if fresh != current:
            print(f"{DOC} is stale: run python -m embedfleet.worker.docs", file=sys.stderr)
            sys.exit(1)
        return
    DOC.write_text(fresh)


if __name__ == "__main__":
    main()

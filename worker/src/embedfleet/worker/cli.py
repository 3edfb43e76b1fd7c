"""`embedfleet-worker`: serve one model over gRPC. Flags and env vars: docs/worker.md."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from collections.abc import Sequence

from embedfleet.common import logs
from embedfleet.common.cpus import detect_cores
from embedfleet.common.settings import load
from embedfleet.worker.lifecycle import serve
from embedfleet.worker.settings import ENV_PREFIX, WorkerSettings


def main(argv: Sequence[str] | None = None) -> None:
    settings = load(
        WorkerSettings,
        ENV_PREFIX,
        argv,
        prog="embedfleet-worker",
        description="Serve an embedding or reranking model over gRPC with FCFS token batching.",
    )
    logs.configure(settings.log_level)
    if settings.threads == 0:
        # torch would count the machine's cores (its affinity mask), not a container's CPU quota:
        # 64 threads in a 2-CPU pod on a 64-core node, throttled by the quota.
        settings = dataclasses.replace(settings, threads=detect_cores())
    if settings.engines > 1:
        from embedfleet.worker.engines import run_engines

        sys.exit(run_engines(settings, list(sys.argv[1:] if argv is None else argv)))
    sys.exit(asyncio.run(serve(settings)))


if __name__ == "__main__":
    main()

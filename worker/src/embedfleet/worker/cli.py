"""`embedfleet-worker`: serve one model over gRPC. Flags and env vars: docs/worker.md."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys
from collections.abc import Callable, MutableMapping, Sequence

from embedfleet.common import logs
from embedfleet.common.cpus import detect_cores, wait_policy
from embedfleet.common.settings import load
from embedfleet.worker.architectures import check, exit_refused
from embedfleet.worker.settings import ENV_PREFIX, WorkerSettings

log = logging.getLogger(__name__)


def fit_machine(
    settings: WorkerSettings, environ: MutableMapping[str, str], cores: Callable[[], int]
) -> WorkerSettings:
    """--threads 0 as the cores this process may use, and the OpenMP wait policy for them."""
    if settings.threads == 0:
        # torch would count the machine's cores (its affinity mask), not a container's CPU quota:
        # 64 threads in a 2-CPU pod on a 64-core node, throttled by the quota.
        settings = dataclasses.replace(settings, threads=cores())
    # libgomp reads it once, when torch loads it (later, in the engine): one set by the user wins.
    environ.setdefault("OMP_WAIT_POLICY", wait_policy(settings.threads))
    return settings


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's event loop: the gRPC front's per-call work is mostly the
    loop's (docs/benchmarks, "Gateway CPU": the worker's CPU per short query fell by a fifth to a
    quarter). The standard loop where uvloop is not installed."""
    try:
        import uvloop
    except ImportError:
        log.warning("uvloop is not installed: the gRPC front runs on the slower asyncio loop")
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def main(argv: Sequence[str] | None = None) -> None:
    settings = load(
        WorkerSettings,
        ENV_PREFIX,
        argv,
        prog="embedfleet-worker",
        description="Serve an embedding or reranking model over gRPC with FCFS token batching.",
    )
    logs.configure(settings.log_level, log_format=settings.log_format)
    if settings.engine == "torch" and (line := check(settings.model, settings.task)):
        exit_refused(line, settings.termination_message_path)
    settings = fit_machine(settings, os.environ, detect_cores)
    if settings.engines > 1:
        from embedfleet.worker.engines import run_engines

        sys.exit(run_engines(settings, list(sys.argv[1:] if argv is None else argv)))
    if settings.front == "rust":  # each of several engines is such a worker of its own
        from embedfleet.worker.rust_front import serve as serve_rust

        sys.exit(serve_rust(settings))
    # Imported only now: a refused model is told within a second of start, not after gRPC's.
    from embedfleet.worker.lifecycle import serve

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        code = runner.run(serve(settings))
    sys.exit(code)


if __name__ == "__main__":
    main()

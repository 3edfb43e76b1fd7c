"""Several engine processes in one worker container (`--engines N`, the operator's enginesPerGPU).

A small model leaves a big GPU idle between one process's kernel launches; N processes, each a
whole worker (own gRPC and metrics port, own CUDA context), keep it busy. They run in one
container because the device plugin hands a GPU to one container only: two containers of a pod
cannot share it without cluster-wide time-slicing. This process only starts them, forwards SIGTERM
and SIGINT, and exits as soon as one of them does (the kubelet then restarts the container), so a
dead engine never sits behind a live port.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

from embedfleet.worker.settings import WorkerSettings

log = logging.getLogger(__name__)

#: of the GPU's memory, what N engines split between them (CUDA contexts and fragmentation take
#: the rest: ~0.5 GB per context on an H200)
GPU_MEMORY_SHARE = 0.9


def engine_flags(settings: WorkerSettings, index: int, count: int) -> list[str]:
    """Flags that make engine `index` of `count` a worker of its own; appended to the
    container's own arguments (a later flag wins)."""
    flags = ["--engines", "1"]
    if settings.port:
        flags += ["--port", str(settings.port + index)]
    if settings.metrics_port:
        flags += ["--metrics-port", str(settings.metrics_port + index)]
    if settings.port_file:
        flags += [
            "--port-file",
            settings.port_file if index == 0 else f"{settings.port_file}.{index}",
        ]
    if settings.cuda_memory_fraction == 0 and count > 1:
        flags += ["--cuda-memory-fraction", f"{GPU_MEMORY_SHARE / count:.4f}"]
    if settings.threads > 0:
        flags += ["--threads", str(max(1, settings.threads // count))]
    return flags


def run_engines(settings: WorkerSettings, argv: Sequence[str]) -> int:
    """Start `settings.engines` workers and supervise them; their first exit code is ours."""
    count = settings.engines
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "embedfleet.worker.cli",
                *argv,
                *engine_flags(settings, i, count),
            ]
        )
        for i in range(count)
    ]
    log.info("engines started", extra={"engines": count, "pids": [c.pid for c in children]})
    stopping = False

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code: int | None = None
    while any(c.poll() is None for c in children):
        exited = [c for c in children if c.poll() is not None]
        if exited and code is None:
            code = exited[0].returncode
            if not stopping:
                log.error(
                    "an engine exited; stopping the others",
                    extra={"pid": exited[0].pid, "exit_code": code},
                )
                forward(signal.SIGTERM, None)
        time.sleep(0.1)
    if code is None:
        code = next((c.returncode for c in children if c.returncode), 0)
    return code if stopping or code else 1

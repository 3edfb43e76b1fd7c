"""Where a worker process's CPU goes: cProfile inside the worker processes a benchmark starts,
grouped into the stages of the request path (the gateway is a native binary, which cProfile
cannot see).

No production code knows about it. `hook_dir(tmp)` writes a `sitecustomize.py` that Python runs at
start-up in every child whose PYTHONPATH leads with `tmp`; when EMBEDFLEET_BENCH_PROFILE names a
folder, that child profiles its main thread's CPU time (the event loop: HTTP, JSON, validation,
gRPC's Python side, the scheduler) between SIGUSR1 and SIGUSR2, and writes `<name>-<pid>.prof`
there when it exits. Cython and C code (grpc's aio core, uvloop) is not seen
by cProfile: its time lands on the Python call that ran it, mostly the event loop's
`Context.run` of a callback, counted here as "callbacks (C/Cython inside)".
cProfile roughly doubles the cost of each Python call, so the shares are the figures, not the µs.
"""

from __future__ import annotations

import json
import pstats
from collections.abc import Iterator, Sequence
from pathlib import Path

ENV = "EMBEDFLEET_BENCH_PROFILE"

_HOOK = '''"""Written by embedfleet.bench.cpu_profile: profile this process when {env} is set."""
import os

if os.environ.get("{env}"):
    import atexit, cProfile, json, signal, sys, time

    # CPU time of the main thread (the event loop), not wall time: waiting costs nothing.
    _profile = cProfile.Profile(time.thread_time)
    _cpu = {{"process": 0.0, "main_thread": 0.0}}
    _marks = [0.0, 0.0]

    def _start(*_: object) -> None:
        _marks[:] = [time.process_time(), time.thread_time()]
        _profile.enable()

    def _stop(*_: object) -> None:
        _profile.disable()
        _cpu["process"] += time.process_time() - _marks[0]
        _cpu["main_thread"] += time.thread_time() - _marks[1]

    def _dump() -> None:
        _profile.disable()
        # sys.argv is final only now (under -m it reads "-m" while site runs)
        parts = (sys.argv[0] or "python").replace(".py", "").split(os.sep)
        name = "-".join(parts[-2:]) if parts[-1] in ("cli", "__main__") else parts[-1]
        path = os.path.join(os.environ["{env}"], f"{{name}}-{{os.getpid()}}")
        _profile.dump_stats(path + ".prof")
        with open(path + ".cpu.json", "w") as out:
            json.dump(_cpu, out)

    atexit.register(_dump)
    # The benchmark brackets its measured window with these, so start-up stays out.
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
    # Exit cleanly on SIGTERM (a worker's drain), so the profile is written.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
'''

#: (stage, substrings of "file:function" that put a function there), first match wins
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("metrics", ("prometheus_client",)),
    ("tracing", ("opentelemetry", "/tracing.py")),
    ("gRPC (Python side)", ("grpc", "protobuf", "_pb2", "cygrpc")),
    ("codec + numpy", ("codec.py", "numpy")),
    ("worker front", ("worker/server.py", "inflight.py", "runner.py", "scheduler.py")),
    ("engine", ("null_engine.py", "engine/", "torch")),
    ("callbacks (C/Cython inside: gRPC aio core)", ("_contextvars.Context' objects>",)),
    ("event loop (asyncio, uvloop)", ("asyncio", "uvloop", "selectors", "contextvars")),
)


def hook_dir(folder: Path) -> Path:
    """Writes the start-up hook into `folder`; put `folder` first on the children's PYTHONPATH."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_HOOK.format(env=ENV))
    return folder


def stage_of(where: str) -> str:
    """The stage a profiled function belongs to, from its "file:function" (pure)."""
    for stage, needles in STAGES:
        if any(n in where for n in needles):
            return stage
    return "other Python"


def _entries(paths: Sequence[Path]) -> Iterator[tuple[str, int, str, float]]:
    """(file, line, function, own seconds) of every profiled function in `paths`."""
    for path in paths:
        table: dict[tuple[str, int, str], tuple[int, int, float, float, object]]
        table = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
        for (file, line, func), (_, _, own, _, _) in table.items():
            yield file, line, func, own


def stages(paths: Sequence[Path]) -> dict[str, float]:
    """Own CPU seconds per stage, summed over the profiles in `paths`, largest first."""
    total: dict[str, float] = {}
    for file, _, func, own in _entries(paths):
        stage = stage_of(f"{file}:{func}")
        total[stage] = total.get(stage, 0.0) + own
    return dict(sorted(total.items(), key=lambda kv: -kv[1]))


def top_functions(paths: Sequence[Path], n: int = 12) -> list[tuple[str, float]]:
    """The `n` functions of most own time, as ("file:line(function)", seconds)."""
    own: dict[str, float] = {}
    for file, line, func, seconds in _entries(paths):
        short = "/".join(Path(file).parts[-2:]) if file != "~" else ""
        key = f"{short}:{line}({func})" if short else func
        own[key] = own.get(key, 0.0) + seconds
    return sorted(own.items(), key=lambda kv: -kv[1])[:n]


OFF_MAIN = "off the main thread (the engine thread, gRPC core threads)"


def process_cpu(paths: Sequence[Path]) -> tuple[float, float]:
    """(process, main thread) CPU seconds of the profiled windows, from the .cpu.json files."""
    process = main = 0.0
    for path in paths:
        side = path.with_suffix(".cpu.json")
        if side.is_file():
            doc = json.loads(side.read_text())
            process += doc["process"]
            main += doc["main_thread"]
    return process, main


def table(name: str, paths: Sequence[Path], requests: int) -> str:
    """A markdown table of one process kind's stages: share of the process's CPU and µs/request
    (cProfile's overhead in them), the main thread's stages from the profile, the other threads'
    CPU as one row."""
    by_stage = stages(paths)
    process, main = process_cpu(paths)
    if process > main:
        by_stage[OFF_MAIN] = process - main
        by_stage = dict(sorted(by_stage.items(), key=lambda kv: -kv[1]))
    whole = sum(by_stage.values()) or 1e-12
    lines = [
        f"| {name} stage | share | profiled µs/req |",
        "| --- | --- | --- |",
    ]
    for stage, seconds in by_stage.items():
        lines.append(
            f"| {stage} | {seconds / whole:.0%} | {seconds / max(1, requests) * 1e6:.0f} |"
        )
    lines += ["", f"| {name}: top functions (own time) | share of the process |", "| --- | --- |"]
    for func, seconds in top_functions(paths):
        lines.append(f"| `{func}` | {seconds / whole:.1%} |")
    return "\n".join(lines) + "\n"

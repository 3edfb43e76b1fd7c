"""`python -m embedfleet.bench [suite ...]` (`make bench`): the one entry point of every benchmark.

Suites latency, scoring, throughput and concurrency run side by side against the peers
(compare.py). The other benchmark modules are dispatched by name, with the rest of the command
line as their own arguments: `engine`, `cpu-paths`, `worker`, `gateway`, `autoscale`, `formats`,
`tracing`, `stages` (the per-stage breakdown at batch 1), `first-use` (a new length's first
run on the CPU engine), `busy-start` (a lone client from a fleet's start, never pausing),
`layouts` (workers x threads of `embedfleet serve`), `families` (a row of 16-client queries
per encoder family); plus the helpers `corpus` (rebuild the corpus) and `install-peers`. No
suite named runs the five comparison suites, then those modules with their defaults.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from embedfleet.bench import compare, corpus, peers
from embedfleet.bench.suites import FULL, QUICK, SUITES, plan, scaled

#: other benchmark modules: name -> module with `main(argv) -> int | None`
MODULES = {
    "engine": "embedfleet.bench.engine",
    "cpu-paths": "embedfleet.bench.cpu_paths",
    "worker": "embedfleet.bench.worker",
    "gateway": "embedfleet.bench.gateway",
    "autoscale": "embedfleet.bench.autoscale_sim",
    "formats": "embedfleet.bench.formats",
    "tracing": "embedfleet.bench.tracing",
    "stages": "embedfleet.bench.stages",
    "first-use": "embedfleet.bench.first_use",
    "busy-start": "embedfleet.bench.busy_start",
    "layouts": "embedfleet.bench.layouts",
    "families": "embedfleet.bench.families",
}


def _module_main(name: str) -> Callable[[Sequence[str]], int | None]:
    module = importlib.import_module(MODULES[name])
    main: Callable[[Sequence[str]], int | None] = module.main
    return main


def _install_peers(argv: Sequence[str]) -> int:
    failed = peers.install_all()
    for name, why in failed.items():
        print(f"{name}: {why}")
    return 1 if failed else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m embedfleet.bench",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="Helpers: `python -m embedfleet.bench corpus|install-peers|engine ...|"
        "autoscale ...` pass the remaining arguments to that module.",
    )
    parser.add_argument(
        "suites",
        nargs="*",
        choices=[*SUITES, *MODULES],
        help="suites to run (default: the five comparison suites, then every module above)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke-test sizes (~2 minutes)")
    parser.add_argument(
        "--systems",
        default=",".join(compare.SYSTEMS),
        help="comma-separated systems to compare (default: %(default)s)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where results.md/.json and the PNGs go (default: docs/benchmarks; with --quick a "
        "folder under the cache)",
    )
    parser.add_argument("--seconds-scale", type=float, default=1.0, help="scale every duration")
    parser.add_argument("--embedfleet-workers", type=int, default=1, help="workers of our fleet")
    parser.add_argument(
        "--embedfleet-url", default="", help="use a fleet already serving here instead"
    )
    parser.add_argument(
        "--device", default="cpu", help="cpu, or cuda for our workers and sentence-transformers"
    )
    parser.add_argument("--st-dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--infinity-engine", default="torch", choices=["torch", "optimum"])
    parser.add_argument("--infinity-dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--vllm-dtype", default="bfloat16", choices=["float32", "bfloat16"])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    helpers: dict[str, Callable[[Sequence[str]], int | None]] = {
        "corpus": corpus.main,
        "install-peers": _install_peers,
    }
    if args_in and args_in[0] in helpers:
        return helpers[args_in[0]](args_in[1:]) or 0
    if args_in and args_in[0] in MODULES:
        return _module_main(args_in[0])(args_in[1:]) or 0

    args = _parser().parse_args(args_in)
    chosen = args.suites or [*SUITES, *MODULES]
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    run_dir = corpus.cache_dir() / "bench-runs" / stamp
    timing = QUICK if args.quick else FULL
    points = scaled(plan([s for s in chosen if s in SUITES], timing), args.seconds_scale)
    started = time.monotonic()
    rc = 0
    if points:
        out = args.out or (run_dir / "results" if args.quick else Path("docs/benchmarks"))
        opts = compare.Options(
            systems=tuple(s.strip() for s in args.systems.split(",") if s.strip()),
            points=points,
            mode="quick" if args.quick else "full",
            out=out,
            log_dir=run_dir / "logs",
            embedfleet_workers=args.embedfleet_workers,
            device=args.device,
            embedfleet_url=args.embedfleet_url,
            st_dtype=args.st_dtype,
            infinity_engine=args.infinity_engine,
            infinity_dtype=args.infinity_dtype,
            vllm_dtype=args.vllm_dtype,
            command="python -m embedfleet.bench " + shlex.join(args_in),
        )
        rc = compare.main(opts)
    for name in (s for s in chosen if s in MODULES):
        t0 = time.monotonic()
        print(f"\n[bench] === {name} ===", flush=True)
        try:
            module_rc = _module_main(name)([]) or 0
        except ModuleNotFoundError as exc:
            print(f"[bench] {name}: not available ({exc})")
            module_rc = 0 if args.suites == [] else 1
        print(f"[bench] {name}: {time.monotonic() - t0:.0f}s", flush=True)
        rc = rc or module_rc
    print(f"[bench] all done in {time.monotonic() - started:.0f}s")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())

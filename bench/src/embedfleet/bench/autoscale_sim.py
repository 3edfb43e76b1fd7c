"""Prints the autoscaling simulator's scores as a markdown table (docs/autoscaling.md).

    python -m embedfleet.bench autoscale [--hours 4] [--seed 7] [--start-seconds 30] [--trace T]

The simulator itself, with the policy it replays, is the operator's:
`embedfleet.operator.autoscaling.simulator`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from embedfleet.operator.autoscaling.simulator import TRACES, Fleet, Score, simulate


def table(scores: Sequence[Score]) -> str:
    lines = [
        "| trace | policy | SLO attainment | replica-hours | vs SLO oracle | vs target oracle "
        "| scale events | reversals |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in scores:
        lines.append(
            f"| {s.trace} | {s.policy} | {s.slo_attainment:.2%} | {s.replica_hours:.1f} "
            f"| {s.over_oracle:+.1%} | {s.over_target:+.1%} | {s.scale_events} | {s.reversals} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedfleet.bench autoscale")
    parser.add_argument("--hours", type=float, default=4.0, help="length of each trace")
    parser.add_argument("--seed", type=int, default=7, help="seed of the load noise")
    parser.add_argument("--start-seconds", type=float, default=30.0, help="pod start time")
    parser.add_argument("--trace", action="append", choices=sorted(TRACES), help="repeatable")
    args = parser.parse_args(argv)
    fleet = Fleet(start_seconds=args.start_seconds)
    scores = simulate(args.hours, args.seed, fleet, args.trace or ())
    print(
        f"Autoscaling simulator: {args.hours:g} h per trace, pods start in "
        f"{fleet.start_seconds:g} s, capacity {fleet.capacity:.0f} tokens/s per replica, "
        f"p99 SLO {fleet.slo_seconds * 1000:.0f} ms, seed {args.seed}\n"
    )
    print(table(scores))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

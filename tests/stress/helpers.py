"""A local fleet (`embedfleet.fleet.supervisor.Fleet`: the gateway and real worker processes on
127.0.0.1) for the stress tests, and what they read from its workers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc

from embedfleet.common.net import free_ports
from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.fleet.supervisor import Child, Fleet
from embedfleet.testing.workers import metric_value, scrape, worker_stub


def null_workers(tokens_per_second: float = 0.0) -> list[str]:
    """Worker flags for the null engine; with a pace, a worker of that capacity (asleep, so a busy
    machine does not change it). A short warm-up: it measures the pace, not a model, before the
    worker serves (the load starts at once, and admission needs the capacity)."""
    args = ["--engine", "null", "--warmup-seconds", "1", "--capacity-measurement", "startup"]
    if tokens_per_second:
        args += ["--null-tokens-per-second", str(tokens_per_second)]
    return args


@contextlib.contextmanager
def local_fleet(
    log_dir: Path, workers: int, worker_args: Sequence[str], gateway_args: Sequence[str] = ()
) -> Iterator[Fleet]:
    (port,) = free_ports(1)
    fleet = Fleet(
        workers=workers,
        port=port,
        worker_args=worker_args,
        gateway_args=gateway_args,
        log_dir=log_dir,
    )
    with fleet:
        yield fleet


def info(child: Child) -> pb.InfoResponse:
    with grpc.insecure_channel(child.address) as channel:
        reply: pb.InfoResponse = worker_stub(channel).Info(pb.InfoRequest(), timeout=10)
    return reply


def capacity(fleet: Fleet) -> float:
    """The workers' capacity together, as each measured it at warm-up (what admission uses)."""
    return sum(info(c).capacity_tokens_per_second for c in fleet.worker_children)


def metrics_port(child: Child) -> int:
    return int(child.argv[child.argv.index("--metrics-port") + 1])


def worker_metric(child: Child, name: str, **labels: str) -> float:
    return metric_value(scrape(metrics_port(child)), name, **labels)

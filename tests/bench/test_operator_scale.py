"""The operator-scale benchmark's pure parts (when the API server recorded the operator's apply)
and its MOCK Prometheus."""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime

import aiohttp

from embedfleet.bench import operator_scale
from embedfleet.bench.operator_scale import applied_at, change_applied_p99, latencies
from embedfleet.operator.autoscaling import signals
from embedfleet.operator.manifests import MANAGER


def _entry(manager: str, operation: str, stamp: str, subresource: str = "") -> dict[str, str]:
    entry = {"manager": manager, "operation": operation, "time": stamp}
    if subresource:
        entry["subresource"] = subresource
    return entry


def test_the_operators_apply_is_read_from_managed_fields() -> None:
    obj = {
        "metadata": {
            "managedFields": [
                _entry("kube-controller-manager", "Update", "2026-12-02T00:00:09Z", "status"),
                _entry(MANAGER, "Apply", "2026-12-02T00:00:05Z"),
                _entry("kubectl", "Apply", "2026-12-02T00:00:01Z"),
            ]
        }
    }
    assert applied_at(obj) == datetime(2026, 12, 2, 0, 0, 5, tzinfo=UTC).timestamp()


def test_no_apply_of_the_operator_is_no_time() -> None:
    only_status = {"metadata": {"managedFields": [_entry(MANAGER, "Update", "x", "status")]}}
    assert applied_at(only_status) is None
    assert applied_at({"metadata": {}}) is None


def test_latencies_count_what_never_arrived() -> None:
    got = latencies({"a": 10.0, "b": 20.0, "c": 30.0}, {"a": 11.0, "b": 24.0})
    assert (got["count"], got["missing"]) == (2, 1)
    assert (got["p50_s"], got["p99_s"], got["max_s"]) == (1.0, 4.0, 4.0)


def test_the_change_target_reads_the_api_servers_record_rounded_up() -> None:
    watch = {"p99_s": 20.0}
    assert change_applied_p99({"applied": watch, "applied_server": {"p99_s": 3.68}}) == 4.68
    assert change_applied_p99({"applied": watch}) == 20.0  # an older run: no record read
    assert change_applied_p99({"applied": watch, "applied_server": {"p99_s": None}}) == 20.0


def test_the_fake_prometheus_answers_the_operators_queries_for_every_fleet() -> None:
    # The MOCK must answer the queries the operator really sends (signals.prometheus_queries),
    # one series per fleet, or the Prometheus-mode run would measure fleets without signals.
    fake = operator_scale.FakePrometheus(["f0000", "f0001"])
    try:

        async def ask(namespace: str, fleet: str) -> signals.Answers:
            queries = signals.prometheus_queries("1m", namespace, fleet)
            async with aiohttp.ClientSession() as session:
                return await signals.query_prometheus(session, fake.url, queries)

        every = asyncio.run(ask("", ""))
        for name in ("f0000", "f0001"):
            values = signals.values_of(every, (operator_scale.NAMESPACE, name))
            observation = signals.observation_from_prometheus(values, ready_replicas=1)
            assert observation is not None
            assert 95 <= observation.tokens_per_second <= 105
            assert observation.capacity_tokens_per_second == 1000
            assert observation.p99_seconds == 0.05
        assert {fleet for _, fleet, _ in fake.queries} == {""}  # asked for every fleet at once
        assert len(fake.queries) == len(signals.prometheus_queries("1m"))
    finally:
        fake.stop()


def test_a_phases_p99_reads_only_what_its_histogram_grew_by() -> None:
    # 100 waits under 0.1 s before the phase; during it, 99 under 0.1 s and one between 5 and
    # 10 s: the phase's p99 falls in the 0.05-0.1 bucket, not among the earlier ones.
    before = {"fleet": {0.05: 50.0, 0.1: 100.0, 5.0: 100.0, 10.0: 100.0, math.inf: 100.0}}
    now = {"fleet": {0.05: 50.0, 0.1: 199.0, 5.0: 199.0, 10.0: 200.0, math.inf: 200.0}}
    p99 = operator_scale.p99s(now, before)["fleet"]
    assert 0.05 < p99 <= 0.1
    assert operator_scale.p99s(before, before) == {}  # nothing observed in the phase


def test_the_kill_report_says_what_the_successor_costs_at_rest() -> None:
    phase = {
        "seconds": 60.0,
        "apiserver_writes_per_min": {"APPLY deployments": 100.0},
        "apiserver_latency_ms": {"APPLY": 10.0, "WATCH": 1e6},
        "etcd_latency_ms": {"update": 2.0},
        "operator_cpu_cores": 0.5,
    }
    idle = {
        "seconds": 120.0,
        "operator_cpu_cores": 0.04,
        "operator_writes_per_min": {"PUT leases": 30.0, "PATCH embeddingdeployments": 1.5},
        "operator_per_min": {"GET": 2.0, "PUT": 31.5},
    }
    kill = {
        "phase": phase,
        "successor_leading_after_s": 16.0,
        "all_applied_after_kill_s": 40.0,
        "kill_convergence_s": 41.0,
        "lease_seconds": 15.0,
        "fleets_applied_by_successor": 500,
        "successor_skipped_applies": 10.0,
    }
    assert "idle" not in operator_scale.kill_breakdown(kill)
    text = operator_scale.kill_breakdown({**kill, "idle_phase": idle})
    assert "idle for 120.0 s: the successor's CPU 0.04 cores" in text
    assert "its writes 1.5/min besides its Lease" in text
    assert "WATCH" not in text

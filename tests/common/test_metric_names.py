"""Every metric is declared once, as data (embedfleet.common.metrics), and each declared name keeps
Prometheus's naming rules and the house prefix `embedfleet_<component>_`."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Counter, generate_latest

from embedfleet.common.metrics import Declared, Metrics, counter, gauge, histogram, naming_problems
from embedfleet.operator import handlers  # noqa: F401  (imports every module that has metrics)
from embedfleet.operator import metrics as operator_metrics
from embedfleet.worker.metrics import SCRAPED, GpuMemory, WorkerMetrics

WORKER = [*WorkerMetrics.declared().values(), *SCRAPED]
OPERATOR = operator_metrics.TABLE.declared


def _scraped(family_name: str, kind: str) -> str:
    return family_name + ("_total" if kind == "counter" else "")


@pytest.mark.parametrize(
    ("declared", "prefix"),
    [(d, "embedfleet_worker_") for d in WORKER] + [(d, "embedfleet_operator_") for d in OPERATOR],
    ids=lambda value: value.name if isinstance(value, Declared) else "",
)
def test_every_declared_name_keeps_the_rules(declared: Declared[Any], prefix: str) -> None:
    assert naming_problems(declared, prefix) == []


@pytest.mark.parametrize(
    ("declared", "problem"),
    [
        (counter("embedfleet_x_requests", "Requests."), "_total"),
        (gauge("embedfleet_x_open_total", "Open."), "_total"),
        (gauge("embedfleet_x_Open", "Open."), "snake_case"),
        (gauge("other_open", "Open."), "prefix"),
        (histogram("embedfleet_x_wait_ms", "Wait.", buckets=(1.0,)), "base ones"),
        (gauge("embedfleet_x_size_mb", "Size."), "base ones"),
        (gauge("embedfleet_x_wait_count", "Waits."), "derived sample"),
        (gauge("embedfleet_x_open", "Open.", ("le",)), "reserved"),
        (gauge("embedfleet_x_open", "Open.", ("podName",)), "snake_case"),
        (histogram("embedfleet_x_seconds", "Wait.", buckets=(2.0, 1.0)), "increasing"),
        (histogram("embedfleet_x_seconds", "Wait.", buckets=()), "every histogram"),
        (gauge("embedfleet_x_open", "open"), "full stop"),
    ],
)
def test_each_rule_catches_its_break(declared: Declared[Any], problem: str) -> None:
    found = naming_problems(declared, "embedfleet_x_")
    assert len(found) == 1, found
    assert problem in found[0]


def test_the_tables_hold_every_exported_metric_once() -> None:
    worker = WorkerMetrics(gpu_memory=lambda: GpuMemory(0, 0, 0))
    exported = {_scraped(f.name, f.type) for f in worker.registry.collect()}
    declared = [d.name for d in WORKER]
    assert sorted(declared) == sorted(exported)
    assert len(set(declared)) == len(declared)
    ours = {
        _scraped(f.name, f.type)
        for f in REGISTRY.collect()
        if f.name.startswith("embedfleet_operator_")
    }
    assert ours == {d.name for d in OPERATOR}, "an operator metric built outside metrics.TABLE"


class _Demo(Metrics):
    hits = counter("embedfleet_demo_hits_total", "Hits.", ("route",))


class _More(_Demo):
    wait = histogram("embedfleet_demo_wait_seconds", "Wait.", buckets=(0.1, 1.0))


def test_an_instance_builds_each_declaration_into_its_own_registry() -> None:
    one, two = _More(CollectorRegistry()), _More(CollectorRegistry())
    assert list(_More.declared()) == ["hits", "wait"]  # the base's first
    assert isinstance(_More.hits, Declared)
    assert isinstance(one.hits, Counter)
    one.hits.labels("a").inc()
    one.wait.observe(0.5)
    text = generate_latest(one.registry).decode()
    assert 'embedfleet_demo_hits_total{route="a"} 1.0' in text
    assert 'embedfleet_demo_wait_seconds_bucket{le="1.0"} 1.0' in text
    assert "route=" not in generate_latest(two.registry).decode()


def test_a_scrape_time_family_carries_the_declaration() -> None:
    family = gauge("embedfleet_demo_info", "Info.", ("kind",)).family()
    family.add_metric(("a",), 1.0)
    assert (family.name, family.type, family.documentation) == (
        "embedfleet_demo_info",
        "gauge",
        "Info.",
    )
    assert counter("embedfleet_demo_runs_total", "Runs.").family(3).samples[0].value == 3

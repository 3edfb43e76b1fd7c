"""Prometheus metrics declared as data: each metric is one `Declared` value (kind, name, help,
labels, buckets), turned into a prometheus_client object by `Declared.build` alone.

A component's metrics are a `Metrics` subclass whose class body is the declaration table; an
instance builds every declared metric into its registry, under the same attribute name:

    class WorkerMetrics(Metrics):
        tokens = counter("embedfleet_worker_tokens_total", "Tokens computed.")

    WorkerMetrics(CollectorRegistry()).tokens.inc()

A process-wide set of module-level metrics builds each declaration through a `Table` instead.

A name is written as it is scraped (a counter's ends in `_total`; prometheus_client strips that
suffix and puts it back). `naming_problems` holds a declaration to Prometheus's naming rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, cast, overload

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

Kind = Literal["counter", "gauge", "histogram"]
M = TypeVar("M", Counter, Gauge, Histogram)

_TYPES: dict[Kind, type[Counter | Gauge | Histogram]] = {
    "counter": Counter,
    "gauge": Gauge,
    "histogram": Histogram,
}
_SNAKE = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")
#: units other than the base ones (seconds, bytes) that Prometheus asks names not to use
_NON_BASE_UNITS = frozenset(
    {"ms", "millis", "milliseconds", "us", "microseconds", "ns", "nanoseconds", "minutes",
     "hours", "days", "kb", "mb", "gb", "kib", "mib", "gib", "percent"}
)  # fmt: skip
#: suffixes of the samples prometheus_client derives from a metric's name
_SAMPLE_SUFFIXES = ("_count", "_sum", "_bucket", "_created")


@dataclass(frozen=True, slots=True)
class Declared(Generic[M]):
    """One metric as data. In a `Metrics` class body it is also the attribute's declaration: on
    an instance the attribute is the built metric (typed `M`), on the class this value."""

    kind: Kind
    name: str
    """As scraped: a counter's ends in `_total`."""
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    """A histogram's upper bounds (+Inf is added)."""

    def build(self, registry: CollectorRegistry) -> M:
        """The prometheus_client metric, registered in `registry`."""
        extra: dict[str, Any] = {"buckets": self.buckets} if self.kind == "histogram" else {}
        made = _TYPES[self.kind](self.name, self.help, self.labels, registry=registry, **extra)
        return cast(M, made)

    def family(self, value: float | None = None) -> CounterMetricFamily | GaugeMetricFamily:
        """The family a custom collector yields at scrape time: with `value` for an unlabelled
        metric, empty (samples added by the caller) for a labelled one."""
        labels = self.labels or None
        if self.kind == "counter":
            return CounterMetricFamily(self.name, self.help, value=value, labels=labels)
        if self.kind == "gauge":
            return GaugeMetricFamily(self.name, self.help, value=value, labels=labels)
        raise ValueError(f"{self.name}: a {self.kind} has no scrape-time family here")

    def histogram_family(self) -> HistogramMetricFamily:
        """A histogram's empty family for a custom collector (samples added by the caller)."""
        if self.kind != "histogram":
            raise ValueError(f"{self.name} is a {self.kind}, not a histogram")
        return HistogramMetricFamily(self.name, self.help, labels=self.labels or None)

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Declared[M]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> M: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> Declared[M] | M:
        # Only reached on the class, or on an instance whose __init__ did not build it: a
        # built metric lives in the instance's __dict__, which wins over this (non-data)
        # descriptor.
        if obj is None:
            return self
        raise AttributeError(f"{self.name} is declared but not built: call Metrics.__init__")


def counter(name: str, help: str, labels: tuple[str, ...] = ()) -> Declared[Counter]:
    return Declared("counter", name, help, labels)


def gauge(name: str, help: str, labels: tuple[str, ...] = ()) -> Declared[Gauge]:
    return Declared("gauge", name, help, labels)


def histogram(
    name: str, help: str, labels: tuple[str, ...] = (), *, buckets: tuple[float, ...]
) -> Declared[Histogram]:
    return Declared("histogram", name, help, labels, buckets)


class Metrics:
    """Builds every metric its class (and its bases) declares into `registry`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        for attribute, declared in self.declared().items():
            setattr(self, attribute, declared.build(registry))

    @classmethod
    def declared(cls) -> dict[str, Declared[Any]]:
        """Attribute name -> declaration, bases first."""
        return {
            attribute: value
            for klass in reversed(cls.__mro__)
            for attribute, value in vars(klass).items()
            if isinstance(value, Declared)
        }


class Table:
    """Declarations built one by one into a registry shared by a whole process (module-level
    names over prometheus_client's default registry), and remembered for checks."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.declared: list[Declared[Any]] = []

    def build(self, declared: Declared[M]) -> M:
        self.declared.append(declared)
        return declared.build(self.registry)


def naming_problems(declared: Declared[Any], prefix: str) -> list[str]:
    """What breaks Prometheus's naming rules (and the house prefix) in one declaration; empty
    when it keeps them."""
    name, problems = declared.name, []
    if not _SNAKE.fullmatch(name):
        problems.append("not snake_case")
    if not name.startswith(prefix):
        problems.append(f"lacks the prefix {prefix}")
    if (declared.kind == "counter") != name.endswith("_total"):
        problems.append("_total is for counters, and every counter's name ends in it")
    if name.endswith(_SAMPLE_SUFFIXES):
        problems.append("ends like a derived sample (_count, _sum, _bucket, _created)")
    if _NON_BASE_UNITS & set(name.split("_")):
        problems.append("a unit other than the base ones (_seconds, _bytes)")
    for label in declared.labels:
        if not _SNAKE.fullmatch(label) or label in ("le", "quantile"):
            problems.append(f"label {label!r}: not snake_case, or reserved")
    if (declared.kind == "histogram") != bool(declared.buckets):
        problems.append("buckets are for histograms, and every histogram has them")
    if list(declared.buckets) != sorted(set(declared.buckets)):
        problems.append("buckets not strictly increasing")
    if not declared.help.endswith("."):
        problems.append("help is not a sentence ending in a full stop")
    return problems

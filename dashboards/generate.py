"""Generates the embedfleet Grafana dashboards from code (grafana-foundation-sdk).

    .venv/bin/python dashboards/generate.py           # rewrite the checked-in JSON
    .venv/bin/python dashboards/generate.py --check   # exit 1 if the JSON is stale

The JSON lands twice: dashboards/*.json (what users import by hand) and
charts/embedfleet/dashboards/*.json (what the chart ships as ConfigMaps; Helm can only read files
inside the chart). Every panel query is run against a real Prometheus by
tests/observability/test_prometheus_loop.py (a local fleet) and test_prometheus_real_node.py
(pods on the real node), so a renamed metric fails there by panel name.

Queries use two template variables, `$namespace` (a regex, `.*` for all) and Grafana's
`$__rate_interval`; a Prometheus without Grafana needs both substituted (see `substitute`).
`$namespace` is the EmbeddingDeployment's namespace: workers and gateways run there, and the
operator labels its replica gauges with it. The operator's reconcile series are not filtered:
they carry the operator's own namespace.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh, VariableSort

REPO_ROOT = Path(__file__).resolve().parents[1]
OUTPUT_DIRS = (REPO_ROOT / "dashboards", REPO_ROOT / "charts" / "embedfleet" / "dashboards")

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
NS = 'namespace=~"$namespace"'
RATE = "$__rate_interval"
QUANTILES = (0.5, 0.95, 0.99)


@dataclass(frozen=True)
class Query:
    """One PromQL target of a panel, with the legend Grafana draws for it."""

    expr: str
    legend: str


def substitute(expr: str, rate_interval: str = "1m", namespace: str = ".*") -> str:
    """The query as Grafana would send it with the given variable values."""
    return expr.replace("$__rate_interval", rate_interval).replace("$namespace", namespace)


def _selector(matchers: str, namespaced: bool) -> str:
    parts = [NS] if namespaced else []
    if matchers:
        parts.append(matchers)
    return "{" + ",".join(parts) + "}" if parts else ""


def rate(metric: str, by: str = "", matchers: str = "", namespaced: bool = True) -> str:
    """`namespaced=False` for the operator's own series: they carry the operator's namespace."""
    selector = _selector(matchers, namespaced)
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({metric}{selector}[{RATE}]))"


def quantile(q: float, histogram: str, by: str = "", namespaced: bool = True) -> str:
    """The q-quantile of a `_bucket` histogram summed over the fleet (optionally per `by`)."""
    group = f"le, {by}" if by else "le"
    selector = _selector("", namespaced)
    return f"histogram_quantile({q}, sum by ({group}) (rate({histogram}_bucket{selector}[{RATE}])))"


def quantiles(histogram: str, namespaced: bool = True) -> list[Query]:
    return [
        Query(quantile(q, histogram, namespaced=namespaced), f"p{round(q * 100)}")
        for q in QUANTILES
    ]


def gauge(metric: str, by: str = "", agg: str = "sum") -> str:
    grouping = f" by ({by})" if by else ""
    return f"{agg}{grouping} ({metric}{{{NS}}})"


def _targets(queries: Sequence[Query]) -> list[prometheus.Dataquery]:
    # refIds A, B, ... keep the JSON stable and let Grafana name the series.
    return [
        prometheus.Dataquery().expr(q.expr).legend_format(q.legend).ref_id(chr(ord("A") + i))
        for i, q in enumerate(queries)
    ]


def series(
    title: str, unit: str, queries: Sequence[Query], description: str, width: int = 12
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(8)
        .fill_opacity(10)
    )
    for target in _targets(queries):
        panel = panel.with_target(target)
    return panel


def single(title: str, unit: str, query: Query, description: str) -> stat.Panel:
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(6)
        .height(4)
    )
    return panel.with_target(_targets([query])[0])


def _variables(board: dashboard.Dashboard) -> dashboard.Dashboard:
    namespace = (
        dashboard.QueryVariable("namespace")
        .label("Namespace")
        .datasource(DATASOURCE)
        .query("label_values(embedfleet_worker_tokens_total, namespace)")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .include_all(True)
        # Regex for "all": also matches series without the label (a Prometheus outside k8s).
        .all_value(".*")
        .multi(True)
    )
    datasource = dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
    return board.with_variable(datasource).with_variable(namespace)


def _board(uid: str, title: str, description: str) -> dashboard.Dashboard:
    board = (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["embedfleet"])
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
    )
    return _variables(board)


# Panel families: one function per row, each returning its panels in display order.


def replicas() -> timeseries.Panel:
    """On the fleet and the operator dashboards alike."""
    return series(
        "Desired vs ready replicas",
        "short",
        [
            Query(
                gauge("embedfleet_operator_desired_replicas", by="namespace, deployment"),
                "{{namespace}}/{{deployment}} desired",
            ),
            Query(
                gauge("embedfleet_operator_ready_replicas", by="namespace, deployment"),
                "{{namespace}}/{{deployment}} ready",
            ),
        ],
        "Worker replicas the operator wants and those ready, per EmbeddingDeployment.",
    )


def fleet_traffic() -> list[timeseries.Panel | stat.Panel]:
    return [
        single(
            "Requests/s",
            "reqps",
            Query(rate("embedfleet_gateway_requests_total"), "requests/s"),
            "All gateway requests per second, every route and status code.",
        ),
        single(
            "Tokens/s",
            "short",
            Query(rate("embedfleet_worker_tokens_total"), "tokens/s"),
            "Tokens embedded per second by all workers: the unit of capacity.",
        ),
        single(
            "Ready workers",
            "short",
            Query(gauge("embedfleet_worker_ready"), "ready"),
            "Workers reporting ready (model loaded, warm-up done).",
        ),
        single(
            "p99 latency",
            "s",
            Query(quantile(0.99, "embedfleet_gateway_request_seconds"), "p99"),
            "End-to-end p99 of gateway requests (HTTP in to response out).",
        ),
        series(
            "Requests by route",
            "reqps",
            [Query(rate("embedfleet_gateway_requests_total", by="route"), "{{route}}")],
            "Gateway requests per second, by API route.",
        ),
        series(
            "Tokens/s: gateway input vs worker processed",
            "short",
            [
                Query(rate("embedfleet_gateway_input_tokens_total"), "gateway input"),
                Query(rate("embedfleet_worker_tokens_total"), "worker processed"),
            ],
            "Input tokens accepted by gateways and tokens processed by workers.",
        ),
        series(
            "End-to-end latency",
            "s",
            quantiles("embedfleet_gateway_request_seconds"),
            "Gateway request duration quantiles, all routes.",
        ),
        series(
            "Latency p99 by stage",
            "s",
            [
                Query(quantile(0.99, "embedfleet_gateway_tokenize_seconds"), "tokenize"),
                Query(quantile(0.99, "embedfleet_gateway_upstream_seconds"), "gateway→worker"),
                Query(quantile(0.99, "embedfleet_worker_queue_wait_seconds"), "worker queue"),
                Query(quantile(0.99, "embedfleet_worker_compute_seconds"), "worker compute"),
                Query(quantile(0.99, "embedfleet_worker_request_seconds"), "worker total"),
            ],
            "Where time goes: p99 of each stage of the request path.",
        ),
        series(
            "Errors by code",
            "reqps",
            [
                Query(
                    rate("embedfleet_gateway_requests_total", by="code", matchers='code=~"[45].."'),
                    "HTTP {{code}}",
                )
            ],
            "Gateway responses with 4xx/5xx codes per second.",
        ),
        series(
            "Worker RPCs by code",
            "reqps",
            [Query(rate("embedfleet_worker_requests_total", by="rpc, code"), "{{rpc}} {{code}}")],
            "gRPC calls served by workers, by method and status code.",
        ),
    ]


def fleet_scaling() -> list[timeseries.Panel | stat.Panel]:
    return [
        replicas(),
        series(
            "Scale events",
            "short",
            [
                Query(
                    "sum by (namespace, deployment) "
                    f"(changes(embedfleet_operator_desired_replicas{{{NS}}}[{RATE}]))",
                    "{{namespace}}/{{deployment}}",
                )
            ],
            "Changes of the desired replica count: each step is one scale decision.",
        ),
    ]


def worker_panels() -> list[timeseries.Panel | stat.Panel]:
    return [
        series(
            "Tokens per batch",
            "short",
            quantiles("embedfleet_worker_batch_tokens"),
            "Tokens packed into each forward pass (bounded by maxBatchTokens).",
        ),
        series(
            "Sequences per batch",
            "short",
            quantiles("embedfleet_worker_batch_sequences"),
            "Sequences packed into each forward pass.",
        ),
        series(
            "Queue wait",
            "s",
            quantiles("embedfleet_worker_queue_wait_seconds"),
            "Time a request waits in the worker's FCFS queue before its batch starts.",
        ),
        series(
            "Compute time",
            "s",
            quantiles("embedfleet_worker_compute_seconds"),
            "Forward-pass time per batch, including the copy back to the host.",
        ),
        series(
            "CUDA graph replays vs eager runs",
            "ops",
            [
                Query(rate("embedfleet_worker_graph_replays_total"), "graph replays"),
                Query(rate("embedfleet_worker_eager_runs_total"), "eager runs"),
                Query(rate("embedfleet_worker_graph_captures_total"), "graph captures"),
            ],
            "Batches served by a captured graph vs run eagerly (CPU workers only run eager).",
        ),
        series(
            "Measured capacity",
            "short",
            [
                Query(
                    gauge("embedfleet_worker_capacity_tokens_per_second", by="instance"),
                    "{{instance}} at warm-up",
                ),
                Query(
                    gauge("embedfleet_worker_saturated_tokens_per_second", by="instance"),
                    "{{instance}} saturated on traffic",
                ),
            ],
            "Tokens/s each worker sustains, as it measured itself: at warm-up (at its latency "
            "target) and over its latest back-to-back batches of real traffic (0 until it has "
            "been saturated; on a shared machine it shows the worker's current share).",
        ),
        series(
            "In-flight and queued",
            "short",
            [
                Query(gauge("embedfleet_worker_inflight_requests"), "in-flight requests"),
                Query(gauge("embedfleet_worker_queued_tokens"), "queued tokens"),
            ],
            "Work accepted by workers and not finished yet.",
        ),
        series(
            "GPU memory",
            "bytes",
            [
                Query(
                    gauge("embedfleet_worker_gpu_memory_bytes", by="instance, kind"),
                    "{{instance}} {{kind}}",
                ),
                Query(
                    gauge("embedfleet_worker_gpu_memory_total_bytes", by="instance"),
                    "{{instance}} total",
                ),
            ],
            "Device memory per CUDA worker: allocated by tensors, reserved by torch's caching "
            "allocator (what other processes cannot use), and the device's total. CPU workers "
            "export no series, so a CPU-only fleet shows none.",
        ),
    ]


def gateway_panels() -> list[timeseries.Panel | stat.Panel]:
    return [
        series(
            "Tokenize time",
            "s",
            quantiles("embedfleet_gateway_tokenize_seconds"),
            "Time to tokenize one request's inputs (off the event loop).",
        ),
        series(
            "Upstream time",
            "s",
            quantiles("embedfleet_gateway_upstream_seconds"),
            "Time from sending a chunk to a worker to its reply.",
        ),
        series(
            "Chunks per request",
            "short",
            quantiles("embedfleet_gateway_chunks_per_request"),
            "Token-budget chunks one request is split into.",
        ),
        series(
            "Retries",
            "ops",
            [Query(rate("embedfleet_gateway_retries_total"), "retries/s")],
            "Chunks re-sent to another worker after a failure.",
        ),
        series(
            "In-flight requests",
            "short",
            [Query(gauge("embedfleet_gateway_inflight_requests", by="instance"), "{{instance}}")],
            "Requests each gateway is serving now.",
        ),
        series(
            "Input tokens/s",
            "short",
            [Query(rate("embedfleet_gateway_input_tokens_total"), "tokens/s")],
            "Tokens accepted by gateways per second.",
        ),
    ]


def operator_panels() -> list[timeseries.Panel | stat.Panel]:
    return [
        series(
            "Reconciles by result",
            "ops",
            [
                Query(
                    rate("embedfleet_operator_reconciles_total", by="result", namespaced=False),
                    "{{result}}",
                )
            ],
            "Reconcile passes per second, by outcome.",
        ),
        series(
            "Reconcile errors",
            "ops",
            [
                Query(
                    rate("embedfleet_operator_reconcile_errors_total", namespaced=False),
                    "errors/s",
                )
            ],
            "Reconciles that raised an error (retried with backoff).",
        ),
        series(
            "Reconcile duration",
            "s",
            quantiles("embedfleet_operator_reconcile_seconds", namespaced=False),
            "Time one reconcile pass takes.",
        ),
        replicas(),
    ]


Rows = Sequence[tuple[str, Callable[[], list[timeseries.Panel | stat.Panel]]]]


def build(uid: str, title: str, description: str, rows: Rows) -> dashboard.Dashboard:
    board = _board(uid, title, description)
    panel_id = 1
    for row_title, family in rows:
        board = board.with_row(dashboard.Row(row_title).id(panel_id))
        panel_id += 1
        for panel in family():
            board = board.with_panel(panel.id(panel_id))
            panel_id += 1
    return board


def dashboards() -> dict[str, dashboard.Dashboard]:
    """File name -> dashboard."""
    return {
        "embedfleet-fleet.json": build(
            "embedfleet-fleet",
            "embedfleet / Fleet overview",
            "Traffic, latency by stage, errors and scaling across all EmbeddingDeployments.",
            [("Traffic and latency", fleet_traffic), ("Scaling", fleet_scaling)],
        ),
        "embedfleet-worker.json": build(
            "embedfleet-worker",
            "embedfleet / Worker internals",
            "Batching, queueing, compute, CUDA graphs, capacity and GPU memory of workers.",
            [("Worker", worker_panels)],
        ),
        "embedfleet-gateway.json": build(
            "embedfleet-gateway",
            "embedfleet / Gateway",
            "Tokenization, chunking, retries and concurrency of gateways.",
            [("Gateway", gateway_panels)],
        ),
        "embedfleet-operator.json": build(
            "embedfleet-operator",
            "embedfleet / Operator",
            "Reconcile loop health of the embedfleet operator.",
            [("Operator", operator_panels)],
        ),
    }


def render(board: dashboard.Dashboard) -> str:
    return json.dumps(board.build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def rendered() -> dict[str, str]:
    return {name: render(board) for name, board in dashboards().items()}


def stale_files(files: dict[str, str]) -> list[Path]:
    """Checked-in files that differ from `files`, plus generated-looking strays nobody makes."""
    stale = []
    for directory in OUTPUT_DIRS:
        for name, text in files.items():
            path = directory / name
            if not path.is_file() or path.read_text() != text:
                stale.append(path)
        stale.extend(p for p in directory.glob("embedfleet-*.json") if p.name not in files)
    return sorted(stale)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the JSON is stale")
    args = parser.parse_args(argv)
    files = rendered()
    if args.check:
        stale = stale_files(files)
        for path in stale:
            print(f"stale: {path.relative_to(REPO_ROOT)}", file=sys.stderr)
        if stale:
            print("run: .venv/bin/python dashboards/generate.py", file=sys.stderr)
        return 1 if stale else 0
    for directory in OUTPUT_DIRS:
        directory.mkdir(parents=True, exist_ok=True)
        for stray in directory.glob("embedfleet-*.json"):
            if stray.name not in files:
                stray.unlink()
        for name, text in files.items():
            (directory / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

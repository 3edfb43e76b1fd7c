"""Helpers of the observability tests: a real Prometheus (Debian's `prometheus` package) started on
127.0.0.1 with a generated config, and load on a local fleet for it to scrape.

hack/install-prometheus.sh installs it; without the binary the fixtures fail with that hint
rather than skipping, since the dashboards would then go untested.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from embedfleet.common.net import free_ports
from embedfleet.fleet.supervisor import Fleet
from embedfleet.testing.polling import WaitTimeoutError, wait_for
from embedfleet.testing.process import ProcessRecord, log_tail, spawn, stop

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_HINT = "install it with hack/install-prometheus.sh (Debian package `prometheus`)"


def binary(name: str) -> str:
    found = shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} not found on PATH; {INSTALL_HINT}")
    return found


def scrape_config(
    jobs: Mapping[str, Sequence[str]],
    rule_files: Sequence[Path],
    interval: str = "1s",
    discovered: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """Prometheus config scraping each job's host:port targets every `interval`, plus the
    `discovered` scrape configs (embedfleet.testing.promconfig renders them from monitors)."""
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            *(
                {"job_name": job, "static_configs": [{"targets": list(targets)}]}
                for job, targets in jobs.items()
            ),
            *(dict(job) for job in discovered),
        ],
    }


class QueryError(RuntimeError):
    """Prometheus rejected a query (a PromQL syntax or evaluation error)."""


@dataclass
class Prometheus:
    workdir: Path
    jobs: Mapping[str, Sequence[str]]
    rule_files: Sequence[Path] = ()
    discovered: Sequence[Mapping[str, Any]] = ()
    interval: str = "1s"
    port: int = 0
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    record: ProcessRecord | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> Prometheus:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        doc = scrape_config(self.jobs, self.rule_files, self.interval, self.discovered)
        config.write_text(yaml.safe_dump(doc))
        self.port = self.port or free_ports(1)[0]
        self.process, self.record = spawn(
            "prometheus",
            [
                binary("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
            ],
            self.workdir / "prometheus.log",
        )
        process = self.process

        def ready() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as reply:
                    return bool(reply.status == 200)
            except OSError:
                return False

        try:
            wait_for("prometheus to be ready", ready, timeout=timeout, interval=0.2)
        except WaitTimeoutError as exc:
            raise RuntimeError(
                f"prometheus not ready in {timeout:.0f}s: {self.log_tail()}"
            ) from exc
        return self

    def log_tail(self) -> str:
        return log_tail(self.workdir / "prometheus.log")

    def stop(self) -> None:
        if self.process is not None and self.record is not None:
            stop([self.record], [self.process], grace_seconds=15)

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=30) as reply:
                doc = json.load(reply)
        except urllib.error.HTTPError as exc:
            doc = json.load(exc)
        if doc.get("status") != "success":
            raise QueryError(f"{doc.get('errorType')}: {doc.get('error')}")
        return doc["data"]

    def query_range(self, expr: str, seconds: float, step: str = "1s") -> list[dict[str, Any]]:
        end = time.time()
        result: list[dict[str, Any]] = self.api(
            "query_range", query=expr, start=str(end - seconds), end=str(end), step=step
        )["result"]
        return result

    def targets_up(self) -> dict[str, bool]:
        """scrapeUrl -> up, for every active target."""
        active = self.api("targets")["activeTargets"]
        return {t["scrapeUrl"]: t["health"] == "up" for t in active}

    def alerts(self, state: str = "firing") -> list[dict[str, str]]:
        """The labels of every alert in `state` (pending or firing)."""
        return [a["labels"] for a in self.api("alerts")["alerts"] if a["state"] == state]


def finite_points(series: Sequence[Mapping[str, Any]]) -> int:
    """Samples in a range-query result that are numbers (not NaN or infinite)."""
    return sum(1 for s in series for _, v in s["values"] if math.isfinite(float(v)))


RULES = REPO_ROOT / "charts" / "embedfleet" / "alerts" / "embedfleet.rules.yaml"
DASHBOARDS = sorted((REPO_ROOT / "dashboards").glob("embedfleet-*.json"))
RATE_INTERVAL = "10s"
CPU_GAPS: dict[str, str] = {
    "embedfleet-worker.json/GPU memory": "CPU workers export no embedfleet_worker_gpu_memory_bytes "
    "or _total_bytes (absent by design; a CUDA worker's are checked by "
    "tests/worker/server/test_gpu_memory.py, marked gpu)",
}
"""Panels that cannot have data where every worker runs on CPU, with the reason. A test asserts
that they return NO data there, so an entry cannot outlive its reason."""


def alert_names() -> set[str]:
    """Every alert of the chart's rule file."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule}


def panel_queries() -> Iterator[tuple[str, str, str]]:
    """(dashboard/panel title, legend, expr) for every target of every panel."""
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                yield f"{path.name}/{panel['title']}", target["legendFormat"], target["expr"]


def substitute(expr: str, rate_interval: str = RATE_INTERVAL) -> str:
    return expr.replace("$__rate_interval", rate_interval).replace("$namespace", ".*")


def panel_points(
    prom: Prometheus, window: float, rate_interval: str = RATE_INTERVAL
) -> dict[str, int | str]:
    """'panel [legend]' -> finite points over the last `window` seconds, or the query's error."""
    found: dict[str, int | str] = {}
    for where, legend, expr in panel_queries():
        try:
            series = prom.query_range(substitute(expr, rate_interval), window)
        except QueryError as err:
            found[f"{where} [{legend}]"] = f"query error {err}: {expr}"
            continue
        found[f"{where} [{legend}]"] = finite_points(series)
    return found


def missing_data(
    prom: Prometheus, window: float, gaps: Mapping[str, str], rate_interval: str = RATE_INTERVAL
) -> dict[str, str]:
    """'panel [legend]' -> why it has no data, for every query outside `gaps` that returns none,
    and for every query in `gaps` that returns some (its entry is stale)."""
    failures = {}
    for key, points in panel_points(prom, window, rate_interval).items():
        panel = key.rsplit(" [", 1)[0]
        if isinstance(points, str):
            failures[key] = points
        elif panel in gaps and points:
            failures[key] = f"has data now, so its gap entry is stale ({gaps[panel]})"
        elif panel not in gaps and not points:
            failures[key] = "no data"
    return failures


WORDS = ("embedding", "fleets", "batch", "tokens", "by", "budget", "and", "reply", "in", "order")


def worker_metrics_targets(fleet: Fleet) -> list[str]:
    """host:port of each worker's /metrics (the port `Fleet` picked for --metrics-port)."""
    targets = []
    for child in fleet.worker_children:
        port = child.argv[child.argv.index("--metrics-port") + 1]
        targets.append(f"127.0.0.1:{port}")
    return targets


@dataclass
class Load:
    """Clients posting a mix of requests until stopped; counts answers by status code and
    honours Retry-After."""

    url: str
    clients: int = 2
    mix: Callable[[int], list[object]] | None = None
    """The bodies client `n` posts in turn; None: `requests` (valid, split, base64, invalid)."""
    timeout: float = 60.0
    """A request unanswered this long is abandoned (counted as 0) and the client goes on."""
    pause: float = 0.0
    """Seconds a client waits after each answer. 0: back to back, which keeps the fleet at its
    capacity, where queueing sets the tail latency; a pause offers a load well below it."""
    backoff: float | None = None
    """Seconds a client waits after a 429 instead of its Retry-After. None: as told, as a
    well-behaved client does; a flood's clients come back sooner."""
    codes: Counter[int] = field(default_factory=Counter)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def requests(self, n: int) -> list[object]:
        sentence = " ".join(WORDS[(n + i) % len(WORDS)] for i in range(24))
        return [
            {"input": f"query number {n}"},
            # 24 inputs of ~30 tokens: over min_chunk_tokens (512), so the gateway splits it; no
            # more, as a CPU worker computes ~1,700 tokens/s on its one thread on the test node:
            # 64 inputs took 0.6 s, which put a healthy fleet's p99 at the 1 s latency alert.
            {"input": [f"{sentence} {i}" for i in range(24)]},
            {"input": [sentence] * 4, "encoding_format": "base64"},
            # Invalid on purpose: the errors-by-code panel needs 4xx answers to show.
            {"input": 5},
        ]

    def _run(self, seed: int) -> None:
        bodies = self.mix or self.requests
        with httpx.Client(base_url=self.url, timeout=self.timeout) as client:
            n = seed
            while not self._stop.is_set():
                for body in bodies(n):
                    try:
                        reply = client.post("/v1/embeddings", json=body)
                    except httpx.HTTPError:
                        self.codes[0] += 1
                        continue
                    self.codes[reply.status_code] += 1
                    # As a well-behaved client: back off as told (429, and 503 where it says so).
                    if reply.status_code == 429 and self.backoff is not None:
                        self._stop.wait(self.backoff)
                    elif retry_after := reply.headers.get("retry-after"):
                        self._stop.wait(float(retry_after))
                    elif self.pause:
                        self._stop.wait(self.pause)
                n += self.clients

    def start(self) -> Load:
        for i in range(self.clients):
            thread = threading.Thread(target=self._run, args=(i,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timeout + 5)


def start_prometheus(workdir: Path, jobs: dict[str, list[str]]) -> Prometheus:
    return Prometheus(workdir=workdir, jobs=jobs, rule_files=[RULES]).start()
